"""`export_checkpoint(cfg)`: checkpoint → physically pruned model → encoder.onnx + decoder.onnx +
tokenizer + manifest.json, verified against PyTorch before the directory appears under its name.

Steps (each failure is an ExportError/CheckpointError with a message, never a half-written dir):
 1. load the checkpoint, check its entry and attention key, refuse an existing `out` unless overwrite;
 2. head plan: the checkpoint's own (GHT-PS gates), a JSON file, or gradient importance + budget;
 3. physical pruning (export/pruning.py), rebuilt from its config alone;
 4. discover the decoder cache layout from a torch step, export both graphs with the dynamo exporter
    (`dynamic_shapes`: torch 2.13's legacy exporter bakes shapes, DESIGN.md §6), name weights;
 5. verify fp32 graphs vs torch (export/verify.py); optionally INT8-quantise and report its drift;
 6. manifest.json with checksums, sizes before/after, versions; atomic rename; summary table.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import math
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import onnxruntime
import onnxscript
import sentencepiece
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from onnx import numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from torch.export import Dim

from export.graph import (
    BATCH,
    NEXT,
    PREV_BATCH,
    SRC_LEN,
    STEPS,
    CacheSpec,
    DecoderStepGraph,
    EncoderGraph,
    ExportError,
    concrete_shape,
    decoder_io_names,
    discover_caches,
    encoder_io_names,
)
from export.pruning import (
    active_heads,
    head_importance,
    load_plan,
    plan_from_importance,
    prune,
    validate_plan,
)
from export.runtime import MANIFEST, OPTIMIZATION_LEVELS, RUNTIME_FORMAT, ExportedModel, Search, _sha256
from export.staging import staged_directory
from export.verify import encode_pairs, verify_export
from zoo.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint
from zoo.data import DataError, Tokenizer, build_splits
from zoo.entries import CONF_DIR, list_entries
from zoo.flops import size_summary
from zoo.metrics import corpus_chrf, paired_bootstrap
from zoo.model import ModelConfig, Transformer

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
TOKENIZER_FILE = "tokenizer.model"
HELDOUT_FILE = "heldout.json"  # the held-out sample the export was verified on
MANIFEST_FORMAT = 1
DEFAULT_OPSET = 20  # what torch 2.13's dynamo exporter emits by default; onnxruntime 1.31 runs it


# ---------------------------------------------------------------------------------------------- loading
def _load(cfg: DictConfig) -> tuple[dict[str, Any], Transformer]:
    payload = load_checkpoint(cfg.checkpoint)
    try:
        ModelConfig.from_dict(dict(payload["model_config"]))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{payload['path']} has a model config this code does not understand: {exc}") from exc
    entry = payload.get("entry")
    if entry not in list_entries() and not cfg.name:
        raise ExportError(f"checkpoint {payload['path']} is from entry {entry!r}, which is not a model entry of this "
                          f"code (known: {', '.join(list_entries())}); pass name=<public model name> to export it")
    try:
        model = model_from_checkpoint(payload)
    except RuntimeError as exc:  # state dict does not fit the config
        raise CheckpointError(f"{payload['path']}: weights do not match its model config: {exc}") from exc
    for key in ("tokenizer", "data_config"):
        if key not in payload:
            raise CheckpointError(f"{payload['path']} lacks '{key}'; it was not written by zoo.train")
    return payload, model


def _public_name(cfg: DictConfig, payload: dict[str, Any]) -> str:
    if cfg.name:
        return str(cfg.name)
    data = (payload.get("data_config") or {}).get("name", "data")
    return f"{payload.get('entry')}-{data}" + ("-int8" if cfg.quantize else "")


def _heldout(payload: dict[str, Any], n: int) -> tuple[list[str], list[str]]:
    held = payload.get("heldout") or {}
    src, tgt = list(held.get("src", []))[:n], list(held.get("tgt", []))[:n]
    if not src or len(src) != len(tgt):
        raise CheckpointError(f"{payload['path']} has no held-out sentence pairs (heldout.src/tgt) to verify with")
    return src, tgt


def _plan(cfg: DictConfig, model: Transformer, payload: dict[str, Any], tokenizer: Tokenizer
          ) -> tuple[dict[str, list[int]], str, dict[str, dict[int, float]] | None]:
    """(plan in original head indices, where it came from, importance scores if computed)."""
    if cfg.head_plan and cfg.keep_heads:
        raise ExportError("give either head_plan=<file.json> or keep_heads=<k>, not both")
    if cfg.head_plan:
        return validate_plan(load_plan(cfg.head_plan), model), f"json:{cfg.head_plan}", None
    if cfg.keep_heads:
        imp = cfg.importance
        if imp.source == "heldout":
            srcs, tgts = _heldout(payload, int(imp.sentences))
        elif imp.source == "valid":
            try:
                valid = build_splits(payload["data_config"]).valid[: int(imp.sentences)]
            except DataError as exc:
                raise ExportError(f"importance.source=valid: cannot rebuild the validation split: {exc}") from exc
            srcs, tgts = [e.src for e in valid], [e.tgt for e in valid]
        else:
            raise ExportError(f"importance.source={imp.source!r}: use heldout or valid")
        src_ids, tgt_ids = encode_pairs(tokenizer, srcs, tgts, model.cfg.max_positions, 10**9)
        scores = head_importance(model, list(zip(src_ids, tgt_ids, strict=True)), int(imp.batch_size))
        keep = cfg.keep_heads
        keep = OmegaConf.to_container(keep) if isinstance(keep, DictConfig) else keep
        plan = plan_from_importance(scores, keep)
        budget = json.dumps(keep, sort_keys=True) if isinstance(keep, dict) else keep
        return validate_plan(plan, model), f"importance:{imp.source}:keep_heads={budget}", scores
    return {}, "checkpoint", None


def _quality_pairs(cfg: DictConfig, payload: dict[str, Any], srcs: list[str], tgts: list[str]
                   ) -> tuple[list[str], list[str], str]:
    """(sources, references, split label) the INT8 quality cost is measured on: the checkpoint's test
    split when its corpus can be rebuilt here (`quantize_eval.split=test`), else the held-out sample."""
    q = cfg.quantize_eval
    limit = int(q.sentences) if q.sentences else None
    if q.split == "test":
        try:
            test = build_splits(payload["data_config"]).test[:limit]
        except (DataError, KeyError, OSError) as exc:
            print(f"(int8 quality: the test split cannot be rebuilt here ({exc}); using the held-out sample)")
        else:
            if test:
                return [e.src for e in test], [e.tgt for e in test], f"test ({len(test)} sentences)"
    elif q.split != "heldout":
        raise ExportError(f"quantize_eval.split={q.split!r}: use test or heldout")
    return srcs[:limit], tgts[:limit], f"heldout ({len(srcs[:limit])} sentences)"


def int8_quality(fp32_out: list[str], int8_out: list[str], refs: list[str], split: str,
                 beam_size: int) -> dict[str, Any]:
    """BLEU of the fp32 and INT8 graphs' translations (same runtime, same search) with sacreBLEU's
    paired bootstrap: the quality cost of quantisation, claimed only if significant (DESIGN.md §3c)."""
    test = paired_bootstrap(fp32_out, int8_out, refs)
    return {"split": split, "beam_size": beam_size,
            "bleu_fp32": test["baseline"]["bleu"], "bleu_int8": test["system"]["bleu"],
            "chrf_fp32": corpus_chrf(fp32_out, refs), "chrf_int8": corpus_chrf(int8_out, refs),
            "p_value": test["p_value"], "significant": test["significant"],
            "identical_outputs": sum(a == b for a, b in zip(fp32_out, int8_out, strict=True))}


# ---------------------------------------------------------------------------------------------- ONNX
@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The dynamo exporter prints progress and registry warnings; keep the command's output readable."""
    loggers = [logging.getLogger(n) for n in ("", "torch.onnx", "torch.export", "torch._export", "onnxscript",
                                              "onnx_ir")]  # "": quantize_dynamic logs on the root logger
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
        raise ExportError(f"torch.onnx (dynamo) could not export the {graph} graph of attention mechanism "
                          f"{attention!r}: {reason}") from exc


def _sdpa_translation(opset: int) -> Callable[..., Any]:
    """ONNX for aten.scaled_dot_product_attention as MatMul(q·scale, Transpose(k, [0, 1, 3, 2])).

    Why: torch.onnx's own translation transposes keys through a rank-3 Reshape/Transpose/Reshape,
    which onnxruntime cannot fold into its MatMul (FusedMatMul transB), so every decoder step copied
    every layer's whole key cache — 37% of the step time of a small model at batch 32 × beam 5. A
    last-two-axes Transpose is fused away. Inference only (dropout ignored), no GQA.
    """
    op = getattr(onnxscript, f"opset{opset}")

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
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


@contextlib.contextmanager
def _ort_errors(which: str) -> Iterator[None]:
    """onnxruntime failing to load or run a graph is a failed verification, not a crash."""
    try:
        yield
    except ExportError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "onnxruntime":
            raise
        reason = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"verification failed: onnxruntime cannot run the exported {which} graphs: {reason}") from exc


def _dynamic(spec: CacheSpec, dims: dict[str, Any], prev: bool = False) -> dict[int, Any]:
    out = {}
    for axis, size in enumerate(spec.shape):
        if size == BATCH:
            out[axis] = dims[PREV_BATCH if prev else BATCH]
        elif isinstance(size, str):
            out[axis] = dims[size]
    return out


def _rename(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    for init in graph.initializer:
        init.name = mapping.get(init.name, init.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    for vi in graph.value_info:
        vi.name = mapping.get(vi.name, vi.name)


def _name_weights(model: onnx.ModelProto) -> None:
    """Readable initializer names: drop the wrapper's "model." prefix and name the transposed Linear
    weights the exporter folds into anonymous constants `<module>.weight_t` ([in, out]) after the
    bias their MatMul feeds (so removed heads can be read off the file)."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    mapping = {n: n[len("model."):] for n in inits if n.startswith("model.")}
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1].endswith(".weight"):
            continue
        users = consumers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add":
            continue
        bias = [n for n in users[0].input if n in inits and n.endswith(".bias")]
        if len(bias) == 1 and len(consumers.get(node.input[1], [])) == 1:
            mapping[node.input[1]] = mapping.get(bias[0], bias[0])[: -len(".bias")] + ".weight_t"
    _rename(graph, mapping)


def _finish_graph(path: Path, metadata: dict[str, str]) -> dict[str, int]:
    model = onnx.load(str(path))
    _name_weights(model)
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    # the exporter drops inputs a mechanism never reads (e.g. memory_pad_mask when cross-attention
    # caches masked sums): record the graph's actual I/O
    return {"ir_version": model.ir_version, "opset": opset, "inputs": [i.name for i in model.graph.input],
            "outputs": [o.name for o in model.graph.output]}


def export_graphs(model: Transformer, specs: list[CacheSpec], directory: Path, opset: int | None,
                  metadata: dict[str, str]) -> dict[str, Any]:
    """Write encoder.onnx and decoder.onnx for `model` (eval) with every batch/length axis dynamic."""
    cfg = model.cfg
    # lengths are bounded by the positions table (Transformer._embed checks it: a guard torch.export must
    # see declared, or it reports a constraint violation)
    dims = {BATCH: Dim(BATCH), PREV_BATCH: Dim(PREV_BATCH), SRC_LEN: Dim(SRC_LEN, max=cfg.max_positions),
            STEPS: Dim(STEPS, max=cfg.max_positions)}
    # example sizes: distinct from each other and from 0/1, which torch.export would specialise on
    b, s, prev_b, steps = 3, 7, 5, 2
    src = torch.randint(4, cfg.vocab_size, (b, s)) if cfg.vocab_size > 4 else torch.full((b, s), 3)
    src[0, -2:] = cfg.pad_id
    cross_specs = [c for c in specs if c.kind == "cross"]
    self_specs = [c for c in specs if c.kind == "self"]
    encoder, decoder = EncoderGraph(model, specs).eval(), DecoderStepGraph(model, specs).eval()
    enc_in, enc_out = encoder_io_names(specs)
    dec_in, dec_out = decoder_io_names(specs)
    kwargs = {"dynamo": True, "external_data": False, "opset_version": opset or DEFAULT_OPSET, "verbose": False,
              "custom_translation_table": {
                  torch.ops.aten.scaled_dot_product_attention.default: _sdpa_translation(opset or DEFAULT_OPSET)}}
    with torch.no_grad(), _quiet_exporter():
        with _export_errors("encoder", cfg.attention):
            torch.onnx.export(encoder, (src,), str(directory / ENCODER_FILE), input_names=enc_in,
                              output_names=enc_out, dynamic_shapes=({0: dims[BATCH], 1: dims[SRC_LEN]},), **kwargs)
        outputs = encoder(src)
        caches = (*outputs[2:], *[torch.randn(concrete_shape(c, prev_b, steps)) for c in self_specs])
        # tokens [B, 1], step [1], beam_order [B] into the prev_b rows, topk [1], memory_pad_mask [B, S], *caches
        args = (torch.full((b, 1), cfg.eos_id), torch.tensor([steps]), torch.tensor([4, 0, 2]),
                torch.tensor([min(3, cfg.vocab_size)]), outputs[1], *caches)
        dynamic = ({0: dims[BATCH]}, None, {0: dims[BATCH]}, None, {0: dims[BATCH], 1: dims[SRC_LEN]},
                   (*[_dynamic(c, dims) for c in cross_specs], *[_dynamic(c, dims, prev=True) for c in self_specs]))
        with _export_errors("decoder", cfg.attention):
            torch.onnx.export(decoder, args, str(directory / DECODER_FILE), input_names=dec_in,
                              output_names=dec_out, dynamic_shapes=dynamic, **kwargs)
    info: dict[str, Any] = {"encoder": {"file": ENCODER_FILE}, "decoder": {"file": DECODER_FILE}}
    for key, name in (("encoder", ENCODER_FILE), ("decoder", DECODER_FILE)):
        info[key].update(_finish_graph(directory / name, metadata))
    return info


def _fold_weight_transposes(model: onnx.ModelProto) -> None:
    """Replace Transpose(initializer) by a transposed initializer. The tied output projection is
    `x @ tgt_embed.weightᵀ` with the table shared by the embedding Gather, so the exporter keeps a
    runtime Transpose — which hides that MatMul's weight from quantize_dynamic."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    keep = []
    for node in graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            data = numpy_helper.to_array(inits[node.input[0]]).transpose(perm)
            graph.initializer.append(numpy_helper.from_array(data.copy(), node.output[0]))
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)


def quantize_graphs(directory: Path) -> None:
    """Dynamic INT8 quantisation of MatMul weights in place (activations stay fp32, quantised per call)."""
    for name in (ENCODER_FILE, DECODER_FILE):
        path = directory / name
        model = onnx.load(str(path))
        _fold_weight_transposes(model)
        onnx.save(model, str(path))
        tmp = directory / f"{name}.int8"
        with _quiet_exporter():
            quantize_dynamic(str(path), str(tmp), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- manifest
def _versions() -> dict[str, str]:
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "onnxscript": onnxscript.__version__, "sentencepiece": sentencepiece.__version__,
            "numpy": __import__("numpy").__version__, "python": platform.python_version()}


def _heads(model: Transformer, plan: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, module in model.attention_modules().items():
        out[name] = {"num_heads": module.num_heads, "head_dim": module.head_dim,
                     "kept": plan.get(name, list(range(model.cfg.num_heads)))}
    return out


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- output dir
def _exists_error(out: Path) -> ExportError:
    return ExportError(f"output directory {out} already exists; pass overwrite=true to replace it")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise _exists_error(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"output path {out} exists and is not a directory")


# ---------------------------------------------------------------------------------------------- main
def _as_config(cfg: DictConfig | Mapping[str, Any]) -> DictConfig:
    if isinstance(cfg, DictConfig):
        return cfg
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = compose(config_name="export")
    return OmegaConf.merge(base, OmegaConf.create(dict(cfg)))


def export_checkpoint(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Export one checkpoint (see the module docstring); returns the manifest (+ "out": directory)."""
    cfg = _as_config(cfg)
    if OmegaConf.is_missing(cfg, "checkpoint") or not cfg.checkpoint:
        raise ExportError("no checkpoint given: python -m export checkpoint=<run dir|file.pt> [out=<dir>]")
    if cfg.runtime.graph_optimization_level not in OPTIMIZATION_LEVELS:
        raise ExportError(f"runtime.graph_optimization_level={cfg.runtime.graph_optimization_level!r}: use one of "
                          f"{', '.join(OPTIMIZATION_LEVELS)}")
    previous_threads = torch.get_num_threads()
    if cfg.runtime.threads:
        torch.set_num_threads(int(cfg.runtime.threads))
    try:
        return _export(cfg)
    finally:
        torch.set_num_threads(previous_threads)


def _export(cfg: DictConfig) -> dict[str, Any]:
    threads = cfg.runtime.threads
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[stage] = round(now - clock, 2)
        clock = now

    payload, original = _load(cfg)
    name = _public_name(cfg, payload)
    out = Path(cfg.out) if cfg.out else Path("exports") / name
    _check_out(out, bool(cfg.overwrite))
    tokenizer = Tokenizer.from_bytes(payload["tokenizer"])
    srcs, tgts = _heldout(payload, int(cfg.verify.sentences))
    before = size_summary(original)

    plan, plan_source, scores = _plan(cfg, original, payload, tokenizer)
    pruned, gated = prune(original, plan, remove=bool(cfg.remove_heads))
    final = pruned.cfg.head_plan if cfg.remove_heads else {
        n: h for n, h in active_heads(gated).items() if h != list(range(original.cfg.num_heads))}
    after = size_summary(pruned)
    specs = discover_caches(pruned)
    lap("load_and_prune")
    g = cfg.generation
    search = Search(beam_size=int(g.beam_size), len_penalty=float(g.len_penalty), max_len_a=float(g.max_len_a),
                    max_len_b=int(g.max_len_b), min_len=int(g.min_len))
    entry = str(payload.get("entry"))
    mcfg = pruned.cfg

    out.parent.mkdir(parents=True, exist_ok=True)
    # built beside `out`, swapped in only when verified (export/staging.py); removed on any failure
    with staged_directory(out, overwrite=bool(cfg.overwrite), exists_error=_exists_error) as stage:
        tmp = stage.path
        metadata = {"name": name, "entry": entry, "attention": mcfg.attention,
                    "head_plan": json.dumps(final), "producer": "attention-zoo export"}
        graphs = export_graphs(pruned, specs, tmp, cfg.opset, metadata)
        lap("onnx_export")
        (tmp / TOKENIZER_FILE).write_bytes(tokenizer.model_bytes)
        (tmp / HELDOUT_FILE).write_text(json.dumps({"src": srcs, "tgt": tgts}, indent=1, ensure_ascii=False))
        manifest: dict[str, Any] = {
            "format_version": MANIFEST_FORMAT,
            "runtime_format": RUNTIME_FORMAT,
            "name": name,
            "entry": entry,
            "data": (payload.get("data_config") or {}).get("name"),
            "task": payload.get("task", "translation"),
            "attention": mcfg.attention,
            "attention_options": dict(mcfg.attention_options),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "checkpoint": {"path": payload["path"], "sha256": _sha256(Path(payload["path"]))},
            "head_plan": final,
            "head_plan_source": plan_source,
            "heads_removed": bool(cfg.remove_heads),
            "head_importance": {n: {str(h): v for h, v in s.items()} for n, s in scores.items()} if scores else None,
            "heads": _heads(pruned, final),
            "model_config": mcfg.to_dict(),
            "vocab": {"size": mcfg.vocab_size, "pad_id": mcfg.pad_id, "unk_id": tokenizer.unk_id,
                      "bos_id": mcfg.bos_id, "eos_id": mcfg.eos_id},
            "max_positions": mcfg.max_positions,
            "tokenizer": TOKENIZER_FILE,
            "heldout": HELDOUT_FILE,
            "graphs": graphs,
            "caches": [s.to_dict() for s in specs],
            "next_prefix": NEXT,
            "quantized": bool(cfg.quantize),
            "size": {"before": before, "after": after,
                     "params_ratio": after["params"] / before["params"],
                     "params_excl_emb_ratio": after["params_excl_emb"] / max(before["params_excl_emb"], 1),
                     "flops_ratio": after["flops"] / before["flops"]},
            "generation": {**asdict(search), "max_tokens": int(g.max_tokens), "max_sentences": int(g.max_sentences)},
            "runtime": {"graph_optimization_level": cfg.runtime.graph_optimization_level,
                        "threads": int(threads) if threads else None},
            "versions": _versions(),
        }

        def write() -> None:
            manifest["files"] = {f: _sha256(tmp / f) for f in (ENCODER_FILE, DECODER_FILE, TOKENIZER_FILE,
                                                                HELDOUT_FILE)}
            _write_manifest(tmp, manifest)

        write()
        with _ort_errors("fp32"):
            runtime = ExportedModel(tmp, threads=threads)
            manifest["verification"] = verify_export(runtime, pruned, gated, tokenizer, srcs, tgts, search,
                                                     float(cfg.verify.tolerance), int(cfg.verify.max_target_tokens))
        lap("verify")
        if cfg.quantize:
            eval_src, eval_ref, eval_split = _quality_pairs(cfg, payload, srcs, tgts)
            with _ort_errors("fp32"):
                fp32_out = runtime.translate(eval_src)
            quantize_graphs(tmp)
            write()
            with _ort_errors("int8"):
                runtime = ExportedModel(tmp, threads=threads)
                manifest["verification_int8"] = verify_export(
                    runtime, pruned, gated, tokenizer, srcs, tgts, search, float(cfg.verify.tolerance),
                    int(cfg.verify.max_target_tokens), strict=False)
                int8_out = runtime.translate(eval_src)
            manifest["int8_quality"] = int8_quality(fp32_out, int8_out, eval_ref, eval_split, search.beam_size)
            lap("quantize_and_check")
        del runtime
        manifest["timings_s"] = timings
        write()
        _check_out(out, bool(cfg.overwrite))
        stage.publish()
    manifest["out"] = str(out)
    print(summary_table(manifest, out))
    return manifest


# ---------------------------------------------------------------------------------------------- reporting
def _fmt(n: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def summary_table(m: dict[str, Any], out: Path) -> str:
    """Human-readable export summary: heads per module, sizes before/after, parity, files."""
    lines = [f"exported {m['name']} (entry {m['entry']}, attention {m['attention']}) → {out}"]
    lines.append(f"  {'module':<30} {'heads':>7} {'head_dim':>8}  kept (original head indices)")
    cfg_heads = m["model_config"]["num_heads"]
    for name, h in m["heads"].items():
        lines.append(f"  {name:<30} {h['num_heads']:>3}/{cfg_heads:<3} {h['head_dim']:>8}  {h['kept']}")
    s = m["size"]
    lines.append(f"  {'':<24} {'before':>10} {'after':>10} {'ratio':>7}")
    for label, key, ratio in (("params", "params", "params_ratio"),
                              ("params excl. embeddings", "params_excl_emb", "params_excl_emb_ratio"),
                              (f"FLOPs @ src {s['before']['src_len']}", "flops", "flops_ratio")):
        lines.append(f"  {label:<24} {_fmt(s['before'][key]):>10} {_fmt(s['after'][key]):>10} {s[ratio]:>7.3f}")
    for key, label in (("verification", "fp32"), ("verification_int8", "int8")):
        v = m.get(key)
        if not v:
            continue
        lines.append(
            f"  verify {label}: max|Δlogits| ORT vs torch {v['max_abs_logits_diff']:.2e}, encoder "
            f"{v['max_abs_encoder_diff']:.2e}, cross caches (rel.) {v['max_abs_cross_cache_rel_diff']:.2e}, "
            f"pruned vs gated {v['pruned_vs_gated']:.2e} (tol {v['tolerance']:g}); "
            f"beam {v['beam']['beam_size']} {v['beam']['identical']}/{v['beam']['total']} identical, greedy "
            f"{v['greedy']['identical']}/{v['greedy']['total']}, translate {v['translate_identical']}/{v['sentences']}"
            f"; shapes {[(x['batch'], x['src_len']) for x in v['shapes']]}")
    q = m.get("int8_quality")
    if q:
        lines.append(f"  int8 quality on {q['split']}, beam {q['beam_size']}: BLEU {q['bleu_fp32']:.2f} → "
                     f"{q['bleu_int8']:.2f}, chrF {q['chrf_fp32']:.2f} → {q['chrf_int8']:.2f} (paired bootstrap "
                     f"p={q['p_value']:.3f}: {'significant' if q['significant'] else 'no significant difference'}); "
                     f"{q['identical_outputs']} outputs identical")
    if m.get("timings_s"):
        lines.append("  time: " + ", ".join(f"{k} {v:.1f}s" for k, v in m["timings_s"].items()))
    g = m["graphs"]
    lines.append(f"  opset {g['decoder']['opset']}, IR {g['decoder']['ir_version']}; caches per layer: "
                 + ", ".join(sorted({c['name'].split('.', 1)[1] for c in m['caches']})))
    for name, digest in m["files"].items():
        size = (out / name).stat().st_size if (out / name).exists() else 0
        lines.append(f"  {name:<16} {_fmt(size):>7}B  sha256 {digest[:16]}…")
    return "\n".join(lines)
