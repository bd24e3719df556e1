"""`export_checkpoint(cfg)`: checkpoint → physically pruned model → encoder.onnx + decoder.onnx + tokenizer +
manifest.json, verified against PyTorch before the directory appears under its name.

`_export` reads as its steps; each failure is an ExportError/CheckpointError with a message, never a half-written
directory:
  load      the checkpoint, its entry, tokenizer and held-out pairs; refuse an existing `out` unless overwrite
  plan      the head plan: the checkpoint's own (GHT-PS gates), a JSON file, or gradient importance + budget
  prune     physical pruning (export/pruning.py), rebuilt from its config alone; the decoder's cache layout and
            the layer whose cross-attention gives word alignments (none for mechanisms without weights)
  stage     a temporary directory beside `out` (export/staging.py)
  graphs    encoder.onnx + decoder.onnx by the dynamo exporter (export/onnx_files.py), tokenizer, held-out sample
  manifest  the steps' results as one ExportSpec, validated, → manifest.json with checksums, sizes before/after,
            versions (export/manifest.py; its keys and types: export.runtime.Manifest)
  verify    the fp32 graphs against torch (export/verify.py)
  int8      optionally: INT8-quantise, verify without failing on drift, measure the BLEU cost (export/precision.py)
  fp16      optionally: convert to float16 (export/fp16.py), verify against the fp32 model within fp16.tolerance
            and fp16.min_agreement, on the CPU or, with fp16.provider=cuda, where it will run (export/precision.py)
  publish   swap the directory in as `out`, print the summary table
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from export.fused_attention import FUSED_CHOICES
from export.graph import CacheSpec, ExportError, discover_caches
from export.manifest import (
    HELDOUT_FILE,
    TOKENIZER_FILE,
    ExportSpec,
    build_manifest,
    manifest_dict,
    summary_table,
    write_manifest,
)
from export.onnx_files import export_graphs
from export.precision import CheckGraphs, check_precision, half_precision_export, quantize_export
from export.pruning import (
    active_heads,
    head_importance,
    load_plan,
    plan_from_importance,
    prune,
    validate_plan,
)
from export.runtime import (
    ALIGNMENT_OUTPUT,
    OPTIMIZATION_LEVELS,
    AlignmentInfo,
    ExportedModel,
    Graphs,
    Search,
    SearchError,
    load,
)
from export.runtime.manifest import ShortlistInfo
from export.runtime.search_loop import never_emitted
from export.runtime.shortlist import SHORTLIST_FILE
from export.shortlist import ShortlistSettings, build_shortlist, count_pairs
from export.staging import staged_directory
from export.verify import encode_pairs, ort_errors, verify_export
from zoo.api import checkpoint_search
from zoo.checkpoint import CheckpointError, CheckpointPayload, load_checkpoint, model_from_checkpoint
from zoo.data import DataError, TextTokenizer, build_splits, load_tokenizer
from zoo.decoding.alignment import check_alignments
from zoo.entries import CONF_DIR, list_entries
from zoo.flops import size_summary
from zoo.model import ModelConfig, Transformer

log = logging.getLogger("export")


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
        raise ExportError(
            f"runtime.graph_optimization_level={cfg.runtime.graph_optimization_level!r}: use one of "
            f"{', '.join(OPTIMIZATION_LEVELS)}"
        )
    if cfg.fused_attention not in FUSED_CHOICES:
        raise ExportError(
            f"fused_attention={cfg.fused_attention!r}: use one of {', '.join(FUSED_CHOICES)} (which decoder attentions "
            "run as onnxruntime's fused kernel)"
        )
    check_precision(cfg)
    previous_threads = torch.get_num_threads()
    if cfg.runtime.threads:
        torch.set_num_threads(int(cfg.runtime.threads))
    try:
        return _export(cfg)
    finally:
        torch.set_num_threads(previous_threads)


def _export(cfg: DictConfig) -> dict[str, Any]:
    laps = _Laps()
    source = _load_source(cfg)
    shortlist_pairs = _shortlist_pairs(cfg, source.payload) if cfg.shortlist.build else None  # fail before work
    plan = _plan(cfg, source.model, source.payload, source.tokenizer)
    exported = _prune(cfg, source, plan)
    laps("load_and_prune")
    search = search_settings(cfg, source.payload)
    source.out.parent.mkdir(parents=True, exist_ok=True)
    # built beside `out`, swapped in only when verified (export/staging.py); removed on any failure
    with staged_directory(source.out, overwrite=bool(cfg.overwrite), exists_error=_exists_error) as stage:
        directory = stage.path
        metadata = _graph_metadata(source, exported)
        graphs = export_graphs(
            exported.model,
            exported.caches,
            directory,
            cfg.opset,
            metadata,
            bool(shortlist_pairs),
            exported.alignment["layer"],
            fused_attention=str(cfg.fused_attention),
        )
        laps("onnx_export")
        _write_tokenizer_and_heldout(directory, source)
        shortlist = _write_shortlist(cfg, directory, source, shortlist_pairs) if shortlist_pairs else None
        manifest = build_manifest(directory, _spec(cfg, source, plan, exported, graphs, search))
        if shortlist is not None:
            manifest["shortlist"] = shortlist
        write_manifest(directory, manifest)  # the runtime loads (and checks) the export through it
        with ort_errors("fp32"):
            fp32 = load(directory, threads=cfg.runtime.threads)
            manifest["verification"] = _verify(cfg, fp32, exported, source, search)
        laps("verify")
        check = _lenient_check(cfg, exported, source, search)  # for graphs that replace fp32's (precision.py)
        if cfg.quantize:
            heldout = (source.srcs, source.tgts)
            quantize_export(cfg, directory, manifest, fp32, check, source.payload, heldout, search.beam_size)
            laps("quantize_and_check")
        if cfg.precision == "fp16":
            half_precision_export(cfg, directory, manifest, check)
            laps("fp16_and_check")
        del fp32
        manifest["timings_s"] = laps.timings
        write_manifest(directory, manifest)
        _check_out(source.out, bool(cfg.overwrite))
        stage.publish()
    result = {**manifest_dict(manifest), "out": str(source.out)}
    print(summary_table(result, source.out))
    return result


# ---------------------------------------------------------------------------------------------- the steps' results
@dataclass
class _Source:
    """What the export is made from (the load step)."""

    payload: CheckpointPayload  # the checkpoint
    model: Transformer  # as trained (a GHT-PS model with its pruned heads gated off)
    name: str  # public model name
    out: Path
    tokenizer: TextTokenizer
    srcs: list[str]  # the held-out pairs the export is verified on
    tgts: list[str]
    size: dict[str, Any]  # size_summary of `model`


@dataclass
class _HeadPlan:
    heads: dict[str, list[int]]  # module → kept original head indices; {} = the checkpoint's own plan
    source: str  # where it came from (manifest head_plan_source)
    importance: dict[str, dict[int, float]] | None  # the scores, when computed


@dataclass
class _Exported:
    """The model that goes into the graphs (the prune step)."""

    model: Transformer  # heads removed physically (or only gated, remove_heads=false)
    gated: Transformer  # the plan as gates on the full model: what `model` must equal
    plan: dict[str, list[int]]  # the head plan it realises (manifest head_plan)
    size: dict[str, Any]
    caches: list[CacheSpec]  # the decoder's cache layout, discovered from a torch step
    alignment: AlignmentInfo  # the decoder layer and heads of the `alignment` output, or why there is none


class _Laps:
    """Seconds spent in each stage of the export (manifest timings_s)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._clock = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(now - self._clock, 2)
        self._clock = now


# ---------------------------------------------------------------------------------------------- load
def _load_source(cfg: DictConfig) -> _Source:
    payload, model = _load(cfg)
    name = _public_name(cfg, payload)
    out = Path(cfg.out) if cfg.out else Path("exports") / name
    _check_out(out, bool(cfg.overwrite))
    tokenizer = load_tokenizer(payload["tokenizer"])
    srcs, tgts = _heldout(payload, int(cfg.verify.sentences))
    return _Source(payload, model, name, out, tokenizer, srcs, tgts, size_summary(model))


def _load(cfg: DictConfig) -> tuple[CheckpointPayload, Transformer]:
    payload = load_checkpoint(cfg.checkpoint)
    try:
        ModelConfig.from_dict(dict(payload["model_config"]))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{payload['path']} has a model config this code does not understand: {exc}") from exc
    entry = payload.get("entry")
    # a converted pretrained model (zoo.convert) is its own entry: its name is the one the user gave it
    if entry not in list_entries() and not cfg.name and "converted_from" not in payload:
        raise ExportError(
            f"checkpoint {payload['path']} is from entry {entry!r}, which is not a model entry of this "
            f"code (known: {', '.join(list_entries())}); pass name=<public model name> to export it"
        )
    try:
        model = model_from_checkpoint(payload)
    except RuntimeError as exc:  # state dict does not fit the config
        raise CheckpointError(f"{payload['path']}: weights do not match its model config: {exc}") from exc
    return payload, model


def _public_name(cfg: DictConfig, payload: CheckpointPayload) -> str:
    if cfg.name:
        return str(cfg.name)
    data = (payload.get("data_config") or {}).get("name", "data")
    return (
        f"{payload.get('entry')}-{data}"
        + ("-int8" if cfg.quantize else "")
        + ("-fp16" if cfg.precision == "fp16" else "")
    )


def _heldout(payload: CheckpointPayload, n: int) -> tuple[list[str], list[str]]:
    held = payload.get("heldout") or {}
    src, tgt = list(held.get("src", []))[:n], list(held.get("tgt", []))[:n]
    if not src or len(src) != len(tgt):
        fix = (
            "convert it again with --heldout SRC TGT"
            if "converted_from" in payload
            else "it was not written by zoo.train"
        )
        raise CheckpointError(
            f"{payload['path']} has no held-out sentence pairs (heldout.src/tgt) to verify with; {fix}"
        )
    return src, tgt


def _exists_error(out: Path) -> ExportError:
    return ExportError(f"output directory {out} already exists; pass overwrite=true to replace it")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise _exists_error(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"output path {out} exists and is not a directory")


# ---------------------------------------------------------------------------------------------- plan
def _plan(cfg: DictConfig, model: Transformer, payload: CheckpointPayload, tokenizer: TextTokenizer) -> _HeadPlan:
    """The head plan in original head indices, where it came from, and the importance scores if computed."""
    if cfg.head_plan and cfg.keep_heads:
        raise ExportError("give either head_plan=<file.json> or keep_heads=<k>, not both")
    if cfg.head_plan:
        return _HeadPlan(validate_plan(load_plan(cfg.head_plan), model), f"json:{cfg.head_plan}", None)
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
        return _HeadPlan(validate_plan(plan, model), f"importance:{imp.source}:keep_heads={budget}", scores)
    return _HeadPlan({}, "checkpoint", None)


# ---------------------------------------------------------------------------------------------- prune
def _prune(cfg: DictConfig, source: _Source, plan: _HeadPlan) -> _Exported:
    original = source.model
    pruned, gated = prune(original, plan.heads, remove=bool(cfg.remove_heads))
    final = (
        pruned.cfg.head_plan
        if cfg.remove_heads
        else {n: h for n, h in active_heads(gated).items() if h != list(range(original.cfg.num_heads))}
    )
    size = size_summary(pruned)
    return _Exported(pruned, gated, final, size, discover_caches(pruned), _alignment(cfg, pruned, final))


def _alignment(cfg: DictConfig, model: Transformer, plan: dict[str, list[int]]) -> AlignmentInfo:
    """The decoder layer whose head-averaged cross-attention becomes the `alignment` output (`alignment_layer`,
    default the penultimate: zoo/decoding/alignment.py) and the heads it averages; for a mechanism without weights per
    source
    position (linear, MLK), no output and why."""
    reason = model.decoder.layers[0].cross_attn.no_step_weights
    if reason:
        return AlignmentInfo(output=None, layer=None, heads=[], reason=f"attention {model.cfg.attention!r}: {reason}")
    try:
        layer = check_alignments(model, cfg.get("alignment_layer"))
    except SearchError as exc:
        raise ExportError(str(exc)) from None
    heads = plan.get(f"decoder.layers.{layer}.cross_attn", list(range(model.cfg.num_heads)))
    return AlignmentInfo(output=ALIGNMENT_OUTPUT, layer=layer, heads=list(heads), reason=None)


def search_settings(cfg: DictConfig, payload: CheckpointPayload) -> Search:
    """The search settings of the export (its manifest's defaults, and what verification runs in both engines):
    zoo.api.checkpoint_search's rule, the one zoo.load follows — what the command line gives, else the checkpoint's
    own, else the task's, else Search's defaults."""
    if payload.get("task") == "summarization" and not payload.get("target_lengths"):
        defaults = Search()
        log.warning(
            "this summarizer's checkpoint predates stored summary lengths: the manifest keeps translation's "
            f"length defaults ({defaults.max_len_a} · source + {defaults.max_len_b}); give generation.max_len_a=0 "
            "generation.max_len_b=<pieces>"
        )
    return checkpoint_search(payload, cfg.generation)


# ---------------------------------------------------------------------------------------------- graphs
def _graph_metadata(source: _Source, exported: _Exported) -> dict[str, str]:
    """Stored in both ONNX files, so a graph found alone still says what it is."""
    return {
        "name": source.name,
        "entry": str(source.payload.get("entry")),
        "attention": exported.model.cfg.attention,
        "head_plan": json.dumps(exported.plan),
        "max_positions": str(exported.model.cfg.max_positions),  # the position table: the runtime checks against it
        "producer": "attention-zoo export",
    }


def _write_tokenizer_and_heldout(directory: Path, source: _Source) -> None:
    (directory / TOKENIZER_FILE).write_bytes(source.tokenizer.to_bytes())
    (directory / HELDOUT_FILE).write_text(
        json.dumps({"src": source.srcs, "tgt": source.tgts}, indent=1, ensure_ascii=False)
    )


def _shortlist_pairs(cfg: DictConfig, payload: CheckpointPayload) -> tuple[list[str], list[str], str]:
    """(sources, targets, what they are) a shortlist is counted on: shortlist.src/tgt, else the checkpoint's
    training split (its corpus rebuilt here)."""
    vocab = payload["model_config"]
    if vocab.get("source_vocab_size") not in (None, vocab["vocab_size"]):  # source ids index the target's table
        raise ExportError(
            f"shortlist.build=true needs one vocabulary for sources and targets; this model has separate ones "
            f"(source {vocab['source_vocab_size']:,}, target {vocab['vocab_size']:,} ids): export without a shortlist"
        )
    given = cfg.shortlist.src, cfg.shortlist.tgt
    if any(given):
        if not all(given):
            raise ExportError("shortlist.src and shortlist.tgt go together: give both parallel files, or neither")
        try:
            src, tgt = (Path(p).read_text(encoding="utf-8").splitlines() for p in given)
        except (OSError, UnicodeDecodeError) as exc:
            raise ExportError(f"cannot read the shortlist's parallel text: {exc}") from exc
        if len(src) != len(tgt) or not src:
            raise ExportError(
                f"shortlist.src has {len(src)} lines, shortlist.tgt {len(tgt)}: give equal, non-empty files"
            )
        return src, tgt, f"{Path(given[0]).name} / {Path(given[1]).name}"
    try:
        train = build_splits(payload["data_config"]).train
    except (DataError, KeyError, OSError) as exc:
        raise ExportError(
            f"shortlist.build=true needs the checkpoint's training split, which cannot be rebuilt here ({exc}); "
            "give parallel text with shortlist.src=… shortlist.tgt=…, or export without a shortlist"
        ) from exc
    if not train:
        raise ExportError("shortlist.build=true: the checkpoint's training split is empty; give shortlist.src/tgt")
    name = payload["data_config"].get("name", "the corpus")
    return [e.src for e in train], [e.tgt for e in train], f"train split of {name}"


def _write_shortlist(
    cfg: DictConfig, directory: Path, source: _Source, pairs: tuple[list[str], list[str], str]
) -> ShortlistInfo:
    """Count parallel text (`_shortlist_pairs`, encoded with the checkpoint's tokenizer) into a vocabulary
    shortlist (export/shortlist.py), written as shortlist.npz; its manifest entry."""
    srcs, tgts, origin = pairs
    tok, vocab = source.tokenizer, source.model.cfg
    settings = ShortlistSettings(
        int(cfg.shortlist.per_source_token), int(cfg.shortlist.frequent), int(cfg.shortlist.min_pairs)
    )
    counts = count_pairs(tok.encode_sources(srcs), tok.encode_targets(tgts), vocab.vocab_size)
    banned = tuple(never_emitted(vocab.pad_id, vocab.bos_id, vocab.eos_id))
    built = build_shortlist(counts, settings, always=(vocab.eos_id, tok.unk_id), banned=banned)
    built.save(directory / SHORTLIST_FILE)
    return ShortlistInfo(
        file=SHORTLIST_FILE,
        built_from=origin,
        pairs=len(srcs),
        per_source_token=settings.per_source_token,
        frequent=settings.frequent,
        min_pairs=settings.min_pairs,
        entries=len(built.targets),
    )


# ---------------------------------------------------------------------------------------------- manifest
def _spec(
    cfg: DictConfig, source: _Source, plan: _HeadPlan, exported: _Exported, graphs: Graphs, search: Search
) -> ExportSpec:
    """The export as the steps before made it, and the serving defaults the config gives: what the manifest says."""
    threads = cfg.runtime.threads
    return ExportSpec(
        name=source.name,
        checkpoint=source.payload,
        tokenizer=source.tokenizer,
        size_before=source.size,
        model=exported.model,
        head_plan=exported.plan,
        head_plan_source=plan.source,
        heads_removed=bool(cfg.remove_heads),
        head_importance=plan.importance,
        caches=exported.caches,
        size_after=exported.size,
        graphs=graphs,
        quantized=bool(cfg.quantize),
        alignment=exported.alignment,
        search=search,
        max_tokens=int(cfg.generation.max_tokens),
        max_sentences=int(cfg.generation.max_sentences),
        graph_optimization_level=cfg.runtime.graph_optimization_level,
        threads=int(threads) if threads else None,
    )


# ---------------------------------------------------------------------------------------------- verify
def _verify(
    cfg: DictConfig,
    runtime: ExportedModel,
    exported: _Exported,
    source: _Source,
    search: Search,
    strict: bool = True,
    tolerance: float | None = None,
) -> dict[str, Any]:
    """The graphs in `runtime` against the torch model (strict: fail the export on any difference; `tolerance`:
    verify.tolerance unless given)."""
    return verify_export(
        runtime,
        exported.model,
        exported.gated,
        source.tokenizer,
        source.srcs,
        source.tgts,
        search,
        float(cfg.verify.tolerance if tolerance is None else tolerance),
        int(cfg.verify.max_target_tokens),
        strict=strict,
    )


def _lenient_check(cfg: DictConfig, exported: _Exported, source: _Source, search: Search) -> CheckGraphs:
    """`_verify` without failing on differences, for graphs judged by their own precision's rule."""

    def check(runtime: ExportedModel, tolerance: float | None) -> dict[str, Any]:
        return _verify(cfg, runtime, exported, source, search, strict=False, tolerance=tolerance)

    return check
