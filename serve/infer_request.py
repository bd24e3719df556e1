"""An inference request as the gate understands it, checked against the served model and built anew for Triton.

Why rebuild instead of forwarding: three rounds of attacks each found a new single request that crashes
tritonserver 2.51 (classification of a BYTES output, deep JSON, a non-canonical path around the checks; issue 84).
A list of known-bad requests cannot keep up, so the gate reads a request into this one neutral form — model,
version, id, scalar parameters the models read, BYTES inputs of [rows, 1], outputs by name — refusing anything
else with one line, and Triton receives only bytes the gate wrote (`encode_http`, `encode_grpc`): one encoding
per protocol, the parameters it knows, the tensors the model declares.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

from tritonclient.grpc import service_pb2

from serve.served_models import (
    CLIENT_PARAMETER,
    DROPPED_PARAMETERS,
    HTTP_PARAMETERS,
    MODEL_PARAMETERS,
    ServedModel,
)

Scalar = bool | int | float | str
NAME_SHOWN = 40  # characters of a client-chosen name quoted in an error (a 1 MB name is not echoed)
MAX_ID_CHARS = 128  # a request id is echoed in the answer: a label, not a payload
MAX_TEXT_PARAMETER = 64  # a parameter sent as text ("5", "true"): the models read numbers and booleans
INT64 = 1 << 63


class RequestRefused(ValueError):
    """A request the gate does not build for Triton; the message is one line naming the problem and the fix."""


def shown(name: object) -> str:
    text = str(name)
    return repr(text if len(text) <= NAME_SHOWN else text[:NAME_SHOWN] + "…")


@dataclass(frozen=True)
class Output:
    name: str
    binary: bool = False  # HTTP: the answer's tensor in binary form (the binary tensor extension)


@dataclass
class InferRequest:
    """What Triton will receive: every field checked by `RequestBuilder` as it was added."""

    model: ServedModel
    version: str = ""  # "" = the model's version policy decides
    id: str = ""
    parameters: dict[str, Scalar] = field(default_factory=dict)
    inputs: dict[str, list[bytes]] = field(default_factory=dict)  # name -> one element per row ([rows, 1])
    outputs: dict[str, Output] = field(default_factory=dict)
    client: str = ""  # who sent it, as the gate names clients (client_name); sent to the model as CLIENT_PARAMETER

    def fingerprint(self) -> bytes:
        """What identifies the request's work (not its id), the same over HTTP and gRPC: the gate remembers the
        ones in flight at a crash. Its fields as they are, not a second encoding of the request."""
        outputs = sorted((o.name, o.binary) for o in self.outputs.values())
        return repr((self.model.name, self.version, sorted(self.parameters.items()), self.inputs, outputs)).encode()


class RequestBuilder:
    """Adds a request's parts one at a time, each checked against the model before it is kept, so a reader can
    stop at the first part over a limit (a refused request costs what was read up to there)."""

    def __init__(self, model: ServedModel, version: str = "", http: bool = False) -> None:
        if version and version not in model.versions:
            raise RequestRefused(
                f"model {shown(model.name)} has no version {shown(version)}; served: {', '.join(model.versions)}"
            )
        self.request = InferRequest(model, version)
        self.allowed = MODEL_PARAMETERS | DROPPED_PARAMETERS | (HTTP_PARAMETERS if http else frozenset())

    def set_id(self, value: object) -> None:
        if not isinstance(value, str) or len(value) > MAX_ID_CHARS or not value.isprintable():
            raise RequestRefused(f"the request id must be printable text of at most {MAX_ID_CHARS} characters")
        self.request.id = value

    def add_parameter(self, name: str, value: object) -> None:
        if name not in self.allowed:
            raise RequestRefused(f"unknown request parameter {shown(name)}; allowed: {', '.join(sorted(self.allowed))}")
        if name in self.request.parameters:
            raise RequestRefused(f"the request sets parameter {shown(name)} twice; send each parameter once")
        ok = isinstance(value, bool | float) or (isinstance(value, int) and -INT64 <= value < INT64)
        if isinstance(value, str):
            ok = len(value) <= MAX_TEXT_PARAMETER
        if not ok:
            raise RequestRefused(
                f"parameter {shown(name)} must be a number, a boolean or a short text; got {shown(value)}"
            )
        if name not in DROPPED_PARAMETERS:  # its range and form: the model's strict reader (model_requests.py)
            self.request.parameters[name] = value

    def check_input(self, name: object, datatype: object, shape: object) -> int:
        """The rows an input of this name, datatype and shape may carry (its elements are added next)."""
        model = self.request.model
        if name not in model.inputs:
            raise RequestRefused(
                f"model {shown(model.name)} has no input {shown(name)}; its inputs: {', '.join(model.inputs)}"
            )
        if name in self.request.inputs:
            raise RequestRefused(f"input {shown(name)} is sent twice; send each input once")
        if datatype != "BYTES":
            raise RequestRefused(f"input {shown(name)} has datatype {shown(datatype)}; send BYTES (UTF-8 text)")
        rows = shape[0] if isinstance(shape, list | tuple) and len(shape) == 2 and shape[1] == 1 else None
        if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows <= model.max_batch_size:
            raise RequestRefused(
                f"input {shown(name)} has shape {shown(shape)}; send [rows, 1] with 1 ≤ rows ≤ "
                f"{model.max_batch_size} (the model's max_batch_size)"
            )
        return rows

    def add_input(self, name: str, rows: int, elements: list[bytes]) -> None:
        if len(elements) != rows:
            raise RequestRefused(
                f"input {shown(name)} has {len(elements)} elements for shape [{rows}, 1]; send one text per row"
            )
        self.request.inputs[name] = elements

    def add_output(self, name: object, parameters: dict[str, object]) -> None:
        model = self.request.model
        if name not in model.outputs:
            raise RequestRefused(
                f"model {shown(model.name)} has no output {shown(name)}; its outputs: {', '.join(model.outputs)}"
            )
        if name in self.request.outputs:
            raise RequestRefused(f"output {shown(name)} is asked for twice; ask once")
        for key, value in parameters.items():
            if key != "binary_data" or not isinstance(value, bool):
                raise RequestRefused(
                    f"output {shown(name)} asks for parameter {shown(key)}, which these models do not serve "
                    "(allowed: binary_data, a boolean); remove it"
                )
        self.request.outputs[name] = Output(name, bool(parameters.get("binary_data", False)))

    def build(self) -> InferRequest:
        if not self.request.inputs:
            raise RequestRefused(f"the request has no input; send {self.request.model.inputs[0]} ([rows, 1] BYTES)")
        return self.request


def bytes_elements(data: bytes | memoryview, rows: int, name: str) -> list[bytes]:
    """The binary form of a BYTES tensor (each element: 4-byte little-endian length, then its bytes) → elements;
    RequestRefused when it does not hold exactly `rows` elements."""
    buf = memoryview(data)
    out: list[bytes] = []
    pos = 0
    while pos < len(buf):
        if len(out) == rows or pos + 4 > len(buf):
            break
        (size,) = struct.unpack_from("<I", buf, pos)
        if pos + 4 + size > len(buf):
            break
        out.append(bytes(buf[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    if len(out) != rows or pos != len(buf):
        raise RequestRefused(
            f"input {shown(name)}'s binary data does not hold exactly {rows} length-prefixed elements; "
            "send each element as a 4-byte little-endian length and its bytes"
        )
    return out


def _binary(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def infer_path(request: InferRequest) -> str:
    version = f"/versions/{request.version}" if request.version else ""
    return f"/v2/models/{request.model.name}{version}/infer"


def encode_http(request: InferRequest) -> tuple[bytes, int]:
    """The body Triton's HTTP endpoint receives (a JSON header, then every input in binary) and the header's
    length (the `Inference-Header-Content-Length` header)."""
    blobs = [_binary(elements) for elements in request.inputs.values()]
    header: dict[str, object] = {
        "inputs": [
            {"name": name, "datatype": "BYTES", "shape": [len(rows), 1], "parameters": {"binary_data_size": len(b)}}
            for (name, rows), b in zip(request.inputs.items(), blobs, strict=True)
        ]
    }
    if request.id:
        header["id"] = request.id
    parameters = _with_client(request)
    if parameters:
        header["parameters"] = parameters
    if request.outputs:
        header["outputs"] = [
            {"name": o.name, **({"parameters": {"binary_data": True}} if o.binary else {})}
            for o in request.outputs.values()
        ]
    head = json.dumps(header, ensure_ascii=True, allow_nan=False).encode()
    return head + b"".join(blobs), len(head)


def encode_grpc(request: InferRequest) -> bytes:
    """The ModelInferRequest Triton's gRPC endpoint receives: inputs as raw contents, parameters typed."""
    message = service_pb2.ModelInferRequest(model_name=request.model.name, model_version=request.version)
    if request.id:
        message.id = request.id
    for name, value in _with_client(request).items():
        param = message.parameters[name]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = value
    for name, elements in request.inputs.items():
        message.inputs.add(name=name, datatype="BYTES", shape=[len(elements), 1])
        message.raw_input_contents.append(_binary(elements))
    for output in request.outputs.values():
        message.outputs.add(name=output.name)
    return message.SerializeToString()


def client_name(identity: str) -> str:
    """The name the lanes share by (serve/triton/model_lanes.py) for what nginx says of a client — its address and
    `zoo-client` key (serve/proxy.py CLIENT_ID_HEADER) — a digest, so the models never see addresses."""
    return hashlib.sha256(identity.encode(errors="replace")).hexdigest()[:16] if identity else ""


def _with_client(request: InferRequest) -> dict[str, Scalar]:
    return {**request.parameters, CLIENT_PARAMETER: request.client} if request.client else request.parameters
