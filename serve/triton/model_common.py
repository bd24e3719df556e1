"""Request handling shared by the Python-backend models of both repository variants (copied next to them).

Why this file looks the way it does:
- It needs only numpy and the backend's utilities: the model object (export runtime or BLS) is built by the
  subclass in model.py, so both variants answer requests in exactly the same way.
- All requests of one `execute` call (what the dynamic batcher gathered) with the same search settings are
  generated together in one `translate` call — that is where batching pays off on CPU.
- Every failure is answered per request (`InferenceResponse(error=…)`): one bad request never fails the others
  of its batch, and no request goes unanswered.

Request: input `TEXT` (TYPE_STRING, [batch, 1], UTF-8). Optional request parameters: beam_size, len_penalty,
max_len_a, max_len_b, min_len (the export runtime's search settings; unset = the manifest's defaults); any
other parameter is refused with an error naming the allowed ones. Response: `OUTPUT` (TYPE_STRING, [batch, 1])
and `TRUNCATED` (TYPE_BOOL, [batch, 1]: the source was longer than the model's limit and was cut, as the
export runtime does). Defined results: an empty or whitespace-only source gives "" without running the model.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

INPUT = "TEXT"
OUTPUT = "OUTPUT"
TRUNCATED = "TRUNCATED"
# request parameter → (type, lowest allowed value); the search settings of export_runtime.Search
PARAMETERS: dict[str, tuple[type, float]] = {
    "beam_size": (int, 1), "len_penalty": (float, 0.0), "max_len_a": (float, 0.0), "max_len_b": (int, 0),
    "min_len": (int, 0),
}
# request-level parameters that Triton or its clients use themselves (not search settings): ignored here
RESERVED = frozenset({"binary_data_output", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                      "headers", "triton_enable_empty_final_response"})
MAX_BEAM = 64  # a guard against one request asking for a search that would starve every other request


class RequestError(ValueError):
    """A request this model answers with an error (bad text, bad parameter)."""


def _parameter(name: str, value: Any) -> int | float:
    kind, lowest = PARAMETERS[name]
    if isinstance(value, bool):
        raise RequestError(f"parameter {name!r} must be a number, got a boolean")
    try:
        number = kind(float(value)) if kind is float else int(str(value))
    except (TypeError, ValueError):
        raise RequestError(f"parameter {name!r} must be {kind.__name__}, got {value!r}") from None
    if number < lowest or (name == "beam_size" and number > MAX_BEAM):
        upper = f" and ≤ {MAX_BEAM}" if name == "beam_size" else ""
        raise RequestError(f"parameter {name!r} must be ≥ {lowest}{upper}, got {number}")
    return number


def parse_parameters(raw: str | None) -> dict[str, int | float]:
    """The request's JSON parameters → validated search overrides (unknown names are an error, so a typo such as
    `beam=1` is not silently ignored)."""
    given = {k: v for k, v in (json.loads(raw) if raw else {}).items() if k not in RESERVED}
    unknown = sorted(set(given) - set(PARAMETERS))
    if unknown:
        raise RequestError(f"unknown request parameter(s) {unknown}; allowed: {sorted(PARAMETERS)}")
    return {name: _parameter(name, value) for name, value in given.items()}


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
            raise RequestError(f"{INPUT} row {row} is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                               "send UTF-8 encoded text") from None
    return texts


class TextModel:
    """Text in, text out over any object with the export runtime's `translate`/`sp`/`max_positions`;
    subclasses say how that object is built (`load`)."""

    def load(self, directory: str, params: dict[str, str], args: dict[str, str]) -> Any:
        raise NotImplementedError

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        directory = os.path.join(args["model_repository"], args["model_version"])
        self.model = self.load(directory, params, args)
        self.limit = max(1, self.model.max_positions // 2)  # what export_runtime.encode_texts keeps
        self.logger = pb_utils.Logger

    def _parse(self, request: Any) -> tuple[list[str], dict[str, int | float]]:
        tensor = pb_utils.get_input_tensor_by_name(request, INPUT)
        if tensor is None:
            raise RequestError(f"input {INPUT} is missing")
        return decode_texts(tensor.as_numpy()), parse_parameters(request.parameters())

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        groups: dict[tuple[tuple[str, float], ...], list[tuple[int, list[str]]]] = {}
        for i, request in enumerate(requests):
            try:
                texts, search = self._parse(request)
            except (RequestError, ValueError) as exc:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
                continue
            groups.setdefault(tuple(sorted(search.items())), []).append((i, texts))
        for key, items in groups.items():
            try:
                outputs = self._generate([texts for _, texts in items], dict(key))
            except Exception as exc:  # the whole group failed: answer each of its requests with the reason
                for i, _ in items:
                    responses[i] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"generation failed: {type(exc).__name__}: {exc}"))
                continue
            for (i, _), (out, truncated) in zip(items, outputs, strict=True):
                responses[i] = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor(OUTPUT, np.array([s.encode("utf-8") for s in out], dtype=np.object_)
                                    .reshape(-1, 1)),
                    pb_utils.Tensor(TRUNCATED, np.array(truncated, dtype=bool).reshape(-1, 1)),
                ])
        return responses

    def _generate(self, batches: list[list[str]], search: dict[str, int | float]
                  ) -> list[tuple[list[str], list[bool]]]:
        """Several requests' texts → one `translate` call → outputs and truncation flags per request."""
        flat = [t for texts in batches for t in texts]
        live = [j for j, t in enumerate(flat) if t.strip()]
        results = [""] * len(flat)
        truncated = [False] * len(flat)
        if live:
            texts = [flat[j] for j in live]
            lengths = [len(ids) for ids in self.model.sp.encode(texts, out_type=int)]
            for j, out, n in zip(live, self.model.translate(texts, **search), lengths, strict=True):
                results[j], truncated[j] = out, n > self.limit
            cut = sum(n > self.limit for n in lengths)
            if cut:
                self.logger.log_warn(f"{cut} source(s) longer than {self.limit} tokens were truncated")
        out, start = [], 0
        for texts in batches:
            out.append((results[start:start + len(texts)], truncated[start:start + len(texts)]))
            start += len(texts)
        return out

    def finalize(self) -> None:
        self.model = None
