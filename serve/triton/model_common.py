"""Request handling shared by the Python-backend models of both repository variants (copied next to them).

Why this file looks the way it does:
- It needs only numpy and the backend's utilities: the model object (export runtime or BLS) is built by the
  subclass in model.py, so both variants answer requests in exactly the same way.
- All requests of one `execute` call (what the dynamic batcher gathered) with the same search settings are
  generated together in one `translate` call — that is where batching pays off on CPU.
- Every failure is answered per request (`InferenceResponse(error=…)`): one bad request never fails the others
  of its batch, and no request goes unanswered.

Request: input `TEXT` (TYPE_STRING, [batch, 1], UTF-8). Optional request parameters: beam_size, len_penalty,
max_len_a, max_len_b, min_len (the export runtime's search settings, bounded by its SEARCH_LIMITS; unset = the
manifest's defaults); any other parameter is refused with an error naming the allowed ones. Response: `OUTPUT`
(TYPE_STRING, [batch, 1]) and `TRUNCATED` (TYPE_BOOL, [batch, 1]: the source was longer than the model's limit
and was cut, as the export runtime does). Defined results: an empty or whitespace-only source gives "" without
running the model.

Cost limits (one client must not starve the others): a request's cost is rows × beam × maximum output tokens
(each row's limit from max_len_a/max_len_b, capped by the model's positions), computed before anything runs.
Over `max_request_cost` it is refused (INVALID_ARGUMENT, naming the budget); within one `execute`, requests are
admitted cheapest first up to `max_execute_cost` and the rest answered UNAVAILABLE (retry), so a small request
batched with heavy ones is never held behind more than that budget. Sources are cut to what the model can use
in characters before tokenising (a 300 MB text costs no more than a long sentence) and tokenised once.
Client mistakes are answered INVALID_ARGUMENT (HTTP 400), never INTERNAL.
"""

from __future__ import annotations

import json
import os
from typing import Any

import export_runtime  # the verbatim copy of export/runtime.py beside this file
import numpy as np
import triton_python_backend_utils as pb_utils

INPUT = "TEXT"
OUTPUT = "OUTPUT"
TRUNCATED = "TRUNCATED"
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
    }
)
# Budgets in decoder row-steps (rows × beam × max output tokens). The defaults keep one request of the CPU
# preset's model (d_model 256, 3+3 layers) to a few seconds on one core: measured in serve/README.md.
DEFAULT_MAX_REQUEST_COST = 10_000
DEFAULT_MAX_EXECUTE_COST = 40_000
MAX_PIECE_CHARS = 16  # sentencepiece's default max_sentencepiece_length: a token covers at most this many chars


class RequestError(ValueError):
    """A request this model answers with INVALID_ARGUMENT (bad text, bad parameter, over budget)."""


class Busy(RuntimeError):
    """A valid request this `execute` has no budget left for: answered UNAVAILABLE, to be retried."""


def parse_parameters(raw: str | None) -> dict[str, int | float]:
    """The request's JSON parameters → validated search overrides (unknown names are an error, so a typo such as
    `beam=1` is not silently ignored; values must be finite and within the runtime's SEARCH_LIMITS)."""
    try:
        given = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise RequestError(f"request parameters are not valid JSON ({exc})") from None
    given = {k: v for k, v in given.items() if k not in RESERVED}
    unknown = sorted(set(given) - set(export_runtime.SEARCH_LIMITS))
    if unknown:
        raise RequestError(f"unknown request parameter(s) {unknown}; allowed: {sorted(export_runtime.SEARCH_LIMITS)}")
    try:
        return {name: export_runtime.search_setting(name, value) for name, value in given.items()}
    except export_runtime.SearchError as exc:
        raise RequestError(f"parameter {exc}") from None


def decode_texts(array: np.ndarray) -> list[str]:
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
                f"{INPUT} row {row} is not valid UTF-8 ({exc.reason} at byte {exc.start}); send UTF-8 encoded text"
            ) from None
    return texts


def _error(exc: Exception) -> Any:
    code = pb_utils.TritonError.UNAVAILABLE if isinstance(exc, Busy) else pb_utils.TritonError.INVALID_ARG
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), code))


class _Request:
    """One request, parsed and priced: its sources as token ids, truncation flags, search and cost."""

    def __init__(
        self, index: int, encoded: list[list[int] | None], truncated: list[bool], search: Any, cost: int
    ) -> None:
        self.index, self.encoded, self.truncated, self.search, self.cost = index, encoded, truncated, search, cost


class TextModel:
    """Text in, text out over any object with the export runtime's `search_settings`/`request_cost`/
    `translate_encoded`/`sp`/`max_positions`; subclasses say how that object is built (`load`)."""

    def load(self, directory: str, params: dict[str, str], args: dict[str, str]) -> Any:
        raise NotImplementedError

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        directory = os.path.join(args["model_repository"], args["model_version"])
        self.model = self.load(directory, params, args)
        self.limit = max(1, self.model.max_positions // 2)  # what export_runtime.encode_texts keeps
        # a source longer than this many characters has more than `limit` tokens whatever it says: cut it
        # before tokenising (the cut part would be truncated away anyway)
        self.max_chars = self.limit * MAX_PIECE_CHARS + MAX_PIECE_CHARS
        self.max_request_cost = int(params.get("max_request_cost", DEFAULT_MAX_REQUEST_COST))
        self.max_execute_cost = max(
            int(params.get("max_execute_cost", DEFAULT_MAX_EXECUTE_COST)), self.max_request_cost
        )
        self.logger = pb_utils.Logger

    def _price(self, index: int, request: Any) -> _Request:
        """Parse, tokenise once and price one request; RequestError for anything the client must fix."""
        tensor = pb_utils.get_input_tensor_by_name(request, INPUT)
        if tensor is None:
            raise RequestError(f"input {INPUT} is missing")
        texts = decode_texts(tensor.as_numpy())
        try:
            search = self.model.search_settings(**parse_parameters(request.parameters()))
        except export_runtime.SearchError as exc:
            raise RequestError(f"parameter {exc}") from None
        live = [j for j, t in enumerate(texts) if t.strip()]
        cut = [texts[j][: self.max_chars] for j in live]
        ids = self.model.sp.encode(cut, out_type=int) if cut else []
        encoded: list[list[int] | None] = [None] * len(texts)
        truncated = [False] * len(texts)
        for j, piece_ids, text in zip(live, ids, cut, strict=True):
            encoded[j] = piece_ids[: self.limit] or [self.model.unk_id]
            truncated[j] = len(piece_ids) > self.limit or len(texts[j]) > len(text)
        cost = self.model.request_cost([len(encoded[j]) for j in live], search)
        if cost > self.max_request_cost:
            raise RequestError(
                f"request cost {cost} (rows × beam_size × maximum output tokens) exceeds this model's budget "
                f"max_request_cost={self.max_request_cost}; send fewer rows per request, a smaller beam_size or "
                "smaller max_len_a/max_len_b"
            )
        return _Request(index, encoded, truncated, search, cost)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        priced: list[_Request] = []
        for i, request in enumerate(requests):
            try:
                priced.append(self._price(i, request))
            except (RequestError, ValueError) as exc:
                responses[i] = _error(exc)
        spent, admitted = 0, []
        for req in sorted(priced, key=lambda r: (r.cost, r.index)):  # cheapest first: small requests never wait
            if admitted and spent + req.cost > self.max_execute_cost:
                responses[req.index] = _error(
                    Busy(
                        f"the server's per-batch budget max_execute_cost={self.max_execute_cost} is taken by other "
                        "requests gathered with this one; retry"
                    )
                )
                continue
            spent += req.cost
            admitted.append(req)
        groups: dict[Any, list[_Request]] = {}
        for req in admitted:
            groups.setdefault(req.search, []).append(req)
        for search, items in groups.items():
            try:
                outputs = self._generate(items, search)
            except Exception as exc:  # the whole group failed: answer each of its requests with the reason
                for req in items:
                    responses[req.index] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"generation failed: {type(exc).__name__}: {exc}")
                    )
                continue
            for req, out in zip(items, outputs, strict=True):
                responses[req.index] = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(
                            OUTPUT, np.array([s.encode("utf-8") for s in out], dtype=np.object_).reshape(-1, 1)
                        ),
                        pb_utils.Tensor(TRUNCATED, np.array(req.truncated, dtype=bool).reshape(-1, 1)),
                    ]
                )
        return responses

    def _generate(self, items: list[_Request], search: Any) -> list[list[str]]:
        """Several requests' sources → one `translate_encoded` call → output strings per request."""
        flat = [(k, j, ids) for k, req in enumerate(items) for j, ids in enumerate(req.encoded) if ids is not None]
        results = [[""] * len(req.encoded) for req in items]
        if flat:
            for (k, j, _), out in zip(
                flat, self.model.translate_encoded([ids for _, _, ids in flat], search), strict=True
            ):
                results[k][j] = out
            cut = sum(t for req in items for t in req.truncated)
            if cut:
                self.logger.log_warn(f"{cut} source(s) longer than {self.limit} tokens were truncated")
        return results

    def finalize(self) -> None:
        self.model = None
