"""The exported model as ONNX files: encoder.onnx and decoder.onnx written from the torch wrappers of
export/graph.py with torch's dynamo exporter (every batch/length axis dynamic: torch 2.13's legacy exporter bakes
shapes, zoo/DESIGN.md §6), their weights given readable names, the export's metadata stored in them, and the optional
dynamic INT8 quantisation of their MatMul weights or float16 conversion (export/fp16.py). Every graph file is
written by `save_graph`, its weights apart in `<graph>.data` (ONNX external data).

export/graph.py decides what the graphs compute (torch modules, cache discovery); this module turns them into files.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import onnxscript
import torch
from onnx import numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from torch.export import Dim

from export.fp16 import float_inputs_outputs, to_float16
from export.fused_attention import fused_decoder_steps
from export.graph import (
    BATCH,
    CANDIDATES,
    CELLS,
    SOURCES,
    SRC_LEN,
    STEPS,
    CacheSpec,
    DecoderStepGraph,
    EncoderGraph,
    ExportError,
    ShortlistStepGraph,
    cell_split,
    concrete_shape,
    decoder_io_names,
    encoder_io_names,
    store_shape,
)
from export.rewrites import (
    consecutive_reshapes_merged,
    drop_multiplications_by_one,
    drop_unread,
    graph_and_branches,
    layout_preserving_transposes_to_reshapes,
    nested_nodes,
    new_positions_from_concat,
    outputs_from_their_producers,
    reads,
    transposed_weights_into_gemm,
    unread_attention_outputs_dropped,
)
from export.runtime import GraphInfo, Graphs
from export.self_attention_by_rows import FUSED_MOST_ROWS, self_attention_by_rows
from zoo.model import Transformer

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
DEFAULT_OPSET = 20  # what torch 2.13's dynamo exporter emits by default; onnxruntime 1.31 runs it
DATA_SUFFIX = ".data"  # a graph's weights: encoder.onnx → encoder.onnx.data (EXPORT_FILES names both)
APART_MIN_BYTES = 1024  # smaller tensors (shapes, scalars, a layer's norm) stay in the graph: onnx's own threshold


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The dynamo exporter prints progress and registry warnings; keep the command's output readable."""
    loggers = [
        logging.getLogger(n) for n in ("", "torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir")
    ]  # "": quantize_dynamic logs on the root logger
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def _export_errors(graph: str, attention: str) -> Iterator[None]:
    """torch.onnx's failures are pages long; keep their summary and point at the mechanism."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        summary = text.split("## Exception summary", 1)[-1].strip().splitlines()
        reason = next((line for line in summary if line.strip()), type(exc).__name__)
        raise ExportError(
            f"torch.onnx (dynamo) could not export the {graph} graph of attention mechanism {attention!r}: {reason}"
        ) from exc


def _sdpa_translation(opset: int) -> Callable[..., Any]:
    """ONNX for aten.scaled_dot_product_attention as MatMul(q·scale, Transpose(k, [0, 1, 3, 2])).

    Why: torch.onnx's own translation transposes keys through a rank-3 Reshape/Transpose/Reshape,
    which onnxruntime cannot fold into its MatMul (FusedMatMul transB), so every decoder step copied
    every layer's whole key cache — 37% of the step time of a small model at batch 32 × beam 5. A
    last-two-axes Transpose is fused away. Inference only (dropout ignored), no GQA.
    """
    op = getattr(onnxscript, f"opset{opset}")

    def sdpa(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        # query [B, H, T, dh], key/value [B, H, S, dh], attn_mask bool (True = attend) or additive float
        if enable_gqa:
            raise NotImplementedError("grouped-query attention is not exported")
        factor = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        scores = op.MatMul(op.Mul(query, op.Constant(value_float=factor)), op.Transpose(key, perm=[0, 1, 3, 2]))
        neg_inf = op.Constant(value_float=float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == ir.DataType.BOOL:
                scores = op.Where(attn_mask, scores, neg_inf)
            else:
                scores = op.Add(scores, attn_mask)
        if is_causal:  # [T, S] lower triangle, keys aligned to the end
            t, s = op.Shape(query, start=-2, end=-1), op.Shape(key, start=-2, end=-1)
            ones = op.ConstantOfShape(op.Concat(t, s, axis=0), value=ir.tensor([1.0], dtype=ir.DataType.FLOAT))
            tri = op.Trilu(ones, op.Squeeze(op.Sub(s, t)), upper=0)
            scores = op.Where(op.Cast(tri, to=ir.DataType.BOOL), scores, neg_inf)
        return op.MatMul(op.Softmax(scores, axis=-1), value)  # [B, H, T, dh]

    return sdpa


def _dynamic(spec: CacheSpec, dims: dict[str, Any]) -> dict[int, Any]:
    """The dynamic axes of a cache input. A growing self cache's store has one, its rows: cells·a, so stores
    whose cells hold different numbers a of rows (MGK's key sets, pruned layers' head counts) get their own."""
    if spec.kind == "self" and spec.position_axis is not None:
        a, _ = cell_split(spec)
        name = f"{CELLS}_x{a}"
        if name not in dims:
            dims[name] = Dim(name)
        return {0: dims[name]}
    return {axis: dims[size] for axis, size in enumerate(spec.shape) if isinstance(size, str)}


def _rename(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    for init in graph.initializer:
        init.name = mapping.get(init.name, init.name)
    for node in nested_nodes(graph):
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    for vi in graph.value_info:
        vi.name = mapping.get(vi.name, vi.name)


def _name_weights(model: onnx.ModelProto) -> None:
    """Readable initializer names: drop the wrapper's "model." prefix and name the transposed Linear
    weights the exporter folds into anonymous constants `<module>.weight_t` ([in, out]) after the
    bias their MatMul feeds (so removed heads can be read off the file). The exporter stores equal constants once,
    so biases that are all zeros (a random-init or converted model's) feed several MatMuls' Adds: the first of
    them gets the name, the others keep their anonymous ones (initializer names must stay unique)."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in reads(node):
            consumers.setdefault(name, []).append(node)
    mapping = {n: n[len("model.") :] for n in inits if n.startswith("model.")}
    taken = (inits - set(mapping)) | set(mapping.values())
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1].endswith(".weight"):
            continue
        users = consumers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add":
            continue
        bias = [n for n in users[0].input if n in inits and n.endswith(".bias")]
        if len(bias) == 1 and len(consumers.get(node.input[1], [])) == 1:
            name = mapping.get(bias[0], bias[0])[: -len(".bias")] + ".weight_t"
            if name not in taken:
                mapping[node.input[1]] = name
                taken.add(name)
    _rename(graph, mapping)


def _finish_graph(path: Path, metadata: dict[str, str]) -> GraphInfo:
    """Readable weight names, the exact rewrites of export/rewrites.py, the fused self-attention chosen by rows
    (export/self_attention_by_rows.py), the export's metadata written into the graph file; its manifest entry."""
    model = onnx.load(str(path))
    _name_weights(model)
    new_positions_from_concat(model)
    drop_multiplications_by_one(model)
    transposed_weights_into_gemm(model)
    outputs_from_their_producers(model)
    layout_preserving_transposes_to_reshapes(model)
    consecutive_reshapes_merged(model)
    drop_unread(model)
    unread_attention_outputs_dropped(model)
    by_rows = self_attention_by_rows(model)  # last: it moves the fused self-attention nodes into If branches
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    save_graph(model, path)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    # the exporter drops inputs a mechanism never reads (e.g. memory_pad_mask when cross-attention
    # caches masked sums): record the graph's actual I/O
    info = GraphInfo(
        file=path.name,
        data=data_file(path.name),
        ir_version=model.ir_version,
        opset=opset,
        inputs=[i.name for i in model.graph.input],
        outputs=[o.name for o in model.graph.output],
    )
    if by_rows:
        info["self_attention_kernel_rows"] = FUSED_MOST_ROWS
    return info


def data_file(graph_file: str) -> str:
    """The file of a graph's weights, beside it."""
    return graph_file + DATA_SUFFIX


def save_graph(model: onnx.ModelProto, path: Path) -> None:
    """`model` to `path` with its weights apart in `data_file(path)`: onnxruntime then reads each weight straight
    into the buffer it keeps, where a graph that holds them is parsed whole first, both copies alive at once — the
    decoder's load was the batch-1 peak (fp32 base36, one process: 298 → 251 MB; INT8 142 → 118 MB;
    results/runtime/fast_defaults.md). The weights are written afresh (onnx appends to a data file that exists), as
    readable as the graph (onnx makes its data files private to their owner), and there though empty when no weight
    reaches APART_MIN_BYTES (the manifest lists every graph's data file)."""
    data = path.with_name(data_file(path.name))
    data.unlink(missing_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=APART_MIN_BYTES,
    )
    data.touch()
    data.chmod(path.stat().st_mode & 0o777)


def export_graphs(
    model: Transformer,
    specs: list[CacheSpec],
    directory: Path,
    opset: int | None,
    metadata: dict[str, str],
    shortlist: bool = False,
    alignment_layer: int | None = None,
    fused_attention: str = "none",
) -> Graphs:
    """Write encoder.onnx and decoder.onnx for `model` (eval) with every batch/length axis dynamic — with
    `shortlist`, a decoder that takes a vocabulary shortlist, with `alignment_layer`, one whose `alignment` output
    is that layer's cross-attention (export/graph.py), with `fused_attention` "cross" or "all" the decoder step's
    cross-attention (or every) mha module as onnxruntime's fused kernel (export/fused_attention.py) — and return
    their manifest entries (file, IR version, opset, actual inputs and outputs)."""
    cfg = model.cfg
    # lengths are bounded by the positions table (Transformer._embed checks it: a guard torch.export must
    # see declared, or it reports a constraint violation)
    dims = {
        BATCH: Dim(BATCH),
        SOURCES: Dim(SOURCES),
        SRC_LEN: Dim(SRC_LEN, max=cfg.max_positions),
        STEPS: Dim(STEPS, max=cfg.max_positions),
    }
    # example sizes: distinct from each other and from 0/1, which torch.export would specialise on; the decoder
    # gets rows = 2 beams × b sources
    b, s, slots, steps, beams = 3, 7, 11, 2, 2
    src = torch.randint(4, cfg.source_vocab, (b, s)) if cfg.source_vocab > 4 else torch.full((b, s), 3)
    src[0, -2:] = cfg.pad_id
    cross_specs = [c for c in specs if c.kind == "cross"]
    self_specs = [c for c in specs if c.kind == "self"]
    encoder = EncoderGraph(model, specs).eval()
    decoder = (ShortlistStepGraph if shortlist else DecoderStepGraph)(model, specs, alignment_layer).eval()
    enc_in, enc_out = encoder_io_names(specs)
    dec_in, dec_out = decoder_io_names(specs, shortlist, alignment_layer is not None)
    kwargs = {
        "dynamo": True,
        "external_data": False,
        "opset_version": opset or DEFAULT_OPSET,
        "verbose": False,
        "custom_translation_table": {
            torch.ops.aten.scaled_dot_product_attention.default: _sdpa_translation(opset or DEFAULT_OPSET)
        },
    }
    with torch.no_grad(), _quiet_exporter():
        with _export_errors("encoder", cfg.attention):
            torch.onnx.export(
                encoder,
                (src,),
                str(directory / ENCODER_FILE),
                input_names=enc_in,
                output_names=enc_out,
                dynamic_shapes=({0: dims[BATCH], 1: dims[SRC_LEN]},),
                **kwargs,
            )
        outputs = encoder(src)
        rows = beams * b
        # self: growing caches as stores of steps × slots cells (slots ≥ rows: hypotheses that left keep theirs),
        # running sums one row per hypothesis; history: row i's cell at each earlier position
        stores = [
            torch.randn(store_shape(c, steps * slots) if c.position_axis is not None else concrete_shape(c, rows))
            for c in self_specs
        ]
        history = torch.arange(steps)[None, :] * slots + torch.tensor([4, 0, 2, 1, 3, 4])[:, None]  # [rows, steps]
        # tokens [N, 1] (N = beams × b rows), step [1], history [N, steps], topk [1],
        # memory_pad_mask [b, S], *caches (cross: b rows, one per source; self: stores / rows)
        args = (
            torch.full((rows, 1), cfg.eos_id),
            torch.tensor([steps]),
            history,
            torch.tensor([min(3, cfg.vocab_size)]),
            *([torch.arange(min(4, cfg.vocab_size))] if shortlist else []),  # C token ids; the graph takes C = 0 too
            outputs[1],
            *outputs[2:],
            *stores,
        )
        dynamic = (
            {0: dims[BATCH]},
            None,
            {0: dims[BATCH], 1: dims[STEPS]},
            None,
            *([{0: Dim(CANDIDATES, min=0, max=cfg.vocab_size)}] if shortlist else []),
            {0: dims[SOURCES], 1: dims[SRC_LEN]},
            (*[_dynamic(c, dims) for c in cross_specs], *[_dynamic(c, dims) for c in self_specs]),
        )
        fused = contextlib.nullcontext() if fused_attention == "none" else fused_decoder_steps(model, fused_attention)
        with _export_errors("decoder", cfg.attention), fused:
            torch.onnx.export(
                decoder,
                args,
                str(directory / DECODER_FILE),
                input_names=dec_in,
                output_names=dec_out,
                dynamic_shapes=dynamic,
                **kwargs,
            )
    return Graphs(
        encoder=_finish_graph(directory / ENCODER_FILE, metadata),
        decoder=_finish_graph(directory / DECODER_FILE, metadata),
    )


def _weights_as_matmul_operands(model: onnx.ModelProto) -> None:
    """Every weight a MatMul reads transposed becomes an initializer it reads as it is, which is what
    quantize_dynamic quantises: a Transpose(initializer) becomes a transposed initializer, and a Gemm(x, W,
    transB=1) without bias (the fp32 graphs' tied output projection, `transposed_weights_into_gemm`) becomes
    MatMul(x, Wᵀ) — quantize_dynamic quantises MatMul, not Gemm. Inside control-flow branches too (a shortlist
    decoder's If holds the projection): the transposed copy becomes an initializer of the graph, which the branch
    reads by name."""
    inits = {i.name: i for i in model.graph.initializer}
    for graph in reversed(graph_and_branches(model.graph)):  # innermost first: no branch is moved while held
        for node in [n for n in graph.node if n.op_type == "Gemm" and len(n.input) == 2 and n.input[1] in inits]:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            transposed = f"{node.input[1]}_t"
            if attrs != {"transB": 1} or transposed in inits:
                continue
            data = numpy_helper.to_array(inits[node.input[1]]).T
            model.graph.initializer.append(numpy_helper.from_array(data.copy(), transposed))
            inits[transposed] = model.graph.initializer[-1]
            matmul = onnx.helper.make_node("MatMul", [node.input[0], transposed], list(node.output), name=node.name)
            graph.node.insert(list(graph.node).index(node), matmul)
            graph.node.remove(node)
        for node in [n for n in graph.node if n.op_type == "Transpose" and n.input[0] in inits]:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            data = numpy_helper.to_array(inits[node.input[0]]).transpose(perm)
            model.graph.initializer.append(numpy_helper.from_array(data.copy(), node.output[0]))
            graph.node.remove(node)
            # a value a branch still describes as its own is not a weight to quantize_dynamic
            for info in [v for v in graph.value_info if v.name == node.output[0]]:
                graph.value_info.remove(info)


def quantize_graphs(directory: Path) -> None:
    """Dynamic INT8 quantisation in place of MatMul weights (activations stay fp32, quantised per call) and of the
    embedding and positions tables read by Gather (rows dequantised as they are read): the fp32 tables were a
    quarter of an INT8 export's memory. On the 36.7M model, peak RSS at beam 5 × batch 32 350 → 325 MB, speed within
    1–3%; on a trained transformer_4head the test BLEU of INT8 against fp32 was 12.35 with the tables quantised,
    12.37 without (fp32 12.34, neither difference significant). Inside the shortlist decoder's If too
    (EnableSubgraph): its full branch holds the output projection."""
    for name in (ENCODER_FILE, DECODER_FILE):
        path = directory / name
        model = onnx.load(str(path))
        _weights_as_matmul_operands(model)
        save_graph(model, path)
        tmp = directory / f"{name}.int8"
        with _quiet_exporter():
            quantize_dynamic(
                str(path),
                str(tmp),
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gather"],
                extra_options={"EnableSubgraph": True},
            )
        save_graph(onnx.load(str(tmp)), path)
        tmp.unlink()


# the float outputs that stay float32 in a float16 export: what the search computes with (and `memory`, which
# verification compares with torch); every other float input and output — the caches — becomes float16
FP32_OUTPUTS = {ENCODER_FILE: ("memory",), DECODER_FILE: ("logits", "log_probs", "top_log_probs", "alignment")}


def half_graphs(directory: Path) -> dict[str, str]:
    """float16 graphs in place of the fp32 ones (export/fp16.py: weights, activations and caches in float16, the
    vocabulary's log-softmax and top-k and the outputs in FP32_OUTPUTS in float32); the numpy dtype of every float
    input and output of the two graphs, by name (the caches' dtypes for the manifest)."""
    dtypes: dict[str, str] = {}
    for name, keep in FP32_OUTPUTS.items():
        path = directory / name
        model = onnx.load(str(path))
        to_float16(model, keep)
        save_graph(model, path)
        dtypes.update(float_inputs_outputs(model))
    return dtypes
