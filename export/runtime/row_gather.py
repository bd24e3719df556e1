"""The one-node ONNX graph `out = Gather(data, rows, axis=0)`, written as protobuf bytes without the onnx package.

Why a graph: the device-resident decoding state (device_state.py) keeps its tensors in the execution provider's
memory, and onnxruntime's Python API has no operation on an OrtValue besides running a session; choosing rows
(beam reordering, finished sentences leaving, a store growing) is one Gather run where the tensors live. Why written
by hand: the runtime must import nothing but numpy and onnxruntime (Triton's Python models copy it), and the model
is four messages. tests/test_device_state.py checks that onnx reads them as the model onnx.helper makes.
"""

from __future__ import annotations

import numpy as np

# onnx.TensorProto.DataType of the element types a decoding state holds
ONNX_ELEMENT_TYPES = {
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10,
}
IR_VERSION = 8  # onnxruntime ≥ 1.14 reads it
OPSET = 13  # Gather's current definition
ATTRIBUTE_INT = 2  # onnx.AttributeProto.AttributeType.INT
DATA, ROWS, OUT = "data", "rows", "out"


def _varint(value: int) -> bytes:
    """A protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    """Field `field` as a varint (wire type 0)."""
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, payload: bytes | str) -> bytes:
    """Field `field` as length-delimited bytes (wire type 2): a string or an embedded message."""
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _tensor_value(name: str, element_type: int, dims: tuple[str, ...]) -> bytes:
    """ValueInfoProto{name, type: TypeProto{tensor_type: {elem_type, shape}}} with symbolic dimensions `dims`."""
    shape = b"".join(_bytes(1, _bytes(2, d)) for d in dims)  # TensorShapeProto{dim: Dimension{dim_param}}
    return _bytes(1, name) + _bytes(2, _bytes(1, _int(1, element_type) + _bytes(2, shape)))


def gather_model(dtype: np.dtype) -> bytes:
    """A serialized ModelProto: `out = Gather(data, rows, axis=0)` for `data` [n, w] of `dtype` and int64 `rows`
    [k] → [k, w]. Two axes: callers bind any tensor as [rows, the rest] (device_state.py binds by pointer)."""
    element = ONNX_ELEMENT_TYPES.get(np.dtype(dtype))
    if element is None:
        raise ValueError(f"no row gather for dtype {np.dtype(dtype)}; known: {sorted(map(str, ONNX_ELEMENT_TYPES))}")
    axis = _bytes(1, "axis") + _int(3, 0) + _int(20, ATTRIBUTE_INT)  # AttributeProto{name, i, type}
    node = _bytes(1, DATA) + _bytes(1, ROWS) + _bytes(2, OUT) + _bytes(3, "gather") + _bytes(4, "Gather")
    node += _bytes(5, axis)
    graph = _bytes(1, node) + _bytes(2, "row_gather")
    graph += _bytes(11, _tensor_value(DATA, element, ("n", "w")))
    graph += _bytes(11, _tensor_value(ROWS, ONNX_ELEMENT_TYPES[np.dtype(np.int64)], ("k",)))
    graph += _bytes(12, _tensor_value(OUT, element, ("k", "w")))
    opset = _bytes(1, "") + _int(2, OPSET)  # OperatorSetIdProto{domain: "" (ai.onnx), version}
    return _int(1, IR_VERSION) + _bytes(2, "attention-zoo") + _bytes(7, graph) + _bytes(8, opset)
