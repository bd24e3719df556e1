"""What an inference request may ask for before it reaches Triton: the checks of the validating gate (serve/gate.py).

Why: tritonserver 2.51 dies on requests that are legal KServe v2 (tracker issue 61) — asking the classification
extension for a BYTES output divides by its element size, 0 (SIGFPE, over HTTP and gRPC); an HTTP `"data"` array
nested ~40 000 deep overflows its JSON reader's stack; and N request parameters cost it O(N²) (100k: 47 s of
one core, blocking its HTTP thread). None of these has a tritonserver flag. Our models need none of it, so a
request asking for more than they can use is refused here with one line, and Triton never sees it.

The limits, each above every legal request of the served models:
- **output and input parameters**: outputs may carry only `binary_data` (HTTP's binary answer), inputs only
  `binary_data_size`; `classification` (the crash) and `shared_memory_*` (no region can be registered without
  the admin key, and the gate is the public path) are refused;
- **nesting** of the request JSON ≤ `max_depth` (16): a request is object → `inputs` → input → `data` plus one
  level per tensor dimension; our tensors have at most 5 dimensions, so the deepest legal request has 8 levels
  (Triton itself survived 20 000);
- **request parameters** ≤ `max_parameters` (32): the models read 15 (13 search settings, num_hypotheses,
  return_scores), Triton reserves 6 more (sequence_id/start/end, priority, timeout, binary_data_output);
- **inputs / outputs** ≤ the most any served model declares (at least 4): a request cannot name more tensors
  than its model has without being refused anyway;
- duplicate JSON keys are refused (they would hide extra parameters from the count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

INPUT_PARAMETERS = frozenset({"binary_data_size"})
OUTPUT_PARAMETERS = frozenset({"binary_data"})
# Triton 2.51 advertises these in GET /v2 (and gRPC ServerMetadata) but the public endpoints do not serve them:
# classification crashes it, no served model is a sequence model, shared memory is refused by the gate.
NOT_SERVED_EXTENSIONS = frozenset({"classification", "sequence", "system_shared_memory", "cuda_shared_memory"})
NAME_SHOWN = 40  # characters of a client-chosen name quoted in an error (a 1 MB name is not echoed)


class RequestRefused(ValueError):
    """A request over the gate's limits; the message is one line naming the limit and the fix."""


@dataclass(frozen=True)
class RequestLimits:
    """The gate's limits (module docstring: why each fits every legal request of our models)."""

    max_inputs: int = 4
    max_outputs: int = 4
    max_parameters: int = 32
    max_depth: int = 16

    def to_json(self) -> dict[str, int]:
        return {
            "max_inputs": self.max_inputs,
            "max_outputs": self.max_outputs,
            "max_parameters": self.max_parameters,
            "max_depth": self.max_depth,
        }


def _shown(name: object) -> str:
    text = str(name)
    return repr(text if len(text) <= NAME_SHOWN else text[:NAME_SHOWN] + "…")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RequestRefused(f"the request JSON repeats the key {_shown(key)}; send each key once")
            seen.add(key)
    return out


def _depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests deeper than `limit` (iterative: the value was parsed, so it is finite)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_http_request(body: bytes, header_length: str | None, limits: RequestLimits) -> dict[str, Any]:
    """The JSON part of an HTTP infer body (all of it, or the first `Inference-Header-Content-Length` bytes when
    binary tensors follow), parsed; RequestRefused when it is not JSON, nests too deep or repeats a key."""
    head = body
    if header_length is not None:
        if not header_length.isascii() or not header_length.isdigit() or not 0 < int(header_length) <= len(body):
            raise RequestRefused(
                f"Inference-Header-Content-Length {_shown(header_length)} is not a length within the body "
                f"of {len(body)} bytes; send the JSON header's length in bytes"
            )
        head = body[: int(header_length)]
    too_deep = f"the request JSON nests deeper than {limits.max_depth} levels; send tensor data flat or by its shape"
    try:
        request = json.loads(head.decode("utf-8", "surrogateescape"), object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise RequestRefused(too_deep) from None
    except RequestRefused:
        raise
    except ValueError as exc:  # JSONDecodeError, a number over Python's digit limit
        raise RequestRefused(f"failed to parse the request JSON: {str(exc)[:200]}") from None
    if _depth_over(request, limits.max_depth):
        raise RequestRefused(too_deep)
    if not isinstance(request, dict):
        raise RequestRefused("failed to parse the request JSON: it must be an object with 'inputs'")
    return request


def _members(value: Any, what: str, kind: type) -> Any:
    if not isinstance(value, kind):
        raise RequestRefused(f"{what} must be a JSON {'object' if kind is dict else 'array'}")
    return value


def check_http_request(request: dict[str, Any], limits: RequestLimits) -> None:
    """RequestRefused naming the first limit a parsed HTTP infer request exceeds."""
    parameters = _members(request.get("parameters", {}), "'parameters'", dict)
    _count("request parameters", len(parameters), limits.max_parameters)
    for kind, allowed, limit in (
        ("inputs", INPUT_PARAMETERS, limits.max_inputs),
        ("outputs", OUTPUT_PARAMETERS, limits.max_outputs),
    ):
        tensors = _members(request.get(kind, []), f"'{kind}'", list)
        _count(kind, len(tensors), limit)
        for tensor in tensors:
            tensor = _members(tensor, f"each of '{kind}'", dict)
            parameters = _members(tensor.get("parameters", {}), f"the parameters of {kind}", dict)
            _allowed(kind[:-1], tensor.get("name", "?"), parameters, allowed)


def check_grpc_request(request: Any, limits: RequestLimits) -> None:
    """The same limits for a gRPC ModelInferRequest (tritonclient.grpc.service_pb2)."""
    _count("request parameters", len(request.parameters), limits.max_parameters)
    _count("inputs", max(len(request.inputs), len(request.raw_input_contents)), limits.max_inputs)
    _count("outputs", len(request.outputs), limits.max_outputs)
    for inp in request.inputs:
        _allowed("input", inp.name, inp.parameters, INPUT_PARAMETERS)
    for out in request.outputs:
        _allowed("output", out.name, out.parameters, OUTPUT_PARAMETERS)


def _count(what: str, count: int, limit: int) -> None:
    if count > limit:
        raise RequestRefused(f"{count} {what} in one request; the served models take at most {limit}")


def _allowed(kind: str, name: object, parameters: Any, allowed: frozenset[str]) -> None:
    for key in parameters:
        if key not in allowed:
            raise RequestRefused(
                f"{kind} {_shown(name)} asks for parameter {_shown(key)}, which these models do not serve "
                f"(allowed: {', '.join(sorted(allowed))}); remove it"
            )


def served_extensions(extensions: list[str]) -> list[str]:
    """Triton's advertised extensions without those the public endpoints refuse (NOT_SERVED_EXTENSIONS)."""
    return [e for e in extensions if e not in NOT_SERVED_EXTENSIONS]


__all__ = [
    "NOT_SERVED_EXTENSIONS",
    "RequestLimits",
    "RequestRefused",
    "check_grpc_request",
    "check_http_request",
    "parse_http_request",
    "served_extensions",
]
