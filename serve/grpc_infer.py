"""Reading gRPC messages into what the gate builds for Triton, from the wire format (serve/wire.py), never with
protobuf's parser: a refused message costs the fields read before its first one over a limit (issue 84: 2M empty
inputs in a 4 MB message cost ≈ 400 MB through protobuf's parser).

ModelInferRequest fields (grpc_service.proto): 1 model_name, 2 model_version, 3 id, 4 parameters (map entries: 1
key, 2 InferParameter), 5 inputs (1 name, 2 datatype, 3 shape, 4 parameters, 5 contents: 8 bytes_contents),
6 outputs (1 name, 2 parameters), 7 raw_input_contents. InferParameter's oneof: 1 bool, 2 int64, 3 string,
4 double, 5 uint64. The small requests (ModelReady, ModelMetadata, ModelConfig, ModelStatistics) are 1 name,
2 version.
"""

from __future__ import annotations

from serve.infer_request import InferRequest, RequestBuilder, RequestRefused, Scalar, bytes_elements, shown
from serve.served_models import DROPPED_PARAMETERS, MODEL_PARAMETERS, ServedModel
from serve.wire import I64, LEN, VARINT, WireError, double, fields, packed_varints, signed64, text

MOST_TENSORS = 8  # inputs, outputs or raw contents in one message: every served model declares fewer


def _too_many(count: int, most: int, what: str) -> None:
    if count > most:
        raise RequestRefused(f"more than {most} {what} in one request; the served models take at most {most}")


def _expect(kind: int, wanted: int, what: str) -> None:
    if kind != wanted:
        raise RequestRefused(f"{what} is not encoded as ModelInferRequest declares it")


def _parameter(entry: memoryview, what: str) -> tuple[str, Scalar]:
    key, value, set_ = "", None, False
    for number, kind, data in fields(entry):
        if number == 1 and kind == LEN:
            key = text(data, what)  # type: ignore[arg-type]
        elif number == 2 and kind == LEN:
            for which, inner_kind, inner in fields(data):  # type: ignore[arg-type]
                if set_:
                    raise RequestRefused(f"{what} {shown(key)} has more than one value; send one")
                set_ = True
                if which == 1 and inner_kind == VARINT:
                    value = bool(inner)
                elif which in (2, 5) and inner_kind == VARINT:
                    value = signed64(inner) if which == 2 else inner  # type: ignore[arg-type]
                elif which == 3 and inner_kind == LEN:
                    value = text(inner, what)  # type: ignore[arg-type]
                elif which == 4 and inner_kind == I64:
                    value = double(inner)  # type: ignore[arg-type]
                else:
                    raise RequestRefused(f"{what} {shown(key)} has a value of no InferParameter type")
        else:
            raise RequestRefused(f"{what} has a field of no map entry")
    if value is None:
        value = False  # proto3 leaves a default value off the wire: an empty InferParameter reads as false
    return key, value


def _name_and_parameters(message: memoryview, what: str, most_parameters: int) -> tuple[str, dict, list]:
    """An input's or output's name, its parameters, and its other fields (number, kind, value) for the caller."""
    name, parameters, rest = "", {}, []
    for number, kind, data in fields(message):
        if number == 1:
            _expect(kind, LEN, f"the name of an {what}")
            name = text(data, f"the name of an {what}")  # type: ignore[arg-type]
        elif (what == "input" and number == 4) or (what == "output" and number == 2):
            _expect(kind, LEN, f"a parameter of {what} {shown(name)}")
            key, value = _parameter(data, f"a parameter of {what} {shown(name)}")  # type: ignore[arg-type]
            parameters[key] = value
            _too_many(len(parameters), most_parameters, f"parameters of {what} {shown(name)}")
        else:
            rest.append((number, kind, data))
    return name, parameters, rest


def read_grpc_infer(message: bytes, models: dict[str, ServedModel]) -> InferRequest:
    """The request a ModelInferRequest asks for; RequestRefused, one line, for anything the gate does not serve.
    The refusal is raised with no traceback into the reader's frames, whose memoryviews would keep the whole
    message alive as long as anyone holds the exception (a flood of refused 4 MB messages stayed resident)."""
    try:
        return _read(memoryview(message), models)
    except WireError as exc:
        reason = f"the ModelInferRequest message could not be read: {exc}"
    except RequestRefused as exc:
        reason = str(exc)
    del message
    raise RequestRefused(reason)


def _read(message: memoryview, models: dict[str, ServedModel]) -> InferRequest:
    model_name = version = request_id = ""
    parameters: list[memoryview] = []
    inputs: list[memoryview] = []
    outputs: list[memoryview] = []
    raw: list[memoryview] = []
    for number, kind, data in fields(message):  # counted as read: the first field over a limit ends it
        if number in (1, 2, 3):
            _expect(kind, LEN, "the model name, version or id")
            value = text(data, "the model name, version or id")  # type: ignore[arg-type]
            model_name, version, request_id = (
                (value, version, request_id)
                if number == 1
                else (model_name, value, request_id)
                if number == 2
                else (model_name, version, value)
            )
        elif number in (4, 5, 6, 7):
            _expect(kind, LEN, "a parameter, input or output")
            bucket, most, what = {
                4: (parameters, len(MODEL_PARAMETERS | DROPPED_PARAMETERS), "request parameters"),
                5: (inputs, MOST_TENSORS, "inputs"),
                6: (outputs, MOST_TENSORS, "outputs"),
                7: (raw, MOST_TENSORS, "raw input contents"),
            }[number]
            bucket.append(data)  # type: ignore[arg-type]
            _too_many(len(bucket), most, what)
        else:
            raise RequestRefused(f"field {number} of ModelInferRequest is not served; remove it")
    model = models.get(model_name)
    if model is None:
        raise RequestRefused(f"model {shown(model_name)} is not served here; served: {', '.join(sorted(models))}")
    builder = RequestBuilder(model, version)
    if request_id:
        builder.set_id(request_id)
    for entry in parameters:
        builder.add_parameter(*_parameter(entry, "request parameter"))
    if raw and len(raw) != len(inputs):
        raise RequestRefused(f"{len(raw)} raw input contents for {len(inputs)} inputs; send one per input")
    for index, tensor in enumerate(inputs):
        name, tensor_parameters, rest = _name_and_parameters(tensor, "input", 4)
        if tensor_parameters:
            key = next(iter(tensor_parameters))
            raise RequestRefused(
                f"input {shown(name)} asks for parameter {shown(key)}, which these models do not serve; remove it"
            )
        datatype, shape, contents = "", [], None
        for number, kind, data in rest:
            if number == 2 and kind == LEN:
                datatype = text(data, "a datatype")  # type: ignore[arg-type]
            elif number == 3 and kind == LEN:
                shape.extend(signed64(v) for v in packed_varints(data, 8))  # type: ignore[arg-type]
            elif number == 3 and kind == VARINT:
                shape.append(signed64(data))  # type: ignore[arg-type]
            elif number == 5 and kind == LEN:
                contents = data
            else:
                raise RequestRefused(f"input {shown(name)} has a field ({number}) these models do not serve")
            _too_many(len(shape), 8, f"dimensions of input {shown(name)}")
        rows = builder.check_input(name, datatype, shape)
        if raw:
            if contents is not None:
                raise RequestRefused(f"input {shown(name)} has contents and raw contents; send one of them")
            elements = bytes_elements(raw[index], rows, name)
        else:
            elements = []
            for number, kind, data in fields(contents if contents is not None else b""):
                if number != 8 or kind != LEN:
                    raise RequestRefused(f"input {shown(name)} must hold BYTES contents (bytes_contents)")
                elements.append(bytes(data))  # type: ignore[arg-type]
                _too_many(len(elements), rows, f"elements of input {shown(name)}")
        builder.add_input(name, rows, elements)
    for tensor in outputs:
        name, output_parameters, rest = _name_and_parameters(tensor, "output", 4)
        if rest:
            raise RequestRefused(f"output {shown(name)} has a field these models do not serve")
        builder.add_output(name, output_parameters)
    return builder.build()


def read_model_name(message: bytes, models: dict[str, ServedModel]) -> tuple[str, str]:
    """(name, version) of a ModelReady / ModelMetadata / ModelConfig / ModelStatistics request, both checked."""
    name = version = ""
    try:
        for number, kind, data in fields(message):
            if number in (1, 2) and kind == LEN:
                value = text(data, "the model name or version")  # type: ignore[arg-type]
                name, version = (value, version) if number == 1 else (name, value)
            else:
                raise RequestRefused(f"field {number} of a model request is not served; remove it")
    except WireError as exc:
        raise RequestRefused(f"the request message could not be read: {exc}") from None
    model = models.get(name)
    if model is None:
        raise RequestRefused(f"model {shown(name)} is not served here; served: {', '.join(sorted(models))}")
    if version and version not in model.versions:
        served = ", ".join(model.versions)
        raise RequestRefused(f"model {shown(name)} has no version {shown(version)}; served: {served}")
    return name, version
