"""Figures of zoo.analyze: map-rank histograms and singular-value curves (per checkpoint), the QKᵀ
rank-vs-n overlay (all checkpoints), and the attention maps of every head of one module for one sentence."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import torch
from torch import Tensor

from zoo.model import Transformer

matplotlib.use("Agg")
import matplotlib.pyplot as plt

KIND_ORDER = ("encoder self-attention", "decoder self-attention", "decoder cross-attention")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
MAX_TICK_TOKENS = 30  # label the axes of a sentence's maps with its tokens up to this length


def _by_kind(result: dict[str, Any]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    kinds: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for m in result["modules"].values():
        kinds.setdefault(m["kind"], []).append((m["layer"], m))
    return {k: sorted(v, key=lambda x: x[0]) for k, v in kinds.items()}


# ---------------------------------------------------------------------- post-softmax map ranks (one checkpoint)
def plot_rank_histograms(result: dict[str, Any], path: Path, title: str) -> None:
    """One row per attention kind, one panel per layer: histogram of map ranks (grey: matrix sizes)."""
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


# ---------------------------------------------------------------------- QKᵀ rank vs n (all checkpoints)
def plot_score_ranks(reports: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """One column per attention kind; top: mean numerical rank of QKᵀ per length bucket against the
    bucket's mean n, one line per checkpoint, with the references y = n and y = d_p; bottom: fraction of
    the matrices whose rank reaches min(n, d_p)."""
    found = {k for r in reports for k in r["by_kind"]}
    kinds = [k for k in KIND_ORDER if k in found] + sorted(found - set(KIND_ORDER))
    cols = max(len(kinds), 1)
    fig, axes = plt.subplots(2, cols, figsize=(4.8 * cols, 7.0), squeeze=False, sharex="col")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, kind in enumerate(kinds):
        ax_rank, ax_full = axes[0][col], axes[1][col]
        top_n = 1.0
        for i, rep in enumerate(reports):
            s = rep["by_kind"].get(kind)
            if not s or not s["buckets"]:
                continue
            xs = [b["mean_n"] for b in s["buckets"]]
            top_n = max(top_n, *xs)
            # distinct markers, shrinking with i, keep coinciding lines (e.g. all at d_p) visible
            style = {
                "color": colors[i % len(colors)],
                "marker": MARKERS[i % len(MARKERS)],
                "markersize": max(7 - i, 3),
                "linewidth": max(2.4 - 0.4 * i, 1.0),
                "alpha": 0.85,
            }
            ax_rank.plot(
                xs, [b["mean_rank"] for b in s["buckets"]], **style, label=f"{rep['label']} (d_p={s['head_dim']})"
            )
            ax_full.plot(xs, [b["at_bound_fraction"] for b in s["buckets"]], **style)
        ax_rank.plot([0, top_n], [0, top_n], color="grey", linestyle="--", linewidth=1, label="y = n")
        for j, dp in enumerate(sorted({r["by_kind"][kind]["head_dim"] for r in reports if kind in r["by_kind"]})):
            ax_rank.axhline(dp, color="black", linestyle=":", linewidth=1, label="y = d_p" if j == 0 else None)
            ax_rank.annotate(f"d_p={dp}", (top_n, dp), fontsize=7, ha="right", va="bottom")
        ax_rank.set_title(kind + (" (n = min(n_tgt, n_src))" if "cross" in kind else ""), fontsize=9)
        ax_rank.set_ylabel("mean numerical rank of QKᵀ")
        ax_rank.set_ylim(bottom=0)
        ax_rank.grid(alpha=0.3)
        ax_rank.legend(fontsize=7)
        ax_full.set_xlabel("sentence length n (bucket mean)")
        ax_full.set_ylabel("fraction with rank = min(n, d_p)")
        ax_full.set_ylim(-0.02, 1.02)
        ax_full.set_xlim(left=0)
        ax_full.grid(alpha=0.3)
    if not kinds:
        axes[0][0].text(0.5, 0.5, "no QKᵀ score matrices (all mechanisms skipped)", ha="center", va="center")
    skipped = [f"{r['label']}: {r['skipped_reason']}" for r in reports if not r["by_kind"] and r.get("skipped_reason")]
    if skipped:
        title += "\nskipped — " + "; ".join(skipped)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------------- one sentence's maps
def default_figure_module(model: Transformer) -> str:
    """The last encoder layer's self-attention module (by name)."""
    names = [n for n in model.attention_modules() if n.startswith("encoder.") and n.endswith(".self_attn")]
    if not names:
        raise ValueError("the model has no encoder self-attention module; set figure_module")
    return max(names, key=lambda n: int(n.split(".")[2]))


def sentence_maps(model: Transformer, src: Tensor, tgt_in: Tensor, module: str) -> dict[str, Tensor]:
    """Post-softmax maps of every head of `module` for one sentence pair (src [1, S], tgt_in [1, T], no
    padding): {"A_unmixed": [H, n_q, n_k]} when the mechanism has pre-mixing maps (Mixhead), then
    {"A": [H, n_q, n_k]}, the map that weights the values. The module's capture setting is restored."""
    modules = model.attention_modules()
    if module not in modules:
        raise KeyError(f"no attention module {module!r}; modules: {', '.join(modules)}")
    m = modules[module]
    saved = m.capture
    try:
        m.capture = ("A_unmixed", "A")
        m.captured.clear()
        with torch.no_grad():
            model(src, tgt_in)
        return {k: m.captured[k][0].detach().cpu() for k in ("A_unmixed", "A") if k in m.captured}
    finally:
        m.capture = saved
        m.captured.clear()


def plot_sentence_maps(
    maps: dict[str, Tensor], q_tokens: Sequence[str], k_tokens: Sequence[str], path: Path, title: str, per_row: int = 8
) -> None:
    """Grid of maps [H, n_q, n_k]: one block of rows per map kind (Mixhead: unmixed, then mixed), up to
    `per_row` heads per row; one colour scale per block (diverging where a mixed map has negative weights)."""
    heads = next(iter(maps.values())).shape[0]
    cols = min(heads, per_row)
    block = math.ceil(heads / cols)
    rows = block * len(maps)
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.1 * cols + 1.0, 2.2 * rows + 0.8), squeeze=False, layout="constrained"
    )
    names = {"A_unmixed": "unmixed", "A": "mixed" if "A_unmixed" in maps else "A"}
    ticks = len(q_tokens) <= MAX_TICK_TOKENS and len(k_tokens) <= MAX_TICK_TOKENS
    for b, (name, stack) in enumerate(maps.items()):
        lo, hi = float(stack.min()), float(stack.max())
        if lo < 0:
            lim = max(-lo, hi)
            cmap, vmin, vmax = "RdBu_r", -lim, lim
        else:
            cmap, vmin, vmax = "viridis", 0.0, hi if hi > 0 else 1.0
        image = None
        for h in range(block * cols):
            ax = axes[b * block + h // cols][h % cols]
            if h >= heads:
                ax.axis("off")
                continue
            image = ax.imshow(stack[h].float().numpy(), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
            ax.set_title(f"{names.get(name, name)} · head {h}", fontsize=7)
            if ticks:
                ax.set_xticks(range(len(k_tokens)), k_tokens, rotation=90, fontsize=4)
                ax.set_yticks(range(len(q_tokens)), q_tokens, fontsize=4)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
        if image is not None:
            fig.colorbar(image, ax=axes[b * block : (b + 1) * block].ravel().tolist(), shrink=0.8, label=name)
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
