"""The learning-curve figure of REPORT.md: every entry's validation quality over updates, every seed drawn, and —
for summarization suites — the validation loss and the share of distinct validation outputs below it.

Why the lower panels: a summarizer's validation ROUGE-L can sit at a constant string's level for thousands of
updates while its loss falls (issue 64); the loss shows which models learn faster from the same batches (Lite1 and the
3+3 models of `summ` part there from the first thousand updates), the share of distinct outputs whether the outputs
depend on the input at all, and when that changed. Why every seed: one seed's curve hides how far apart an entry's
seeds are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from zoo.plots import save_report_figure
from zoo.report.run_state import DEGENERATE_DISTINCT


class Curve(NamedTuple):
    """One run's validation points: updates, quality, and (None where the run did not record it) the distinct
    share and the validation loss."""

    entry: str
    seed: str
    steps: list[int]
    quality: list[float]
    distinct: list[float | None]
    loss: list[float | None]


def curves(data: dict[str, Any]) -> list[Curve]:
    """Every run's validation curve, entries and seeds in the suite's order; points without a quality left out."""
    out = []
    for entry, rec in data["entries"].items():
        for seed, run in rec["seeds"].items():
            points = [p for p in run.get("learning_curve") or [] if p.get("valid_quality") is not None]
            if points:
                out.append(
                    Curve(
                        entry,
                        str(seed),
                        [int(p["step"]) for p in points],
                        [float(p["valid_quality"]) for p in points],
                        [p.get("valid_distinct") for p in points],
                        [p.get("valid_loss") for p in points],
                    )
                )
    return out


def plot_learning_curves(data: dict[str, Any], out: Path) -> None:
    """`out`: quality over updates (one colour per entry, one line per seed); for a summarization suite a
    validation-loss panel when any run recorded losses; a distinct-outputs panel when any run counted them, with the
    near-constant threshold the claims use (measured on test outputs) dotted."""
    import matplotlib.pyplot as plt  # here: matplotlib is slow to import and only plotting needs it

    runs = curves(data)
    with_loss = data.get("task") == "summarization" and any(v is not None for c in runs for v in c.loss)
    with_distinct = any(d is not None for c in runs for d in c.distinct)
    lower = [kind for kind, shown in (("loss", with_loss), ("distinct", with_distinct)) if shown]
    # one panel: a plain figure (no shared axis, no ratios), as translation suites have always had it
    stacked = {"sharex": True, "height_ratios": [3] + [2] * len(lower)} if lower else {}
    fig, grid = plt.subplots(1 + len(lower), 1, figsize=(8, 4.5 + 2 * len(lower)), squeeze=False, **stacked)
    axes = list(grid[:, 0])
    ax, panels = axes[0], dict(zip(lower, axes[1:], strict=True))
    seeds: dict[str, list[str]] = {}  # entry → its seeds, in the suite's order (the legend and the colours)
    for c in runs:
        seeds.setdefault(c.entry, []).append(c.seed)
    colours = {entry: f"C{i % 10}" for i, entry in enumerate(seeds)}
    for c in runs:
        shown_seeds = seeds[c.entry]
        label = f"{c.entry} (seed{'s' if len(shown_seeds) > 1 else ''} {', '.join(shown_seeds)})"
        style = {"color": colours[c.entry], "marker": ".", "linewidth": 1.2, "alpha": 0.9}
        ax.plot(c.steps, c.quality, label=label if c.seed == shown_seeds[0] else None, **style)
        for kind, values, scale in (("loss", c.loss, 1.0), ("distinct", c.distinct, 100.0)):
            if kind in panels:
                shown = [(s, v) for s, v in zip(c.steps, values, strict=True) if v is not None]
                panels[kind].plot([s for s, _ in shown], [scale * v for _, v in shown], **style)
    ax.set_ylabel("validation quality (greedy BLEU / ROUGE-L)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    if "loss" in panels:
        panels["loss"].set_ylabel("validation loss\n(nats per token)")
        panels["loss"].grid(alpha=0.3)
    if "distinct" in panels:
        share = panels["distinct"]
        share.axhline(100 * DEGENERATE_DISTINCT, color="black", linestyle=":", linewidth=1)
        share.set_ylabel("distinct validation\noutputs (%)")
        share.set_ylim(0, 100)
        share.grid(alpha=0.3)
    axes[-1].set_xlabel("update")
    save_report_figure(fig, out)


__all__ = ["Curve", "curves", "plot_learning_curves"]
