"""A run's metrics.csv: a row per logged update and per validation, which the report, the learning-curve plot and
the convergence checks read. One home for its columns and for the two ways it changes: appended while training,
cut back to a checkpoint's update when a run resumes (the updates after it are redone)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

FIELDS = [
    "step",
    "epoch",
    "elapsed_s",
    "lr",
    "train_loss",
    "train_nll",
    "tokens_per_s",
    "valid_loss",
    "valid_nll",
    "valid_ppl",
    "valid_quality",
    "valid_distinct",
]


def start(path: Path) -> None:
    """The header, unless the file exists (a resumed or branched run goes on with its rows)."""
    if not path.exists():
        with path.open("w", newline="") as f:
            csv.DictWriter(f, FIELDS).writeheader()


def append(path: Path, row: dict[str, Any]) -> None:
    """One row; values of other names are left out."""
    with path.open("a", newline="") as f:
        csv.DictWriter(f, FIELDS).writerow({k: v for k, v in row.items() if k in FIELDS})


def truncate(path: Path, step: int) -> None:
    """Drop the rows written after update `step`."""
    if not path.exists():
        return
    rows = [r for r in csv.DictReader(path.open()) if int(r["step"]) <= step]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
