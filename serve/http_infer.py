"""Reading a KServe v2 HTTP infer body into the gate's InferRequest, bounded before anything is built.

Why an event parser with budgets: Python's JSON reader builds every value of a body before anything can be
checked — a 4 MB body of small nested arrays cost the gate ≈ 2.6 CPU-seconds of its one event loop (issue 84).
ijson's C backend (yajl) hands over one event at a time; the reader stops at the first event over the depth or
event budget (both sized to the largest legal request of the model asked for), so a refused body costs a few
milliseconds whatever it holds. Binary tensors (`Inference-Header-Content-Length`) are read by their declared sizes.
"""

from __future__ import annotations

import io
from typing import Any

import ijson

from serve.infer_request import InferRequest, RequestBuilder, RequestRefused, bytes_elements, shown
from serve.served_models import ServedModel

MAX_DEPTH = 8  # object → inputs → input → data → row is 5 levels: every legal request fits with room to spare
READ_CHUNK = 64 << 10


def event_budget(model: ServedModel) -> int:
    """The most parser events a legal request to `model` needs: a few per parameter and output, three per row of
    each input (start, text, end), with a generous margin; more is refused before it is built."""
    return 256 + len(model.inputs) * (64 + 3 * model.max_batch_size) + 16 * len(model.outputs)


def _parse(head: bytes, budget: int) -> Any:
    """The JSON value of `head`, built from events: RequestRefused beyond MAX_DEPTH levels or `budget` events."""
    stack: list[Any] = []
    keys: list[str | None] = []
    root: Any = None
    events = 0

    def put(value: Any) -> None:
        nonlocal root
        if not stack:
            root = value
        elif isinstance(stack[-1], list):
            stack[-1].append(value)
        else:
            key = keys[-1]
            if key in stack[-1]:
                raise RequestRefused(f"the request JSON repeats the key {shown(key)}; send each key once")
            stack[-1][key] = value

    try:
        for event, value in ijson.basic_parse(io.BytesIO(head), use_float=True, buf_size=READ_CHUNK):
            events += 1
            if events > budget:
                raise RequestRefused(
                    f"the request JSON holds more values than any request to this model needs ({budget}); "
                    "send at most max_batch_size texts per input"
                )
            if event in ("start_map", "start_array"):
                if len(stack) == MAX_DEPTH:
                    raise RequestRefused(
                        f"the request JSON nests deeper than {MAX_DEPTH} levels; send tensor data flat or by its shape"
                    )
                container: Any = {} if event == "start_map" else []
                put(container)
                stack.append(container)
                keys.append(None)
            elif event in ("end_map", "end_array"):
                stack.pop()
                keys.pop()
            elif event == "map_key":
                keys[-1] = value
            else:
                put(value)
    except ijson.JSONError as exc:
        reason = " ".join(str(exc).split())[:160]
        raise RequestRefused(f"failed to parse the request JSON: {reason}") from None
    return root


def _members(value: Any, what: str, kind: type) -> Any:
    if not isinstance(value, kind):
        raise RequestRefused(f"{what} must be a JSON {'object' if kind is dict else 'array'}")
    return value


def _known_keys(value: dict, allowed: tuple[str, ...], what: str) -> None:
    for key in value:
        if key not in allowed:
            raise RequestRefused(f"{what} has the key {shown(key)}; allowed: {', '.join(allowed)}")


def _json_elements(data: Any, rows: int, name: str) -> list[bytes]:
    """`"data"` of a BYTES input: [t, …] or [[t], …] with one text per row."""
    data = _members(data, f"the data of input {shown(name)}", list)
    if len(data) != rows:
        raise RequestRefused(f"input {shown(name)} has {len(data)} rows of data for shape [{rows}, 1]; send one a row")
    out = []
    for item in data:
        if isinstance(item, list) and len(item) == 1:
            item = item[0]
        if not isinstance(item, str):
            raise RequestRefused(f'the data of input {shown(name)} must be texts (["…", …] or [["…"], …])')
        out.append(item.encode("utf-8", "surrogatepass"))
    return out


def read_http_infer(body: bytes, header_length: str | None, model: ServedModel, version: str = "") -> InferRequest:
    """The request an HTTP infer body asks `model` for; RequestRefused, one line, for anything the gate does not
    serve (unknown keys, parameters, tensors or datatypes, shapes over max_batch_size, nesting, size)."""
    head, binary = body, b""
    if header_length is not None:
        if not header_length.isascii() or not header_length.isdigit() or not 0 < int(header_length) <= len(body):
            raise RequestRefused(
                f"Inference-Header-Content-Length {shown(header_length)} is not a length within the body "
                f"of {len(body)} bytes; send the JSON header's length in bytes"
            )
        head, binary = body[: int(header_length)], body[int(header_length) :]
    request = _members(_parse(head, event_budget(model)), "the request JSON", dict)
    _known_keys(request, ("id", "parameters", "inputs", "outputs"), "the request")
    builder = RequestBuilder(model, version, http=True)
    if "id" in request:
        builder.set_id(request["id"])
    for name, value in _members(request.get("parameters", {}), "'parameters'", dict).items():
        builder.add_parameter(name, value)
    offset = 0
    for tensor in _members(request.get("inputs", []), "'inputs'", list):
        tensor = _members(tensor, "each of 'inputs'", dict)
        _known_keys(tensor, ("name", "datatype", "shape", "parameters", "data"), "an input")
        name = tensor.get("name")
        rows = builder.check_input(name, tensor.get("datatype"), tensor.get("shape"))
        parameters = _members(tensor.get("parameters", {}), f"the parameters of input {shown(name)}", dict)
        for key in parameters:
            if key != "binary_data_size":
                raise RequestRefused(
                    f"input {shown(name)} asks for parameter {shown(key)}, which these models do not serve "
                    "(allowed: binary_data_size); remove it"
                )
        if "binary_data_size" in parameters:
            size = parameters["binary_data_size"]
            if "data" in tensor or not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise RequestRefused(f"input {shown(name)}: binary_data_size must be a length and come without data")
            if offset + size > len(binary):
                raise RequestRefused(f"input {shown(name)}'s binary_data_size runs past the end of the body")
            elements = bytes_elements(memoryview(binary)[offset : offset + size], rows, name)
            offset += size
        else:
            elements = _json_elements(tensor.get("data"), rows, name)
        builder.add_input(name, rows, elements)
    if offset != len(binary):
        raise RequestRefused(
            f"the body has {len(binary) - offset} bytes after the inputs' binary data; send only what they declare"
        )
    for tensor in _members(request.get("outputs", []), "'outputs'", list):
        tensor = _members(tensor, "each of 'outputs'", dict)
        _known_keys(tensor, ("name", "parameters"), "an output")
        name = tensor.get("name")
        parameters = _members(tensor.get("parameters", {}), f"the parameters of output {shown(name)}", dict)
        builder.add_output(name, parameters)
    return builder.build()
