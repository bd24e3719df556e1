"""float16 graphs for GPUs (`python -m export … precision=fp16`): an exported fp32 graph rewritten to compute and
store in float16, with the vocabulary's scores kept in float32.

Why a converter of our own and not onnxruntime.transformers.float16 (which ships with onnxruntime): that one casts
an output kept in float32 (`keep_io_types`) back from float16 when a node kept in float32 produces it, so the
decoder's `log_probs` and `top_log_probs` would be rounded to float16 on the way out (3 significant digits of a
beam score); it appends its casts at the end of the graph (not topologically sorted: onnx.checker refuses it),
and puts the casts a branch of the shortlist decoder's If needs into the outer graph. Here every value gets one
type, a cast is placed right before its first reader (or right after the producer of an output), and the result
must pass onnx's strict type inference and checker.

What the converted graph computes, value by value:
  - every float input is float16: the caches (cross-attention caches into the decoder, the self-attention store
    and running sums), so the host's stores and the device's copies are half the size;
  - every float output is float32 except the caches (encoder cross caches, decoder `next.*`), which are float16:
    `logits`, `log_probs`, `top_log_probs` and `alignment` are what the search does float32 arithmetic on, and
    `memory` is compared with torch;
  - every node computes in float16 except those of `FP32_OPS`, which get float32 inputs (cast where needed) and
    produce float32;
  - float weights (initializers, Constant/ConstantOfShape values, Cast targets) read by float16 nodes are float16,
    finite values beyond ±65504 clamped to it (±inf, the attention masks' fill, stays ±inf).
On the CPU, onnxruntime runs the float16 nodes it has no float16 kernel for in float32, with casts around them
(its CastFloat16Transformer), so a float16 export runs there too, more slowly than its fp32 twin.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.rewrites import graph_and_branches

FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16

# Nodes that compute in float32: the vocabulary's log-probabilities and the k best, the scores the search adds up.
# The logits arrive in float16 from the output projection, are cast once, and are normalised and ranked in float32
# (as fp16 inference engines keep the final softmax): in float16 a log-prob of −7 has a step of 0.004, and ties
# between candidates would be broken by rounding.
# Everything else stays float16, overflow included: LayerNormalization and Softmax because onnxruntime's CUDA kernels
# accumulate float16 in float32 inside; sums (ReduceSum: MHA's score of the new position, MLK's sums over positions,
# MGK's squared distances) because its CUDA reductions do too (a float32 reduction descriptor for float16 data), and
# a sum that fits float16 has terms that fit it; MGK's ReduceLogSumExp because that kernel subtracts the maximum
# before exp. A model whose activations leave float16's ±65504 gets inf/NaN scores on a GPU; the CPU's verification
# need not see it (it computes much of the graph in float32): fp16.provider=cuda verifies with the kernels that serve.
FP32_OPS = frozenset({"LogSoftmax", "TopK"})
HALF_MAX = float(np.finfo(np.float16).max)  # 65504


def _half_array(values: np.ndarray) -> np.ndarray:
    """float32 values as float16: finite ones beyond ±65504 clamped (numpy would make them ±inf), ±inf kept."""
    finite = np.isfinite(values)
    clamped = np.where(finite, np.clip(values, -HALF_MAX, HALF_MAX), values)
    return clamped.astype(np.float16)


def _half_tensor(tensor: TensorProto) -> TensorProto:
    """A float32 TensorProto's float16 twin, same name (other types unchanged)."""
    if tensor.data_type != FLOAT:
        return tensor
    return numpy_helper.from_array(_half_array(numpy_helper.to_array(tensor)), tensor.name)


class _Scope:
    """One graph (the model's, or a branch of an If) while it is converted: its casts by (value, type), visible to
    the branches inside it as outer-scope values are."""

    def __init__(self, graph: onnx.GraphProto, parent: _Scope | None) -> None:
        self.graph = graph
        self.parent = parent
        self.casts: dict[tuple[str, int], str] = {}

    def cast(self, name: str, to: int) -> str | None:
        scope: _Scope | None = self
        while scope is not None:
            if (name, to) in scope.casts:
                return scope.casts[(name, to)]
            scope = scope.parent
        return None


class _Converter:
    def __init__(self, model: onnx.ModelProto, fp32_outputs: Collection[str]) -> None:
        self.model = model
        self.fp32_outputs = set(fp32_outputs)
        inferred = onnx.shape_inference.infer_shapes(model)
        # each value's original element type, in every graph of the model (value names are unique across them)
        self.types: dict[str, int] = {}
        for graph in graph_and_branches(inferred.graph):
            for value in [*graph.input, *graph.output, *graph.value_info]:
                if value.type.HasField("tensor_type"):
                    self.types[value.name] = value.type.tensor_type.elem_type
            for init in graph.initializer:
                self.types[init.name] = init.data_type
        self.now: dict[str, int] = {}  # each float value's type after conversion (as far as decided)
        self.renamed: dict[str, str] = {}  # output name → the name its float16 producer writes before the cast
        self.counter = 0

    def run(self) -> None:
        graph = self.model.graph
        for value in graph.input:
            if self.types.get(value.name) == FLOAT:
                value.type.tensor_type.elem_type = HALF
                self.now[value.name] = HALF
        self._initializers(graph)
        self._convert(graph, None, top=True)
        for value in graph.output:
            if self.types.get(value.name) == FLOAT:
                value.type.tensor_type.elem_type = FLOAT if value.name in self.fp32_outputs else HALF
        self._value_info()

    def _initializers(self, graph: onnx.GraphProto) -> None:
        """Float initializers read by any float16 node become float16 (a float32 reader gets a cast)."""
        readers: dict[str, list[onnx.NodeProto]] = {}
        for g in graph_and_branches(graph):
            for node in g.node:
                for name in node.input:
                    readers.setdefault(name, []).append(node)
        for g in graph_and_branches(graph):
            for i, init in enumerate(g.initializer):
                if init.data_type != FLOAT:
                    continue
                if any(node.op_type not in FP32_OPS for node in readers.get(init.name, [])):
                    g.initializer[i].CopyFrom(_half_tensor(init))
                    self.now[init.name] = HALF
                else:
                    self.now[init.name] = FLOAT

    def _convert(self, graph: onnx.GraphProto, parent: _Scope | None, top: bool = False) -> None:
        scope = _Scope(graph, parent)
        out_types = {o.name: (FLOAT if o.name in self.fp32_outputs else HALF) for o in graph.output} if top else {}
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            node.input[:] = [self.renamed.get(name, name) for name in node.input]
            wanted = FLOAT if node.op_type in FP32_OPS else HALF
            for i, name in enumerate(node.input):
                have = self.now.get(name)
                if name and have is not None and have != wanted:
                    node.input[i] = self._cast(scope, nodes, name, wanted)
            if wanted == HALF:
                self._half_attributes(node)
            produced = [wanted] * len(node.output)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:  # an If's branch: its outputs are the node's
                    self._convert(attribute.g, scope)
                    for j, value in enumerate(attribute.g.output):
                        if value.type.tensor_type.elem_type == FLOAT:
                            value.type.tensor_type.elem_type = produced[j] = self.now.get(value.name, HALF)
            nodes.append(node)
            for j, name in enumerate(node.output):
                if self.types.get(name) != FLOAT:
                    continue
                made = self.now[name] = produced[j]
                if name in out_types and out_types[name] != made:  # an output of the other type: cast after it
                    inner = f"{name}/{'fp16' if made == HALF else 'fp32'}"
                    node.output[j] = inner
                    self.renamed[name] = inner
                    self.now[inner] = made
                    nodes.append(helper.make_node("Cast", [inner], [name], to=out_types[name], name=f"{name}/cast"))
                    self.now[name] = out_types[name]
                    scope.casts[(inner, out_types[name])] = name
        ordered = onnx.GraphProto()
        ordered.node.extend(nodes)  # copies, made before the originals go
        del graph.node[:]
        graph.node.extend(ordered.node)

    def _cast(self, scope: _Scope, nodes: list[onnx.NodeProto], name: str, to: int) -> str:
        """`name` as type `to`: a cast made earlier in this graph or an outer one, else a new one right here."""
        made = scope.cast(name, to)
        if made is not None:
            return made
        self.counter += 1
        cast = f"{name}/as_{'fp32' if to == FLOAT else 'fp16'}"
        nodes.append(helper.make_node("Cast", [name], [cast], to=to, name=f"fp16_cast_{self.counter}"))
        scope.casts[(name, to)] = cast
        self.now[cast] = to
        return cast

    @staticmethod
    def _half_attributes(node: onnx.NodeProto) -> None:
        """A float16 node's float constants and float target type become float16."""
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" and attribute.i == FLOAT:
                attribute.i = HALF
            elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == FLOAT:
                attribute.t.CopyFrom(_half_tensor(attribute.t))
        if node.op_type == "Constant":  # value_float(s): a float32 constant whatever the graph around it
            for attribute in list(node.attribute):
                if attribute.name in ("value_float", "value_floats"):
                    data = [attribute.f] if attribute.name == "value_float" else list(attribute.floats)
                    array = _half_array(np.array(data, dtype=np.float32))
                    node.attribute.remove(attribute)
                    shape = () if attribute.name == "value_float" else array.shape
                    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(array.reshape(shape))))

    def _value_info(self) -> None:
        """value_info entries follow their values' new types; those of renamed values are dropped (onnxruntime
        infers them)."""
        for graph in graph_and_branches(self.model.graph):
            keep = []
            for value in graph.value_info:
                if value.name in self.renamed:
                    continue
                if value.type.tensor_type.elem_type == FLOAT and value.name in self.now:
                    value.type.tensor_type.elem_type = self.now[value.name]
                keep.append(value)
            del graph.value_info[:]
            graph.value_info.extend(keep)


def to_float16(model: onnx.ModelProto, fp32_outputs: Collection[str]) -> None:
    """Convert `model` in place (the module docstring): float16 everywhere but `FP32_OPS` and the float outputs
    named in `fp32_outputs`; checked by onnx's strict type inference and checker."""
    _Converter(model, fp32_outputs).run()
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    onnx.checker.check_model(model)


def float_inputs_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """The numpy dtype name of every float input and output of a graph, by name."""
    return {
        value.name: helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
        for value in [*model.graph.input, *model.graph.output]
        if value.type.tensor_type.elem_type in (FLOAT, HALF)
    }
