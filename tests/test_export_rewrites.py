"""Exact ONNX graph rewrites (export/rewrites.py) on hand-built graphs: onnxruntime computes the same outputs
before and after.

Every export here runs with one thread (`runtime.threads=1`): the two cores are shared.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from export.rewrites import (
    consecutive_reshapes_merged,
    drop_multiplications_by_one,
    drop_unread,
    layout_preserving_transposes_to_reshapes,
    outputs_from_their_producers,
    transposed_weights_into_gemm,
)


def test_graph_rewrites_drop_multiplications_by_one_and_output_identities_exactly() -> None:
    """export/rewrites.py on a hand-built graph: a Mul by ones that keeps its operand's shape is gone, one that
    widens it (broadcast) or multiplies by something else stays, an output Identity of a computed value becomes
    that value's producer — and onnxruntime computes the same outputs before and after (inf and NaN included)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 5])
    narrow = helper.make_tensor_value_info("narrow", TensorProto.FLOAT, [2, 1, 3, 5])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "wide", "twice", "copy")]
    inits = [
        numpy_helper.from_array(np.ones((1, 4, 1, 1), np.float32), "gate"),
        numpy_helper.from_array(np.full((1, 4, 1, 1), 2.0, np.float32), "two"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "gate"], ["gated"]),  # a head gate of ones: the operand itself
        helper.make_node("Relu", ["gated"], ["y"]),
        helper.make_node("Mul", ["gate", "narrow"], ["wide"]),  # broadcasts [2,1,3,5] to [2,4,3,5]: kept
        helper.make_node("Mul", ["x", "two"], ["twice"]),  # not ones: kept
        helper.make_node("Neg", ["x"], ["negated"]),
        helper.make_node("Identity", ["negated"], ["copy"]),  # an output copy of a computed value
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x, narrow], outs, inits),
        opset_imports=[helper.make_opsetid("", 20)],
        ir_version=10,
    )
    feeds = {"x": np.random.default_rng(0).normal(size=(2, 4, 3, 5)).astype(np.float32)}
    feeds["narrow"] = feeds["x"][:, :1].copy()
    feeds["x"][0, 0, 0, :2] = [np.inf, np.nan]

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    before = run(model)
    drop_multiplications_by_one(model)
    outputs_from_their_producers(model)
    drop_unread(model)
    ops = [(n.op_type, list(n.input)) for n in model.graph.node]
    assert (
        ("Identity", ["x"]) in ops and ["x", "two"] in [i for _, i in ops] and ["gate", "narrow"] in [i for _, i in ops]
    )
    producer = {o: n for n in model.graph.node for o in n.output}
    assert producer["copy"].op_type == "Neg" and producer["copy"].input[0] == "x"
    for a, b in zip(before, run(model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_transposes_that_move_only_unit_axes_become_reshapes_exactly() -> None:
    """A Transpose that moves only size-1 axes keeps memory order: it becomes a Reshape (which onnxruntime runs
    without a copy) with the batch axis left dynamic; Transposes that move data, or whose target shape would need
    two unknown sizes, stay. onnxruntime computes the same outputs before and after, at several batch sizes."""
    n = "n"
    specs = {  # input name: (shape, perm, becomes a Reshape)
        "heads_split": ([n, 1, 8, 4], [0, 2, 1, 3], True),  # [N, 1, H, dh] -> [N, H, 1, dh]: one query position
        "key_t": ([n, 8, 1, 4], [0, 1, 3, 2], True),  # [N, H, 1, dh] -> [N, H, dh, 1]
        "moves_data": ([n, 3, 8, 4], [0, 2, 1, 3], False),
        "two_unknowns": ([1, n, "m"], [1, 2, 0], False),  # [1, N, M] -> [N, M, 1]: order kept, two -1 sizes
    }
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, shape) for k, (shape, _, _) in specs.items()]
    outputs = [helper.make_tensor_value_info(f"{k}_out", TensorProto.FLOAT, None) for k in specs]
    nodes = [helper.make_node("Transpose", [k], [f"{k}_out"], perm=perm) for k, (_, perm, _) in specs.items()]
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 20)], ir_version=10
    )
    rng = np.random.default_rng(0)

    def run(m: onnx.ModelProto, batch: int) -> list[np.ndarray]:
        sizes = {n: batch, "m": 3}
        feeds = {
            k: rng.standard_normal([sizes.get(d, d) for d in shape]).astype(np.float32)
            for k, (shape, _, _) in specs.items()
        }
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return [feeds, *session.run(None, feeds)]

    before = [run(model, batch) for batch in (1, 5)]
    layout_preserving_transposes_to_reshapes(model)
    ops = {node.input[0]: node.op_type for node in model.graph.node}
    assert ops == {k: "Reshape" if reshape else "Transpose" for k, (_, _, reshape) in specs.items()}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds, *expected in before:
        for a, b in zip(expected, session.run(None, feeds), strict=True):
            np.testing.assert_array_equal(a, b)
    layout_preserving_transposes_to_reshapes(model)  # idempotent: nothing left to rewrite
    assert [node.op_type for node in model.graph.node].count("Reshape") == 2


def test_consecutive_reshapes_merge_into_the_last_exactly() -> None:
    """Reshape(Reshape(x, s1), s2) reads x directly when nothing else reads the inner result and every 0 in s2
    names an axis x has the same size on; a Reshape whose 0 would then mean another size, and one whose inner
    result has a second reader, stay. onnxruntime computes the same outputs before and after, at several
    batch sizes."""
    inputs = [
        helper.make_tensor_value_info("heads", TensorProto.FLOAT, ["n", 1, 8]),
        helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["n", 6]),
    ]
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        for name in ("moved", "shared_moved", "split", "regrouped")
    ]
    inits = [
        numpy_helper.from_array(np.array(shape, dtype=np.int64), name)
        for name, shape in {
            "to_heads": [0, 1, 2, 4],
            "to_positions": [0, 2, 1, 4],
            "to_pairs": [2, -1],
            "to_groups": [0, 3, -1],
        }.items()
    ]
    nodes = [
        helper.make_node("Reshape", ["heads", "to_heads"], ["split"]),  # [N, 1, 2, 4]; also read below
        helper.make_node("Reshape", ["split", "to_positions"], ["shared_moved"]),  # kept: "split" has 2 readers
        helper.make_node("Reshape", ["heads", "to_heads"], ["split_once"]),
        helper.make_node("Reshape", ["split_once", "to_positions"], ["moved"]),  # merged: reads "heads"
        helper.make_node("Reshape", ["flat", "to_pairs"], ["pairs"]),  # [2, 3N]
        helper.make_node("Reshape", ["pairs", "to_groups"], ["regrouped"]),  # its 0 is 2, not N: kept
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", 20)],
        ir_version=10,
    )
    rng = np.random.default_rng(0)
    cases = [
        {
            "heads": rng.standard_normal((batch, 1, 8)).astype(np.float32),
            "flat": rng.standard_normal((batch, 6)).astype(np.float32),
        }
        for batch in (1, 4)
    ]

    def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    before = [run(model, feeds) for feeds in cases]
    consecutive_reshapes_merged(model)
    drop_unread(model)
    reads = {node.output[0]: node.input[0] for node in model.graph.node}
    assert reads["moved"] == "heads" and reads["shared_moved"] == "split" and reads["regrouped"] == "pairs"
    assert "split_once" not in reads
    for feeds, expected in zip(cases, before, strict=True):
        for a, b in zip(expected, run(model, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_matmul_of_a_transposed_table_becomes_gemm_exactly_and_int8_still_quantises_it(tmp_path) -> None:
    """MatMul(x, Transpose(W)) with x 2-D becomes Gemm(x, W, transB=1), no transposed copy of W left (the tied
    output projection: onnxruntime folded the Transpose into a second copy of the table at load); a Transpose read
    twice, or feeding a MatMul of 3-D rows, stays. onnxruntime computes the same bits before and after; the INT8
    step's preparation turns the Gemm back into a MatMul of Wᵀ, which quantize_dynamic quantises."""
    from export.onnx_files import DECODER_FILE, ENCODER_FILE, quantize_graphs, save_graph

    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    def graph(nodes: list[onnx.NodeProto], outputs: list[str], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 16])]
        inputs.append(helper.make_tensor_value_info("rows3", TensorProto.FLOAT, ["rows", 1, 16]))
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
        g = helper.make_graph(nodes, "g", inputs, outs, inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)

    feeds = {"x": rng.normal(size=(5, 16)).astype(np.float32), "rows3": rng.normal(size=(5, 1, 16)).astype(np.float32)}

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    projection = [
        helper.make_node("Transpose", ["table"], ["t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "t"], ["logits"]),  # the tied projection: becomes Gemm
    ]
    others = [
        helper.make_node("Transpose", ["other"], ["u"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "u"], ["once"]),
        helper.make_node("Relu", ["u"], ["twice"]),  # u read twice: stays
        helper.make_node("Transpose", ["third"], ["v"], perm=[1, 0]),
        helper.make_node("MatMul", ["rows3", "v"], ["rows_out"]),  # 3-D rows (Gemm takes 2-D only): stays
    ]
    tables = [weight("table", 40, 16), weight("other", 16, 16), weight("third", 16, 16)]
    model = graph(projection + others, ["logits", "once", "twice", "rows_out"], tables)
    before = run(model)
    transposed_weights_into_gemm(model)
    ops = {n.output[0]: (n.op_type, list(n.input)) for n in model.graph.node}
    assert ops["logits"] == ("Gemm", ["x", "table"]) and "t" not in ops
    assert ops["u"][0] == "Transpose" and ops["v"][0] == "Transpose" and ops["rows_out"][0] == "MatMul"
    for a, b in zip(before, run(model), strict=True):
        np.testing.assert_array_equal(a, b)

    alone = graph(projection, ["logits"], tables[:1])  # INT8: the projection alone, as both graphs of an export
    transposed_weights_into_gemm(alone)
    for name in (ENCODER_FILE, DECODER_FILE):
        copy = onnx.ModelProto()
        copy.CopyFrom(alone)  # save_graph moves the weights of what it saves into the data file
        save_graph(copy, tmp_path / name)
    quantize_graphs(tmp_path)
    quantized = onnx.load(str(tmp_path / DECODER_FILE))
    ops = {n.op_type for n in quantized.graph.node}
    assert "Gemm" not in ops and ("MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops)
    int8 = run(quantized)[0]
    np.testing.assert_allclose(int8, before[0], atol=0.05 * np.abs(before[0]).max())  # INT8 drift only
