"""Reading a request of the text models: its parameters, its texts and its target prefix (copied next to model.py;
imported by model_common after it has put this model's `export` package first on sys.path).

Why here and strict: every client mistake must come back as one line naming the parameter or input and what
is allowed (INVALID_ARGUMENT / HTTP 400), before anything runs — the search settings' own checks are the
runtime's (`Search`: ranges and the settings that only go together, such as top_p with sampling=1), the
prefix's its `check_prefixes`. What a request may ask for also decides what it may be generated with:
`batch_key` holds every setting that changes the search, and none of those a row keeps for itself (lengths,
prefixes, sampling keys), so requests batch wherever their options allow.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from export import runtime as export_runtime
from export.runtime import generation

INPUT = "TEXT"
TARGET = "TARGET"  # scoring (forced decoding) instead of translating
PREFIX = "PREFIX"  # per source the target text its output starts with ("" = none)
CLIENT_PARAMETER = "zoo_client"  # the client the gate names (a digest of its address and key): lanes share by it
# request-level parameters that Triton or its clients use themselves (not search settings): ignored here
RESERVED = frozenset(
    {
        "binary_data_output",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "triton_enable_empty_final_response",
        CLIENT_PARAMETER,
    }
)
OPTIONS = tuple(f.name for f in dataclasses.fields(export_runtime.Search))  # what a translation may set
SCORING_SETTINGS = ("len_penalty",)  # what a scoring request (with TARGET) may set
# settings each row keeps for itself in a batch (its own length bounds): their values in the batching key
ROW_SETTINGS = {"min_len": 0, "max_len_a": 0.0, "max_len_b": 0}


class RequestError(ValueError):
    """A request this model answers with INVALID_ARGUMENT (bad text, bad parameter, over budget)."""


def parse_parameters(raw: str | None) -> dict[str, Any]:
    """The request's JSON parameters, as given, less those Triton and the gate use (RESERVED). Unknown names are an
    error, so a typo such as `beam=1` is not silently ignored; the values are checked where they make the
    request's `Search` (`translation_settings`), or by scoring (`len_penalty`)."""
    try:
        given = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise RequestError(f"request parameters are not valid JSON ({exc})") from None
    if not isinstance(given, dict):
        raise RequestError("request parameters are not a JSON object")
    given = {k: v for k, v in given.items() if k not in RESERVED}
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise RequestError(f"unknown request parameter(s) {unknown}; allowed: {sorted(OPTIONS)}")
    return given


def client_of(raw: str | None) -> str:
    """The client the gate named in the request's parameters ("" when none: a request that did not pass the gate
    shares the unnamed client's turn)."""
    try:
        value = json.loads(raw).get(CLIENT_PARAMETER, "") if raw else ""
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) and len(value) <= 64 else ""


def decode_texts(array: np.ndarray, name: str = INPUT) -> list[str]:
    """TYPE_STRING tensor [batch, 1] (bytes objects) → str per row; invalid UTF-8 is an error naming the row."""
    texts = []
    for row, item in enumerate(array.reshape(-1)):
        if isinstance(item, str):
            texts.append(item)
            continue
        try:
            texts.append(bytes(item).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise RequestError(
                f"{name} row {row} is not valid UTF-8 ({exc.reason} at byte {exc.start}); send UTF-8 encoded text"
            ) from None
    return texts


def translation_settings(model: Any, given: dict[str, Any]) -> Any:
    """A translation request's `Search`: the manifest's defaults with the request's options, each checked once
    there (ranges, the settings that only go together, num_hypotheses within what the search returns)."""
    try:
        return model.search_settings(**given)
    except export_runtime.SearchError as exc:
        raise RequestError(f"parameter {exc}") from None


def batch_key(search: Any) -> tuple[Any, ...]:
    """Requests with equal keys are generated in one runtime call: the same options but for the settings each row
    keeps for itself (its length bounds; its prefix and sampling key are per row too). A field added to `Search`
    joins the key by itself."""
    return ("translate", dataclasses.replace(search, **ROW_SETTINGS))


def request_work(
    model: Any, encoded: Sequence[Sequence[int] | None], search: Any, texts: list[str] | None, max_chars: int
) -> Any:
    """A request's sources checked for its search (the driver's `prepare`: length bounds, sampling keys — a row's
    index in its request — and the PREFIX rows, tokenised as targets; an empty source is not run and has none);
    RequestError when PREFIX's rows differ from TEXT's, a prefix is longer than any output, or the search cannot
    take it."""
    rows = [j for j, e in enumerate(encoded) if e is not None]
    prefixes = None
    if texts is not None:
        if len(texts) != len(encoded):
            raise RequestError(
                f"{PREFIX} has {len(texts)} rows but {INPUT} has {len(encoded)}; send one prefix per source"
            )
        for row, text in enumerate(texts):  # longer than any output in characters: refused before tokenising
            if len(text) > max_chars:
                raise RequestError(
                    f"{PREFIX} row {row} has {len(text)} characters, more than any output of this model holds "
                    f"({model.max_positions - 1} tokens); send a shorter prefix"
                )
        prefixes = model.tokenizer.encode_targets([texts[j] for j in rows]) if rows else []
    try:
        return generation.prepare(model, [encoded[j] for j in rows], search, prefixes, keys=rows)
    except export_runtime.SearchError as exc:  # "target prefix i …": i is the request's row
        raise RequestError(f"{PREFIX}: {exc}") from None
