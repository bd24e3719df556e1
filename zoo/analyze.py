"""`python -m zoo.analyze checkpoint=<run dir|.pt>`: how high-rank are a model's attention maps?

The Mixhead, concise-attention and MGK papers all argue about the *rank* of post-softmax attention
matrices (a head of size d_k < n yields maps of rank ≤ d_k before the softmax: the low-rank
bottleneck). This runs any checkpoint teacher-forced on a sample of held-out sentence pairs,
captures every attention module's maps (feature map "A"; for Mixhead that is the mixed map, and
`map=A_unmixed` asks for the per-head maps before mixing) and computes, per module = per layer
and attention kind:

  * the rank distribution: number of singular values above `threshold` of each [n_q × n_k] map
    (one matrix per sentence and head, padding cropped off; the MGK paper's analysis, 1e-6);
  * the normalised cumulative singular-value curve (the Mixhead paper's Fig. 1/3):
    c(k) = Σ_{i≤k} σ_i / Σ_i σ_i, with k rescaled to the fraction k/r of the r = min(n_q, n_k)
    singular values so sentences of different lengths average onto one curve (mean over sentences
    and heads). The closer to the upper-left corner, the lower the effective rank; "area" is the
    mean of the curve over the grid (0.5 for equal singular values, → 1 for rank one).

The model runs in float64 by default so the 1e-6 threshold measures the maps, not float32 noise.
Decoder self-attention maps are lower-triangular with a positive diagonal, so they are full rank in
exact arithmetic; their singular-value curves are still informative.

Writes `analysis.json`, `ranks.png` and `singular_values.png` to `<run>/analysis/` (or `out=`).
The functions below are pure and work on any constructed matrices.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig
from torch import Tensor

from zoo.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint
from zoo.data import DataError, Example, Tokenizer, build_splits, collate, encode_examples
from zoo.model import Transformer

KINDS = {("encoder", "self_attn"): "encoder self-attention", ("decoder", "self_attn"): "decoder self-attention",
         ("decoder", "cross_attn"): "decoder cross-attention"}


# ---------------------------------------------------------------------- pure functions
def singular_values(mats: Tensor) -> Tensor:
    """[..., n, m] -> [..., min(n, m)] singular values in descending order, in float64."""
    return torch.linalg.svdvals(mats.to(torch.float64))


def matrix_ranks(mats: Tensor, threshold: float = 1e-6) -> Tensor:
    """[..., n, m] -> [...] number of singular values above `threshold` (absolute, as the MGK paper)."""
    return (singular_values(mats) > threshold).sum(dim=-1)


def cumulative_singular_values(sv: Tensor) -> Tensor:
    """[..., r] descending singular values -> [..., r] normalised cumulative sums (last entry 1;
    an all-zero matrix gives all ones)."""
    total = sv.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, sv.cumsum(dim=-1) / total.clamp_min(torch.finfo(sv.dtype).tiny),
                       torch.ones_like(sv))


def resample_curve(curve: Tensor, grid: int) -> Tensor:
    """[..., r] cumulative curve at k = 1..r -> [..., grid + 1] values at fractions x = 0, 1/grid, …, 1
    of the singular values (linear interpolation, c(0) = 0), so matrices of any size average."""
    r = curve.shape[-1]
    padded = torch.cat([torch.zeros_like(curve[..., :1]), curve], dim=-1)  # [..., r + 1] at k = 0..r
    pos = torch.linspace(0, 1, grid + 1, dtype=torch.float64) * r  # fractional k
    lo = pos.floor().long().clamp(max=r)
    hi = (lo + 1).clamp(max=r)
    w = (pos - lo).to(curve.dtype)
    return padded[..., lo] * (1 - w) + padded[..., hi] * w


def rank_histogram(ranks: Iterable[int]) -> dict[int, int]:
    """{rank: number of matrices}, sorted by rank."""
    return dict(sorted(Counter(int(r) for r in ranks).items()))


def crop_maps(attn: Tensor, q_lens: Tensor, k_lens: Tensor) -> list[Tensor]:
    """attn [B, H, T, S] padded maps -> per batch row the [H, q_len, k_len] block of real positions
    (padded query rows would otherwise add rank that no real token has)."""
    return [attn[b, :, : int(q_lens[b]), : int(k_lens[b])] for b in range(attn.shape[0])]


def summarise_maps(stacks: Sequence[Tensor], threshold: float = 1e-6, grid: int = 50) -> dict[str, Any]:
    """Rank distribution and mean cumulative singular-value curve of a list of [H, n, m] stacks
    (one per sentence). Returns plain JSON-able numbers."""
    ranks: list[int] = []
    sizes: list[int] = []
    curves: list[Tensor] = []
    for stack in stacks:
        sv = singular_values(stack)  # [H, r]
        ranks += (sv > threshold).sum(dim=-1).tolist()
        sizes += [sv.shape[-1]] * sv.shape[0]
        curves.append(resample_curve(cumulative_singular_values(sv), grid))  # [H, grid + 1]
    if not ranks:
        return {"matrices": 0}
    curve = torch.cat(curves).mean(dim=0)
    ratio = [r / s for r, s in zip(ranks, sizes, strict=True)]
    return {
        "matrices": len(ranks),
        "rank_histogram": rank_histogram(ranks),
        "mean_rank": sum(ranks) / len(ranks),
        "mean_size": sum(sizes) / len(sizes),
        "mean_rank_ratio": sum(ratio) / len(ratio),
        "full_rank_fraction": sum(r == s for r, s in zip(ranks, sizes, strict=True)) / len(ranks),
        "curve": curve.tolist(),
        "curve_area": float(curve.mean()),
        "ranks": ranks,
        "sizes": sizes,
    }


def module_kind(name: str) -> tuple[str, int]:
    """("decoder cross-attention", 2) from "decoder.layers.2.cross_attn"."""
    parts = name.split(".")
    return KINDS.get((parts[0], parts[-1]), f"{parts[0]} {parts[-1]}"), int(parts[2])


# ---------------------------------------------------------------------- running a model
def collect_maps(model: Transformer, batches: Iterable[tuple[Tensor, Tensor]], map_name: str = "A",
                 pad_id: int = 0) -> dict[str, list[Tensor]]:
    """Teacher-forced forward passes over (src [B, S], tgt_in [B, T]) batches; per attention module,
    the cropped [H, n_q, n_k] maps of every sentence. `map_name` "A" is the map that weights the
    values; a mechanism-specific name (Mixhead's "A_unmixed") falls back to "A" where a module does
    not produce it. Modules that capture no map at all get an empty list."""
    modules = model.attention_modules()
    saved = {name: m.capture for name, m in modules.items()}
    wanted = tuple(dict.fromkeys((map_name, "A")))
    out: dict[str, list[Tensor]] = {name: [] for name in modules}
    try:
        for m in modules.values():
            m.capture = wanted
            m.captured.clear()
        with torch.no_grad():
            for src, tgt_in in batches:
                model(src, tgt_in)
                src_lens, tgt_lens = src.ne(pad_id).sum(1), tgt_in.ne(pad_id).sum(1)  # [B]
                for name, m in modules.items():
                    attn = m.captured.get(map_name, m.captured.get("A"))
                    m.captured.clear()
                    if attn is None:
                        continue
                    decoder_self = name.startswith("decoder") and name.endswith("self_attn")
                    q_lens = src_lens if name.startswith("encoder") else tgt_lens
                    k_lens = tgt_lens if decoder_self else src_lens
                    out[name] += [a.detach().cpu() for a in crop_maps(attn, q_lens, k_lens)]
    finally:
        for name, m in modules.items():
            m.capture = saved[name]
            m.captured.clear()
    return out


def _examples(cfg: DictConfig, payload: dict[str, Any]) -> list[Example]:
    if cfg.split == "heldout":
        held = payload.get("heldout") or {}
        if not held.get("src"):
            raise DataError(f"{payload['path']} stores no held-out sentences; use split=test or split=valid")
        return [Example(s, t, "heldout") for s, t in zip(held["src"], held["tgt"], strict=True)]
    if cfg.split in ("test", "valid"):
        return list(getattr(build_splits(payload["data_config"]), cfg.split))
    raise DataError(f"split={cfg.split!r}: use heldout, test or valid")


def analyze(cfg: DictConfig) -> dict[str, Any]:
    """Run the analysis described in the module docstring; returns (and writes) the result dict."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    dtypes = {"float64": torch.float64, "float32": torch.float32}
    if cfg.dtype not in dtypes:
        raise DataError(f"dtype={cfg.dtype!r}: use float64 or float32")
    payload = load_checkpoint(cfg.checkpoint)
    model = model_from_checkpoint(payload).to(device=cfg.device, dtype=dtypes[cfg.dtype])
    tok = Tokenizer.from_bytes(payload["tokenizer"])
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
    maps = collect_maps(model, batches, cfg.map, tok.pad_id)

    modules: dict[str, Any] = {}
    skipped: list[str] = []
    for name, stacks in maps.items():
        if not stacks:
            skipped.append(name)
            continue
        kind, layer = module_kind(name)
        modules[name] = {"kind": kind, "layer": layer, "heads": int(stacks[0].shape[0]),
                         **summarise_maps(stacks, float(cfg.threshold), int(cfg.grid))}
    result = {
        "entry": payload.get("entry"), "checkpoint": payload["path"], "split": cfg.split, "sentences": len(pairs),
        "map": cfg.map, "threshold": float(cfg.threshold), "dtype": cfg.dtype, "attention": model.cfg.attention,
        "num_heads": model.cfg.num_heads, "head_dim": model.attention_modules()[next(iter(maps))].head_dim,
        "curve_x": torch.linspace(0, 1, int(cfg.grid) + 1, dtype=torch.float64).tolist(),
        "modules": modules, "skipped": skipped,
    }
    ckpt = Path(payload["path"])
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    out = Path(cfg.out) if cfg.out else run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(result, indent=1))
    title = f"{result['entry']} · map {cfg.map} · {len(pairs)} sentences ({cfg.split})"
    plot_rank_histograms(result, out / "ranks.png", title)
    plot_singular_value_curves(result, out / "singular_values.png", title)
    print(format_table(result))
    print(f"    written to {out}")
    return result


# ---------------------------------------------------------------------- output
def _by_kind(result: dict[str, Any]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    kinds: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for m in result["modules"].values():
        kinds.setdefault(m["kind"], []).append((m["layer"], m))
    return {k: sorted(v, key=lambda x: x[0]) for k, v in kinds.items()}


def plot_rank_histograms(result: dict[str, Any], path: Path, title: str) -> None:
    """One row per attention kind, one panel per layer: histogram of map ranks (grey: matrix sizes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = _by_kind(result)
    cols = max((len(v) for v in kinds.values()), default=1)
    fig, axes = plt.subplots(len(kinds) or 1, cols, figsize=(3.2 * cols, 2.6 * max(len(kinds), 1)), squeeze=False)
    for row, (kind, layers) in enumerate(kinds.items()):
        for col in range(cols):
            ax = axes[row][col]
            if col >= len(layers):
                ax.axis("off")
                continue
            layer, m = layers[col]
            top = max(m["sizes"])
            bins = [b - 0.5 for b in range(1, top + 2)]
            ax.hist(m["sizes"], bins=bins, color="lightgrey", label="size min(n_q, n_k)")
            ax.hist(m["ranks"], bins=bins, color="tab:blue", alpha=0.8, label="rank")
            ax.set_title(f"{kind}, layer {layer}", fontsize=8)
            ax.set_xlabel(f"rank (σ > {result['threshold']:g})", fontsize=7)
            ax.tick_params(labelsize=7)
            if row == 0 and col == 0:
                ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_singular_value_curves(result: dict[str, Any], path: Path, title: str) -> None:
    """One panel per attention kind, one line per layer: mean normalised cumulative singular values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = _by_kind(result)
    fig, axes = plt.subplots(1, len(kinds) or 1, figsize=(4 * max(len(kinds), 1), 3.6), squeeze=False)
    x = result["curve_x"]
    for ax, (kind, layers) in zip(axes[0], kinds.items(), strict=False):
        ax.plot([0, 1], [0, 1], color="lightgrey", linestyle="--", linewidth=1, label="equal σ")
        for layer, m in layers:
            ax.plot(x, m["curve"], label=f"layer {layer} (area {m['curve_area']:.2f})")
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel("fraction of singular values")
        ax.set_ylabel("normalised cumulative σ")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def format_table(result: dict[str, Any]) -> str:
    """Per module: matrices, mean rank / mean size, full-rank fraction, curve area."""
    lines = [f"[{result['entry']}] attention-map ranks ({result['map']}, σ > {result['threshold']:g}, "
             f"{result['sentences']} sentences from {result['split']}, {result['dtype']})",
             f"    {'module':<30}{'maps':>6}{'mean rank':>11}{'mean size':>11}{'full rank':>11}{'σ-curve area':>14}"]
    for name, m in result["modules"].items():
        lines.append(f"    {name:<30}{m['matrices']:>6}{m['mean_rank']:>11.2f}{m['mean_size']:>11.2f}"
                     f"{m['full_rank_fraction']:>10.0%} {m['curve_area']:>13.3f}")
    if result["skipped"]:
        lines.append(f"    no attention map captured for: {', '.join(result['skipped'])}")
    return "\n".join(lines)


@hydra.main(config_path="../conf", config_name="analyze", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        analyze(cfg)
    except (CheckpointError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
