"""The decoder's fused self-attention chosen by rows (export/self_attention_by_rows.py): the If it becomes computes
the formula on both sides of the crossover — the fused kernel for few rows, the written-out step for many — for one
query position per key/value head (mha) and several (gqa), at the first step (no past) and later."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.graph import ExportError
from export.rewrites import nested_nodes
from export.self_attention_by_rows import self_attention_by_rows

MOST = 4


def attention_reference(q, k, v, past_k, past_v):
    """q [N, g, Hkv·dh] (g query positions per key/value head), k/v [N, 1, Hkv·dh], past [N, Hkv, t, dh] →
    softmax(q Kᵀ / √dh) V over the past and the new position, per key/value head: [N, g, Hkv·dh]."""
    n, g, width = q.shape
    kv, dh = past_k.shape[1], past_k.shape[3]
    qh = q.reshape(n, g, kv, dh).transpose(0, 2, 1, 3)  # [N, Hkv, g, dh]
    keys = np.concatenate([past_k, k.reshape(n, kv, 1, dh)], axis=2)  # [N, Hkv, t+1, dh]
    values = np.concatenate([past_v, v.reshape(n, kv, 1, dh)], axis=2)
    scores = qh @ keys.transpose(0, 1, 3, 2) / np.sqrt(dh)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return (weights @ values).transpose(0, 2, 1, 3).reshape(n, g, width)


def step_graph(kv: int, group: int, dh: int, bias: bool = False) -> onnx.ModelProto:
    """A decoder step's self-attention as FusedSelfStep exports it: q/k/v from one Split, the query heads of a
    key/value head as positions, MultiHeadAttention over the past with its grown caches asked for; `tokens` [N, 1]
    gives the rows."""
    width = kv * dh
    floats = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", 1]),
        helper.make_tensor_value_info("qkv", floats, ["N", 1, (group + 2) * width]),
        helper.make_tensor_value_info("past_k", floats, ["N", kv, "t", dh]),
        helper.make_tensor_value_info("past_v", floats, ["N", kv, "t", dh]),
    ]
    init = [
        numpy_helper.from_array(np.array([group * width, width, width], np.int64), "widths"),
        numpy_helper.from_array(np.array([0, group, width], np.int64), "positions"),
    ]
    if bias:
        init.append(numpy_helper.from_array(np.zeros(3 * width, np.float32), "bias"))
    nodes = [
        helper.make_node("Split", ["qkv", "widths"], ["q_heads", "k", "v"], axis=-1),
        helper.make_node("Reshape", ["q_heads", "positions"], ["q"]),
        helper.make_node(
            "MultiHeadAttention",
            ["q", "k", "v", "bias" if bias else "", "", "", "past_k", "past_v"],
            ["out", "grown_k", "grown_v"],
            domain="com.microsoft",
            num_heads=kv,
        ),
    ]
    outputs = [helper.make_tensor_value_info("out", floats, ["N", group, width])]
    graph = helper.make_graph(nodes, "step", inputs, outputs, init)
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@pytest.mark.parametrize(("kv", "group"), [(4, 1), (2, 3)])
@pytest.mark.parametrize("past", [0, 5])
def test_the_step_is_the_formula_with_few_rows_and_with_many(kv: int, group: int, past: int) -> None:
    dh = 8
    model = step_graph(kv, group, dh)
    assert self_attention_by_rows(model, most=MOST) == 1
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node if n.op_type in ("If", "MultiHeadAttention")] == ["If"]
    kernels = {n.op_type for n in nested_nodes(model.graph)}
    assert {"MultiHeadAttention", "FusedMatMul", "Softmax"} <= kernels
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(past + group)
    for rows in (1, MOST, MOST + 1, 3 * MOST):  # the fused kernel up to MOST rows, written out beyond
        qkv = rng.standard_normal((rows, 1, (group + 2) * kv * dh), dtype=np.float32)
        past_k, past_v = (rng.standard_normal((rows, kv, past, dh), dtype=np.float32) for _ in range(2))
        feeds = {"tokens": np.zeros((rows, 1), np.int64), "qkv": qkv, "past_k": past_k, "past_v": past_v}
        [out] = session.run(None, feeds)
        q, k, v = np.split(qkv, [group * kv * dh, (group + 1) * kv * dh], axis=-1)
        expected = attention_reference(q.reshape(rows, group, kv * dh), k, v, past_k, past_v)
        np.testing.assert_allclose(out, expected, atol=1e-5, err_msg=f"{rows} rows")


def test_a_graph_without_a_fused_self_attention_is_left_as_it_is() -> None:
    model = step_graph(4, 1, 8)
    model.graph.node[2].input[6:] = []  # no past: a cross-attention's shape of call
    before = model.SerializeToString()
    assert self_attention_by_rows(model) == 0 and model.SerializeToString() == before


def test_a_fused_self_attention_with_a_bias_input_is_refused() -> None:
    with pytest.raises(ExportError, match="bias or mask"):
        self_attention_by_rows(step_graph(4, 1, 8, bias=True))
