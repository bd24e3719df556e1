"""Exact rewrites of an exported ONNX graph: nodes the torch modules have to compute in general, but that a
particular export does not need (the optimize step between writing a graph and saving it).

Every rewrite here changes no output value by construction — it replaces a node by what it provably returns —
and the export's verification (ORT against torch) runs on the rewritten graph. They matter at batch 1, where a
decoder step is a few hundred small kernels and each one costs its launch overhead whatever it computes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export.runtime.manifest import NEXT_PREFIX


def graph_and_branches(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """`graph` and every control-flow branch inside it (the decoder's shortlist If), outermost first."""
    found = [graph]
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found += graph_and_branches(attribute.g)
    return found


def nested_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its branches, which read the outer graph's values by name: a rewrite that
    renames or removes a value must see those readers."""
    for part in graph_and_branches(graph):
        yield from part.node


def reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs, and for a control-flow node every name its branches read (a superset
    of what they read from outside; their own values have names of their own)."""
    inner = [
        name
        for attribute in node.attribute
        if attribute.type == onnx.AttributeProto.GRAPH
        for sub in nested_nodes(attribute.g)
        for name in sub.input
    ]
    return [*node.input, *inner]


def constant_array(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    """The value of a graph constant (an initializer or a Constant node's tensor), None if `name` is not one."""
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and list(node.output) == [name]:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            return None if value is None else numpy_helper.to_array(value)
    return None


def constant_ints(graph: onnx.GraphProto, name: str) -> list[int] | None:
    """The int values of a graph constant, flattened; None if `name` is not one."""
    value = constant_array(graph, name)
    return None if value is None else [int(v) for v in value.reshape(-1)]


def _shapes(model: onnx.ModelProto) -> dict[str, onnx.TensorShapeProto]:
    inferred = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type.shape for v in [*inferred.value_info, *inferred.input, *inferred.output]}


def _to_identity(node: onnx.NodeProto, source: str) -> None:
    """Turn `node` into Identity(source), keeping its output name (onnxruntime removes it unless it is a graph
    output)."""
    node.op_type = "Identity"
    node.domain = ""
    del node.attribute[:]
    del node.input[:]
    node.input.append(source)


def new_positions_from_concat(model: onnx.ModelProto) -> None:
    """Return each growing self cache's new position as the Concat input it is, not as a Slice of the grown cache.

    graph.step_output slices the last position off the grown cache: the generic way, as it does not know how a
    mechanism grows it. Where the mechanism grows it by a two-input Concat along that axis and the Slice takes
    exactly the last position, which the Concat's second input is (size 1 there), the Slice is that input — and as
    a Slice it would keep every layer's grown cache alive until the end of the step. A mechanism that attends to
    the past and the new position apart (Attention.attend_step) leaves that Concat without a reader, and
    `drop_unread` removes it."""
    graph = model.graph
    shapes = _shapes(model)
    producer = {out: node for node in graph.node for out in node.output}
    for output in graph.output:
        node = producer.get(output.name)
        if not output.name.startswith(NEXT_PREFIX) or node is None or node.op_type != "Slice" or len(node.input) < 4:
            continue
        concat = producer.get(node.input[0])
        if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
            continue
        new_shape = shapes.get(concat.input[1])
        if new_shape is None:
            continue
        rank = len(new_shape.dim)
        axis = next(a.i for a in concat.attribute if a.name == "axis") % rank
        starts, ends, axes = (constant_ints(graph, name) for name in node.input[1:4])
        steps = constant_ints(graph, node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
        last_position = (
            starts == [-1]
            and axes is not None
            and [a % rank for a in axes] == [axis]
            and ends is not None
            and ends[0] >= 2**31 - 1
            and steps == [1]
            and new_shape.dim[axis].HasField("dim_value")
            and new_shape.dim[axis].dim_value == 1
        )
        if last_position:
            _to_identity(node, concat.input[1])


def _broadcasts_into(small: tuple[int, ...], shape: onnx.TensorShapeProto) -> bool:
    """Whether multiplying a tensor of `shape` by one of shape `small` leaves its shape as it is: `small` has no
    more axes, and each of its axes (aligned from the right) is 1 or the same known size."""
    dims = shape.dim
    if len(small) > len(dims):
        return False
    for size, dim in zip(reversed(small), reversed(dims), strict=False):
        if size != 1 and not (dim.HasField("dim_value") and dim.dim_value == size):
            return False
    return True


def drop_multiplications_by_one(model: onnx.ModelProto) -> None:
    """Mul by a constant of ones that does not widen the other operand is that operand (x·1 = x exactly in IEEE
    arithmetic, NaN, ±inf and −0 included).

    Every attention module multiplies its heads' outputs by its head gate (zoo.attention.base: the gated model
    that head pruning trains); after physical pruning every kept gate is 1, so in an export each gate Mul is a
    no-op kernel per attention per step — 12 of a 6-layer decoder step's ~300."""
    graph = model.graph
    shapes = _shapes(model)
    for node in graph.node:
        if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        for ones, other in ((node.input[1], node.input[0]), (node.input[0], node.input[1])):
            value = constant_array(graph, ones)
            shape = shapes.get(other)
            if value is None or shape is None or not np.all(value == 1):
                continue
            if _broadcasts_into(tuple(int(s) for s in value.shape), shape):
                _to_identity(node, other)
                break


def transposed_weights_into_gemm(model: onnx.ModelProto) -> None:
    """MatMul(x, Transpose(W)) with W a 2-D initializer and x 2-D is Gemm(x, W, transB=1): the same products in the
    same order (onnxruntime packs B from W either way).

    Why: the tied output projection is `x @ tgt_embed.weightᵀ`, the table shared with the embedding's Gather, so
    the exporter keeps a Transpose that onnxruntime folds at load into a transposed copy of the table, then packs
    that copy for the MatMul and frees it — both alive at once, 20 MB of the 10k × 512 table, the fp32 decoder's
    load peak (base36 export, one process, load + one sentence: VmHWM 251 → 238 MB; greedy × 1 within noise,
    beam 5 × 32 8% faster; results/runtime/fast_defaults.md). A Transpose read by anything else stays."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    shapes = _shapes(model)
    outputs = {o.name for o in graph.output}
    for node in [n for n in graph.node if n.op_type == "Transpose" and n.domain in ("", "ai.onnx")]:
        weight, name = node.input[0], node.output[0]
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if weight not in inits or len(inits[weight].dims) != 2 or perm != [1, 0] or name in outputs:
            continue
        readers = [n for n in nested_nodes(graph) if name in reads(n)]
        if len(readers) != 1 or readers[0] not in graph.node:
            continue
        matmul = readers[0]
        x = shapes.get(matmul.input[0])
        if matmul.op_type != "MatMul" or list(matmul.input) != [matmul.input[0], name] or x is None or len(x.dim) != 2:
            continue
        gemm = helper.make_node("Gemm", [matmul.input[0], weight], list(matmul.output), name=matmul.name, transB=1)
        graph.node.insert(list(graph.node).index(matmul), gemm)
        graph.node.remove(matmul)
        graph.node.remove(node)


def outputs_from_their_producers(model: onnx.ModelProto) -> None:
    """A graph output that is an Identity of another node's output becomes that node's output itself (renamed,
    its other readers rewired): one copy kernel fewer per output. The rewrites above leave one Identity per
    growing self cache whose new position is also read inside the step (a value the attention weights)."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    for node in list(graph.node):
        if node.op_type != "Identity" or node.output[0] not in outputs:
            continue
        source, name = node.input[0], node.output[0]
        if source in inputs or source in outputs or source not in producer:
            continue  # an input or another output: the Identity is the only way to return it under this name
        origin = producer[source]
        origin.output[:] = [name if o == source else o for o in origin.output]
        for reader in nested_nodes(graph):
            reader.input[:] = [name if i == source else i for i in reader.input]
        graph.node.remove(node)
        producer[name] = origin


def drop_unread(model: onnx.ModelProto) -> None:
    """Remove what the rewrites above left without a reader: pure nodes whose outputs nobody reads (Concats a
    split attention no longer reads, the constants only they read), then unread initializers."""
    graph = model.graph
    pure = ("Concat", "Constant", "Slice", "Identity", "Unsqueeze", "Reshape")
    outputs = {o.name for o in graph.output}
    while True:
        used = {name for node in graph.node for name in reads(node)} | outputs
        dead = [n for n in graph.node if not set(n.output) & used and n.op_type in pure]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {name for node in graph.node for name in reads(node)}
    for init in [i for i in graph.initializer if i.name not in used and i.name not in outputs]:
        graph.initializer.remove(init)


def unread_attention_outputs_dropped(model: onnx.ModelProto) -> None:
    """A fused cross-attention (export/fused_attention.py: a MultiHeadAttention without past inputs) whose present
    key/value nobody reads gets them as unnamed outputs: named, onnxruntime would write them — a copy of the whole
    cross cache every step. A self-attention's stay named though unread: onnxruntime attends to the past only when
    they are asked for."""
    graph = model.graph
    used = {name for node in nested_nodes(graph) for name in reads(node)} | {o.name for o in graph.output}
    for node in graph.node:
        has_past = len(node.input) > 6 and any(node.input[6:8])
        if node.op_type == "MultiHeadAttention" and node.domain == "com.microsoft" and not has_past:
            node.output[:] = [o if o in used or i == 0 else "" for i, o in enumerate(node.output)]
            while node.output and node.output[-1] == "":
                del node.output[-1]


def _moves_only_unit_axes(perm: list[int], dims: list[onnx.TensorShapeProto.Dimension]) -> bool:
    """Whether a Transpose by `perm` keeps its input's memory order: the axes not known to have size 1 stay in
    their order (a size-1 axis may go anywhere without moving a single element)."""
    kept = [axis for axis in perm if not (dims[axis].HasField("dim_value") and dims[axis].dim_value == 1)]
    return kept == sorted(kept)


def layout_preserving_transposes_to_reshapes(model: onnx.ModelProto) -> None:
    """A Transpose that only moves axes of size 1 is a Reshape: the elements stay in memory order, and
    onnxruntime runs a Reshape without copying where it copies for a Transpose.

    An incremental decoder step has one query position, so splitting its [N, 1, H, dh] queries into heads
    ([N, H, 1, dh]), merging the heads back and putting the new key in MatMul's layout are all such
    Transposes: 42 of a 6-layer decoder step's 54, 3.8 of its 112 ms at beam 5 × batch 32 (36.7M model, 2
    AVX2 cores). The Reshape's target shape takes the known sizes, 0 (keep) for an unknown size that stays on
    its axis, and -1 for at most one unknown size that moves; a Transpose needing more is left alone."""
    graph = model.graph
    shapes = _shapes(model)
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            continue
        shape = shapes.get(node.input[0])
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        if shape is None or perm is None or len(perm) != len(shape.dim) or not _moves_only_unit_axes(perm, shape.dim):
            continue
        target: list[int] = []
        for out_axis, in_axis in enumerate(perm):
            dim = shape.dim[in_axis]
            if dim.HasField("dim_value") and dim.dim_value > 0:
                target.append(dim.dim_value)
            elif not dim.HasField("dim_value") and in_axis == out_axis:
                target.append(0)  # Reshape's 0: this axis' size in the input
            elif not dim.HasField("dim_value"):
                target.append(-1)
            else:
                target = []  # a known empty axis: leave the node as it is
                break
        if not target or target.count(-1) > 1:
            continue
        shape_name = f"{node.output[0]}__reshape_shape"
        graph.initializer.append(numpy_helper.from_array(np.array(target, dtype=np.int64), shape_name))
        node.op_type = "Reshape"
        del node.attribute[:]
        node.input.append(shape_name)


def _same_size(a: onnx.TensorShapeProto.Dimension, b: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether two axes are known to have the same size: equal known sizes, or the same named symbolic size."""
    if a.HasField("dim_value") or b.HasField("dim_value"):
        return a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value == b.dim_value
    return bool(a.dim_param) and a.dim_param == b.dim_param


def consecutive_reshapes_merged(model: onnx.ModelProto) -> None:
    """Reshape(Reshape(x, s1), s2) is Reshape(x, s2) when nothing else reads the inner result: a Reshape keeps
    the elements in memory order, so only the last target counts — provided each 0 in it ("this axis' size in
    the input") names an axis whose size x has too.

    Splitting heads ([N, 1, D] → [N, 1, H, dh]) and then moving the single query position
    (layout_preserving_transposes_to_reshapes: [N, 1, H, dh] → [N, H, 1, dh]) are two Reshapes in a row for
    every query, key and value a decoder step projects: 30 of a 6-layer step's 88 Reshape kernels, each a
    launch that costs a few µs of a batch-1 step whatever it moves (nothing)."""
    graph = model.graph
    shapes = _shapes(model)
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in reads(node):
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}

    def plain_reshape(node: onnx.NodeProto) -> bool:
        return (
            node.op_type == "Reshape"
            and node.domain in ("", "ai.onnx")
            and all(a.name != "allowzero" or a.i == 0 for a in node.attribute)
        )

    for node in graph.node:
        if not plain_reshape(node):
            continue  # (checked first: a Constant node has no input to look up)
        inner = producer.get(node.input[0])
        if inner is None or not plain_reshape(inner):
            continue
        middle = inner.output[0]
        target = constant_ints(graph, node.input[1])
        source, between = shapes.get(inner.input[0]), shapes.get(middle)
        if target is None or source is None or between is None or readers.get(middle) != 1 or middle in outputs:
            continue
        zeros = [axis for axis, size in enumerate(target) if size == 0]
        if all(
            axis < len(source.dim) and axis < len(between.dim) and _same_size(source.dim[axis], between.dim[axis])
            for axis in zeros
        ):
            node.input[0] = inner.input[0]
            readers[middle] = 0
