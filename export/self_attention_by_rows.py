"""The fused self-attention step for few rows, written out for many — one decoder graph that is fast at both (issue 88).

Why: onnxruntime's fused MultiHeadAttention kernel (export/fused_attention.py) makes a batch-1 step faster, but it
attends to a past only when it also returns the grown caches, so at many rows every step copies every row's whole
past once more per layer: at beam 5 × 32 (160 rows) a step was ≈ 10% slower than the same attention written out,
and the process peaked 123 MB higher (results/runtime/fast_defaults.md). So each fused self-attention node becomes
If(rows ≤ `most`, the node, the same attention written out over the past as it is): scores of the past
(FusedMatMul against the past, transposed in the kernel) and of the new position apart, one Softmax, the weighted
past plus the weighted new value — no grown copy. The weights stay outside the If (the q/k/v projection feeds both
branches), so nothing is read or packed twice; an If costs ≈ 2 µs a step. Decided per decoder call by the graph
itself, from the number of rows of `tokens`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.graph import ExportError
from export.rewrites import constant_ints

# Rows up to which the fused kernel runs: 3–4% the faster at some counts up to 4 rows, level (±3%) from 8 to 160 in a
# step's time, and 123 MB heavier at 160 (beam 5 × 32) — `python -m export.bench.self_attention_rows`, the Intel Xeon
# reports in results/runtime/fast_defaults/ (fast_defaults.md)
FUSED_MOST_ROWS = 8
CONDITION = "self_attention.few_rows"  # [1] bool: the step has at most FUSED_MOST_ROWS rows


def self_attention_by_rows(model: onnx.ModelProto, most: int = FUSED_MOST_ROWS) -> int:
    """Wrap every fused self-attention (a MultiHeadAttention reading a past) of the decoder graph in an If on the
    step's rows (module docstring); returns how many. A graph without one is left as it is."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    nodes, count = [], 0
    for node in graph.node:
        past = node.op_type == "MultiHeadAttention" and len(node.input) > 7 and node.input[6] and node.input[7]
        if not past:
            nodes.append(node)
            continue
        nodes.append(_by_rows(node, *_layout(graph, producer, node), f"self_attention.{count}"))
        count += 1
    if count:
        rows = [
            helper.make_node("Shape", ["tokens"], [CONDITION + ".rows"], start=0, end=1),
            _constant(CONDITION + ".most", [most]),
            helper.make_node("LessOrEqual", [CONDITION + ".rows", CONDITION + ".most"], [CONDITION]),
        ]
        ordered = onnx.GraphProto()
        ordered.node.extend(rows + nodes)  # copies, made before the originals go (as export/fp16.py orders nodes)
        del graph.node[:]
        graph.node.extend(ordered.node)
    return count


def _layout(graph: onnx.GraphProto, producer: dict, node: onnx.NodeProto) -> tuple[int, int, int]:
    """(key/value heads, query heads per key/value head, head size) of a fused self-attention node: its head count,
    and the widths of the Split its new key comes from (q, k, v rows in that order: FusedSelfStep)."""
    heads = next(a.i for a in node.attribute if a.name == "num_heads")
    if any(node.input[3:6]):  # FusedSelfStep gives none: its biases are in the q/k/v projection, no mask
        raise ExportError(
            f"{node.name}: a fused self-attention with a bias or mask input; the written-out step has none"
        )
    split = producer.get(node.input[1])
    widths = constant_ints(graph, split.input[1]) if split is not None and split.op_type == "Split" else None
    if not widths or len(widths) != 3 or widths[1] % heads or widths[0] % widths[1]:
        raise ExportError(f"{node.name}: a fused self-attention whose key is not the middle of a q/k/v Split")
    return heads, widths[0] // widths[1], widths[1] // heads


def _by_rows(node: onnx.NodeProto, heads: int, group: int, dh: int, tag: str) -> onnx.NodeProto:
    """If(CONDITION, the fused node, the attention written out), producing the node's output."""
    fused = onnx.NodeProto()
    fused.CopyFrom(node)
    fused.output[:] = [f"{tag}.fused", f"{tag}.grown_k", f"{tag}.grown_v"]  # grown caches asked for, unread
    q, k, v, past_k, past_v = (node.input[i] for i in (0, 1, 2, 6, 7))
    scale = next((a.f for a in node.attribute if a.name == "scale" and a.f), 1.0 / float(np.sqrt(dh)))
    branches = {
        "then_branch": _branch([fused], f"{tag}.fused", tag + ".then"),
        "else_branch": _branch(
            _written_out(q, k, v, past_k, past_v, heads, group, dh, scale, tag), f"{tag}.written", tag + ".else"
        ),
    }
    return helper.make_node("If", [CONDITION], [node.output[0]], name=tag, **branches)


def _branch(nodes: list[onnx.NodeProto], output: str, name: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])


def _written_out(
    q: str, k: str, v: str, past_k: str, past_v: str, heads: int, group: int, dh: int, scale: float, tag: str
) -> list[onnx.NodeProto]:
    """What the fused node computes, over q [N, g, Hkv·dh] (a group's query heads as positions), the new k and v
    [N, 1, Hkv·dh] and the past [N, Hkv, t, dh]: softmax over the t + 1 keys, no mask — into `{tag}.written`."""
    p = (tag + ".{}").format
    nodes = [
        _constant(p("qkv_heads"), [0, heads, 1, dh]),
        _constant(p("heads_out"), [0, group, heads * dh]),
        _constant(p("first"), [0]),
        _constant(p("last"), [-1]),
        _constant(p("end"), [np.iinfo(np.int64).max]),
        helper.make_node("Reshape", [k, p("qkv_heads")], [p("k")]),  # [N, Hkv, 1, dh]: one position, same memory
        helper.make_node("Reshape", [v, p("qkv_heads")], [p("v")]),
    ]
    if group == 1:  # [N, 1, Hkv·dh] → [N, Hkv, 1, dh]: the same memory
        nodes.append(helper.make_node("Reshape", [q, p("qkv_heads")], [p("q")]))
    else:  # [N, g, Hkv, dh] → [N, Hkv, g, dh]
        nodes += [
            _constant(p("q_shape"), [0, group, heads, dh]),
            helper.make_node("Reshape", [q, p("q_shape")], [p("q_positions")]),
            helper.make_node("Transpose", [p("q_positions")], [p("q")], perm=[0, 2, 1, 3]),
        ]
    ms = "com.microsoft"
    nodes += [
        helper.make_node("FusedMatMul", [p("q"), past_k], [p("past_scores")], domain=ms, transB=1, alpha=scale),
        helper.make_node("FusedMatMul", [p("q"), p("k")], [p("new_score")], domain=ms, transB=1, alpha=scale),
        helper.make_node("Concat", [p("past_scores"), p("new_score")], [p("scores")], axis=-1),  # [N, Hkv, g, t+1]
        helper.make_node("Softmax", [p("scores")], [p("weights")], axis=-1),
        helper.make_node("Slice", [p("weights"), p("first"), p("last"), p("last")], [p("past_weights")]),
        helper.make_node("Slice", [p("weights"), p("last"), p("end"), p("last")], [p("new_weight")]),
        helper.make_node("MatMul", [p("past_weights"), past_v], [p("from_past")]),  # [N, Hkv, g, dh]
        helper.make_node("MatMul", [p("new_weight"), p("v")], [p("from_new")]),
        helper.make_node("Add", [p("from_past"), p("from_new")], [p("heads")]),
    ]
    if group == 1:
        nodes.append(helper.make_node("Reshape", [p("heads"), p("heads_out")], [p("written")]))
    else:
        nodes += [
            helper.make_node("Transpose", [p("heads")], [p("positions")], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p("positions"), p("heads_out")], [p("written")]),
        ]
    return nodes


def _constant(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name))
