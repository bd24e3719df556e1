"""`analyze(cfg)`: what `python -m zoo.analyze` runs (see the package docstring for the measurements)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig

from zoo.analyze.figures import (
    default_figure_module,
    plot_rank_histograms,
    plot_score_ranks,
    plot_sentence_maps,
    plot_singular_value_curves,
    sentence_maps,
)
from zoo.analyze.maps import collect_maps, module_kind, summarise_maps
from zoo.analyze.scores import SCORE_DEFINITION, collect_scores, score_rank_report
from zoo.checkpoint import CheckpointPayload, load_checkpoint, model_from_checkpoint, resolve_checkpoint
from zoo.data import DataError, Example, SharedVocabTokenizer, Tokenizer, build_splits, load_tokenizer
from zoo.data.batching import collate, encode_examples
from zoo.errors import ZooError
from zoo.model import Transformer
from zoo.training.threads import torch_threads

DTYPES = {"float64": torch.float64, "float32": torch.float32}
Batches = list[tuple[torch.Tensor, torch.Tensor]]  # (src [B, S], tgt_in [B, T]) per batch


class AnalyzeError(ZooError, ValueError):
    """A usage error of zoo.analyze (bad option values, no checkpoint given)."""


# ---------------------------------------------------------------------- options and inputs
def checkpoint_locations(cfg: DictConfig) -> list[str]:
    """`checkpoint=<one>` or `checkpoints=[a, b, …]` (exactly one of them) -> the list of locations."""
    one, many = cfg.get("checkpoint"), cfg.get("checkpoints")
    if one is not None and many is not None:
        raise AnalyzeError("give either checkpoint=<run dir|.pt> or checkpoints=[a,b,…], not both")
    if many is not None:
        locations = [str(x) for x in many] if isinstance(many, ListConfig | list | tuple) else [str(many)]
        if not locations:
            raise AnalyzeError("checkpoints=[] is empty")
        return locations
    if one is None:
        raise AnalyzeError("no checkpoint: give checkpoint=<run dir|.pt> or checkpoints=[<run dir|.pt>,…]")
    return [str(one)]


def _check_options(cfg: DictConfig) -> None:
    if cfg.dtype not in DTYPES:
        raise AnalyzeError(f"dtype={cfg.dtype!r}: use float64 or float32")
    if not 0 < float(cfg.qk_tol) < 1:
        raise AnalyzeError(f"qk_tol={cfg.qk_tol}: a relative tolerance in (0, 1) (σ_i > qk_tol·σ_max counts)")
    if int(cfg.qk_bucket) < 1:
        raise AnalyzeError(f"qk_bucket={cfg.qk_bucket}: the width of the length buckets must be >= 1")
    if cfg.qk_min_len is not None and int(cfg.qk_min_len) < 1:
        raise AnalyzeError(f"qk_min_len={cfg.qk_min_len}: must be >= 1 (or null = head size + 1)")


def run_dir_of(checkpoint: Path) -> Path:
    """The run dir of `<run>/checkpoints/x.pt` (a loose .pt file: its folder)."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def _examples(cfg: DictConfig, payload: CheckpointPayload) -> list[Example]:
    if cfg.split == "heldout":
        held = payload.get("heldout") or {}
        if not held.get("src"):
            raise DataError(f"{payload['path']} stores no held-out sentences; use split=test or split=valid")
        return [Example(s, t, "heldout") for s, t in zip(held["src"], held["tgt"], strict=True)]
    if cfg.split in ("test", "valid"):
        return list(getattr(build_splits(payload["data_config"]), cfg.split))
    raise DataError(f"split={cfg.split!r}: use heldout, test or valid")


def _pairs_and_batches(
    cfg: DictConfig, payload: CheckpointPayload, model: Transformer, tok: Tokenizer | SharedVocabTokenizer
) -> tuple[list[tuple[list[int], list[int]]], Batches]:
    examples = _examples(cfg, payload)
    if cfg.sentences:
        examples = examples[: int(cfg.sentences)]
    pairs, _ = encode_examples(examples, tok, model.cfg.max_positions, truncate=True)
    if not pairs:
        raise DataError("no sentence pairs to analyse (all empty?)")
    size = int(cfg.batch_size)
    batches = []
    for i in range(0, len(pairs), size):
        batch = collate(pairs[i : i + size], tok.pad_id, tok.bos_id, tok.eos_id)
        batches.append((batch.src.to(cfg.device), batch.tgt_in.to(cfg.device)))
    return pairs, batches


# ---------------------------------------------------------------------- one checkpoint
def analyze_maps(
    cfg: DictConfig, payload: CheckpointPayload, model: Transformer, batches: Batches, sentences: int, pad_id: int
) -> dict[str, Any]:
    """Post-softmax map ranks and singular-value curves of every module (zoo.analyze.maps)."""
    maps = collect_maps(model, batches, cfg.map, pad_id)
    modules: dict[str, Any] = {}
    skipped: list[str] = []
    for name, stacks in maps.items():
        if not stacks:
            skipped.append(name)
            continue
        kind, layer = module_kind(name)
        modules[name] = {
            "kind": kind,
            "layer": layer,
            "heads": int(stacks[0].shape[0]),
            **summarise_maps(stacks, float(cfg.threshold), int(cfg.grid)),
        }
    return {
        "entry": payload.get("entry"),
        "checkpoint": payload["path"],
        "split": cfg.split,
        "sentences": sentences,
        "map": cfg.map,
        "threshold": float(cfg.threshold),
        "dtype": cfg.dtype,
        "attention": model.cfg.attention,
        "num_heads": model.cfg.num_heads,
        "head_dim": model.attention_modules()[next(iter(maps))].head_dim,
        "curve_x": torch.linspace(0, 1, int(cfg.grid) + 1, dtype=torch.float64).tolist(),
        "modules": modules,
        "skipped": skipped,
    }


def analyze_scores(
    cfg: DictConfig,
    label: str,
    payload: CheckpointPayload,
    model: Transformer,
    batches: Batches,
    sentences: int,
    pad_id: int,
) -> dict[str, Any]:
    """Numerical ranks of the pre-softmax QKᵀ of every head against n (zoo.analyze.scores)."""
    attn = model.attention_modules()
    head_dims = {name: m.head_dim for name, m in attn.items()}
    head_dim = next(iter(head_dims.values()))
    min_len = int(cfg.qk_min_len) if cfg.qk_min_len is not None else head_dim + 1
    stacks, skipped = collect_scores(model, batches, pad_id)
    modules, by_kind = score_rank_report(stacks, head_dims, float(cfg.qk_tol), int(cfg.qk_bucket), min_len)
    reasons = sorted(set(skipped.values()))
    return {
        "label": label,
        "entry": payload.get("entry"),
        "checkpoint": payload["path"],
        "attention": model.cfg.attention,
        "num_heads": model.cfg.num_heads,
        "head_dim": head_dim,
        "sentences": sentences,
        "min_len": min_len,
        "by_kind": by_kind,
        "modules": modules,
        "skipped": skipped,
        "skipped_reason": "; ".join(reasons) if reasons else None,
    }


def figure_choice(cfg: DictConfig, model: Transformer, sentences: int) -> tuple[int, str] | None:
    """(sentence index, module) of the requested sentence figure, checked before any work; None if none."""
    if cfg.figure_sentence is None:
        return None
    index = int(cfg.figure_sentence)
    if not 0 <= index < sentences:
        raise AnalyzeError(
            f"figure_sentence={index}: the analysed split has {sentences} sentence pairs (0…{sentences - 1})"
        )
    module = cfg.figure_module or default_figure_module(model)
    if module not in model.attention_modules():
        raise AnalyzeError(
            f"figure_module={module!r}: not an attention module; modules: {', '.join(model.attention_modules())}"
        )
    return index, module


def write_sentence_figure(
    cfg: DictConfig,
    label: str,
    model: Transformer,
    tok: Tokenizer | SharedVocabTokenizer,
    pair: tuple[list[int], list[int]],
    index: int,
    module: str,
    out: Path,
) -> Path:
    """PNG grid of every head's post-softmax map of `module` for one sentence `pair` (number `index`)."""
    batch = collate([pair], tok.pad_id, tok.bos_id, tok.eos_id)  # one pair: no padding
    src, tgt_in = batch.src.to(cfg.device), batch.tgt_in.to(cfg.device)  # [1, S], [1, T]
    maps = sentence_maps(model, src, tgt_in, module)
    if not maps:
        raise AnalyzeError(f"{module} captured no attention map")
    source_piece = getattr(tok, "source_piece", tok.id_to_piece)  # a separate source vocabulary (FSMT) has its own
    src_tok = [source_piece(int(i)) for i in batch.src[0]]
    tgt_tok = [tok.id_to_piece(int(i)) for i in batch.tgt_in[0]]
    q_tok = src_tok if module.startswith("encoder") else tgt_tok
    k_tok = tgt_tok if module.startswith("decoder") and module.endswith("self_attn") else src_tok
    text = tok.decode(pair[0])
    title = (
        f"{label} · {module} · sentence {index} ({cfg.split}, {len(src_tok)} source tokens)\n"
        f"{text[:100]}{'…' if len(text) > 100 else ''}"
    )
    path = out / f"attention_maps_s{index}_{module}.png"
    plot_sentence_maps(maps, q_tok, k_tok, path, title)
    return path


def checkpoint_label(payload: CheckpointPayload) -> str:
    """The entry name a checkpoint was trained as (its file stem for a checkpoint without one)."""
    return str(payload.get("entry") or Path(payload["path"]).stem)


def analyze_checkpoint(cfg: DictConfig, payload: CheckpointPayload, out: Path, label: str) -> dict[str, Any]:
    """Everything for one loaded checkpoint; its files go to `out`. Returns {"label", "maps", "qk",
    "figure"} (qk None with qk_rank=false, figure None without figure_sentence)."""
    model = model_from_checkpoint(payload).to(device=cfg.device, dtype=DTYPES[cfg.dtype])
    tok = load_tokenizer(payload["tokenizer"])  # a converted model's too
    pairs, batches = _pairs_and_batches(cfg, payload, model, tok)
    figure = figure_choice(cfg, model, len(pairs))
    out.mkdir(parents=True, exist_ok=True)

    maps = analyze_maps(cfg, payload, model, batches, len(pairs), tok.pad_id)
    (out / "analysis.json").write_text(json.dumps(maps, indent=1))
    title = f"{maps['entry']} · map {cfg.map} · {len(pairs)} sentences ({cfg.split})"
    plot_rank_histograms(maps, out / "ranks.png", title)
    plot_singular_value_curves(maps, out / "singular_values.png", title)
    print(format_table(maps))

    qk = analyze_scores(cfg, label, payload, model, batches, len(pairs), tok.pad_id) if cfg.qk_rank else None
    if qk is not None:
        print(format_score_table(qk, float(cfg.qk_tol), cfg.dtype))
    figure_path = None
    if figure is not None:
        index, module = figure
        figure_path = write_sentence_figure(cfg, label, model, tok, pairs[index], index, module, out)
        print(f"    attention maps of sentence {index}: {figure_path}")
    print(f"    written to {out}")
    return {"label": label, "maps": maps, "qk": qk, "figure": str(figure_path) if figure_path else None}


# ---------------------------------------------------------------------- all checkpoints
def analyze(cfg: DictConfig) -> dict[str, Any]:
    """Analyse every checkpoint, then write the QKᵀ rank overlay (`qk_rank.png`) and `qk_rank.json`.
    One checkpoint: all files in the output dir (as before); several: per-checkpoint files in
    `<out>/<label>/` (label = entry name, "-2", "-3", … on repeats), the overlay in `<out>/`."""
    locations = checkpoint_locations(cfg)
    _check_options(cfg)
    # threads=N for this call only: an in-process caller (a notebook, a test) keeps its own count
    with torch_threads(int(cfg.threads)) if cfg.threads else contextlib.nullcontext():
        return _analyze_all(cfg, locations)


def _analyze_all(cfg: DictConfig, locations: list[str]) -> dict[str, Any]:
    out = Path(cfg.out) if cfg.out else run_dir_of(resolve_checkpoint(locations[0])) / "analysis"
    results = []
    used: set[str] = set()
    for location in locations:
        payload = load_checkpoint(location)
        label = base = checkpoint_label(payload)
        k = 1
        while label in used:
            k += 1
            label = f"{base}-{k}"
        used.add(label)
        results.append(analyze_checkpoint(cfg, payload, out / label if len(locations) > 1 else out, label))
        del payload  # one model in memory at a time
    reports = [r["qk"] for r in results if r["qk"] is not None]
    if reports:
        out.mkdir(parents=True, exist_ok=True)
        tol = float(cfg.qk_tol)
        summary = {
            "score": SCORE_DEFINITION,
            "tol": tol,
            "rank_rule": "numerical rank = #{σ_i > tol·σ_max}",
            "dtype": cfg.dtype,
            "split": cfg.split,
            "bucket_width": int(cfg.qk_bucket),
            "checkpoints": reports,
        }
        (out / "qk_rank.json").write_text(json.dumps(summary, indent=1))
        title = (
            f"pre-softmax QKᵀ numerical rank (σ > {tol:g}·σ_max, {cfg.dtype}) vs sentence length · "
            f"{cfg.split}, buckets of {int(cfg.qk_bucket)}"
        )
        plot_score_ranks(reports, out / "qk_rank.png", title)
        print(f"QKᵀ rank overlay of {len(reports)} checkpoint(s): {out / 'qk_rank.png'}, {out / 'qk_rank.json'}")
    return {"out": str(out), "checkpoints": results}


# ---------------------------------------------------------------------- tables
def format_table(result: dict[str, Any]) -> str:
    """Per module: matrices, mean rank / mean size, full-rank fraction, curve area."""
    lines = [
        f"[{result['entry']}] attention-map ranks ({result['map']}, σ > {result['threshold']:g}, "
        f"{result['sentences']} sentences from {result['split']}, {result['dtype']})",
        f"    {'module':<30}{'maps':>6}{'mean rank':>11}{'mean size':>11}{'full rank':>11}{'σ-curve area':>14}",
    ]
    for name, m in result["modules"].items():
        lines.append(
            f"    {name:<30}{m['matrices']:>6}{m['mean_rank']:>11.2f}{m['mean_size']:>11.2f}"
            f"{m['full_rank_fraction']:>10.0%} {m['curve_area']:>13.3f}"
        )
    if result["skipped"]:
        lines.append(f"    no attention map captured for: {', '.join(result['skipped'])}")
    return "\n".join(lines)


def format_score_table(report: dict[str, Any], tol: float, dtype: str) -> str:
    """Per module (MGK: per key component): matrices, mean n, mean rank, fraction at min(n, d_p), all
    sentences and those with n ≥ min_len."""
    lines = [
        f"[{report['label']}] pre-softmax QKᵀ numerical rank (σ > {tol:g}·σ_max, {dtype}); d_p = "
        f"{report['head_dim']}, long: n ≥ {report['min_len']}",
        f"    {'module':<34}{'mats':>6}{'mean n':>8}{'rank':>7}{'at bound':>10}"
        f"{'long mats':>11}{'rank':>7}{'at bound':>10}",
    ]
    for name, m in report["modules"].items():
        long = m["long"]
        tail = (
            f"{long['matrices']:>11}{long['mean_rank']:>7.2f}{long['at_bound_fraction']:>10.0%}"
            if long["matrices"]
            else f"{0:>11}{'–':>7}{'–':>10}"
        )
        lines.append(
            f"    {name:<34}{m['matrices']:>6}{m['mean_n']:>8.1f}{m['mean_rank']:>7.2f}"
            f"{m['at_bound_fraction']:>10.0%}{tail}"
        )
    for name, reason in report["skipped"].items():
        lines.append(f"    {name:<34}skipped: {reason}")
    return "\n".join(lines)
