"""Learning-curve plot written next to metrics.csv (people look at curves, not CSV files), and how the report's
figures are saved."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

PNG_METADATA = {"Software": None}  # no library version in the file: a re-render with another matplotlib is no diff


def save_report_figure(fig: Any, out: Path) -> None:
    """Save a report figure so that re-rendering the same records gives the same bytes, and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out, dpi=90, metadata=PNG_METADATA)
    plt.close(fig)


def plot_learning_curve(metrics_csv: Path, out_png: Path, quality_key: str = "valid_bleu") -> None:
    # imported here: matplotlib is slow to import and only plotting needs it, and the Agg backend must be
    # selected before pyplot loads (at module level that would change the backend of whoever imports us)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(metrics_csv.open()))
    if not rows:
        return

    def series(key: str) -> tuple[list[float], list[float]]:
        pts = [(float(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, (ax_loss, ax_q) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("train_loss", "train (label-smoothed)"), ("valid_loss", "valid (label-smoothed)")):
        xs, ys = series(key)
        if xs:
            ax_loss.plot(xs, ys, label=label, marker="." if key.startswith("valid") else None)
    ax_loss.set_xlabel("update")
    ax_loss.set_ylabel("loss per token")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    xs, ys = series(quality_key)
    if xs:
        ax_q.plot(xs, ys, marker="o", color="tab:green")
    ax_q.set_xlabel("update")
    ax_q.set_ylabel(quality_key.replace("_", " "))
    ax_q.grid(alpha=0.3)
    fig.suptitle(metrics_csv.parent.name)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
