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
from model_outputs import OPTIONAL_OUTPUTS

from export import runtime as export_runtime
from export.runtime.search_loop import SearchVocab, check_prefixes

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
OUTPUT_SETTINGS = ("num_hypotheses", *OPTIONAL_OUTPUTS)  # what to return, beside the search settings
SCORING_SETTINGS = ("len_penalty",)  # what a scoring request (with TARGET) may set
# settings each row keeps for itself in a batch (its own length bounds): their values in the batching key
ROW_SETTINGS = {"min_len": 0, "max_len_a": 0.0, "max_len_b": 0}


class RequestError(ValueError):
    """A request this model answers with INVALID_ARGUMENT (bad text, bad parameter, over budget)."""


def parse_parameters(raw: str | None) -> dict[str, Any]:
    """The request's JSON parameters → validated search overrides plus the output settings as given (checked by
    `translation_settings`). Unknown names are an error, so a typo such as `beam=1` is not silently ignored;
    search values must be finite and within the runtime's SEARCH_LIMITS."""
    try:
        given = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise RequestError(f"request parameters are not valid JSON ({exc})") from None
    given = {k: v for k, v in given.items() if k not in RESERVED}
    allowed = {*export_runtime.SEARCH_LIMITS, *OUTPUT_SETTINGS}
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise RequestError(f"unknown request parameter(s) {unknown}; allowed: {sorted(allowed)}")
    try:
        search = {
            name: export_runtime.search_setting(name, value)
            for name, value in given.items()
            if name not in OUTPUT_SETTINGS
        }
    except export_runtime.SearchError as exc:
        raise RequestError(f"parameter {exc}") from None
    return {**search, **{k: given[k] for k in OUTPUT_SETTINGS if k in given}}


def client_of(raw: str | None) -> str:
    """The client the gate named in the request's parameters ("" when none: a request that did not pass the gate
    shares the unnamed client's turn)."""
    try:
        value = json.loads(raw).get(CLIENT_PARAMETER, "") if raw else ""
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) and len(value) <= 64 else ""


def parse_flag(name: str, value: Any) -> bool:
    """A boolean request parameter: JSON/KServe booleans, or the strings "true"/"false" some clients send."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise RequestError(f"parameter {name}={value!r} is not a boolean; allowed: true or false")


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


def translation_settings(model: Any, given: dict[str, Any]) -> tuple[Any, int, tuple[str, ...]]:
    """A translation request's (Search, hypotheses per source, optional outputs asked for) from its parsed
    parameters: the manifest's defaults with the request's settings (the runtime's cross-setting checks
    included), num_hypotheses within what this search returns (beam_size, or MAX_SAMPLES draws when sampling)."""
    try:
        search = model.search_settings(**{k: v for k, v in given.items() if k not in OUTPUT_SETTINGS})
        n = export_runtime.check_num_hypotheses(
            given.get("num_hypotheses", 1), search.most_hypotheses, bool(search.sampling)
        )
    except export_runtime.SearchError as exc:
        raise RequestError(f"parameter {exc}") from None
    wanted = tuple(name for name in OPTIONAL_OUTPUTS if parse_flag(name, given.get(name, False)))
    if "return_alignments" in wanted:
        try:
            model.check_alignments()  # an export without the decoder's alignment output says why in one line
        except export_runtime.SearchError as exc:
            raise RequestError(f"parameter return_alignments: {exc}") from None
    return search, n, wanted


def batch_key(search: Any, n: int, wanted: tuple[str, ...]) -> tuple[Any, ...]:
    """Requests with equal keys are generated in one runtime call: the same search but for the settings each row
    keeps for itself (its length bounds; its prefix and sampling key are per row too), the same number of
    hypotheses and the same outputs. A setting added to `Search` joins the key by itself."""
    return ("translate", dataclasses.replace(search, **ROW_SETTINGS), n, wanted)


def request_prefixes(
    model: Any, texts: list[str], encoded: Sequence[Sequence[int] | None], search: Any, max_chars: int
) -> list[list[int]]:
    """A request's PREFIX rows → target token ids per row ("" and rows whose source is empty, which are not run:
    none), tokenised as the runtime's `encode_prefixes` does; RequestError when the rows differ from TEXT's or a
    prefix leaves no room for eos within its source's output length limit (the runtime's `check_prefixes`)."""
    if len(texts) != len(encoded):
        raise RequestError(f"{PREFIX} has {len(texts)} rows but {INPUT} has {len(encoded)}; send one prefix per source")
    for row, text in enumerate(texts):  # longer than any output in characters: refused before tokenising
        if len(text) > max_chars:
            raise RequestError(
                f"{PREFIX} row {row} has {len(text)} characters, more than any output of this model holds "
                f"({model.max_positions - 1} tokens); send a shorter prefix"
            )
    ids = model.tokenizer.encode_targets(texts)
    prefixes = [list(p) if e is not None else [] for p, e in zip(ids, encoded, strict=True)]
    lengths = np.array([len(e) if e is not None else 1 for e in encoded], dtype=np.int64)
    limits = export_runtime.row_limits(lengths, search, model.max_positions)
    try:
        check_prefixes(prefixes, limits, SearchVocab(model.vocab_size, model.pad_id, model.bos_id, model.eos_id))
    except export_runtime.SearchError as exc:  # "target prefix i …": i is the request's row
        raise RequestError(f"{PREFIX}: {exc}") from None
    return prefixes
