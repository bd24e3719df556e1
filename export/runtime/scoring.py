"""Teacher-forced scoring over an export's own decoder graph: what `ExportedModel.score` runs per batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .model import ExportedModel


def teacher_forced(
    model: ExportedModel, src: np.ndarray, targets: Sequence[Sequence[int]]
) -> list[tuple[list[int], np.ndarray]]:
    """src [B, S] and one target per row → per row (target ids + eos, their log-probs [len] f32), feeding
    bos + target one step at a time through the search's own decoder graph and reading each next token's
    log-prob from the full `log_probs` output. Rows leave the batch once their eos is scored."""
    b = src.shape[0]
    lengths = np.array([len(t) + 1 for t in targets])  # [B] scored positions: tokens + eos
    width = int(lengths.max())
    feed = np.full((b, width), model.pad_id, dtype=np.int64)  # [B, T] bos + target
    want = np.full((b, width), model.pad_id, dtype=np.int64)  # [B, T] target + eos
    for row, ids in enumerate(targets):
        feed[row, : lengths[row]] = [model.bos_id, *ids]
        want[row, : lengths[row]] = [*ids, model.eos_id]
    lp = np.zeros((b, width), dtype=np.float32)  # [B, T]
    step = model.decoding(src, steps=width)
    live = np.arange(b)  # rows of the batch still being scored, in stepper order
    for t in range(width):
        dist = step.distribution(feed[live, t], t)  # [n, V]
        lp[live, t] = dist[np.arange(live.size), want[live, t]]
        keep = np.nonzero(lengths[live] > t + 1)[0]
        if keep.size == 0:
            break
        if keep.size < live.size:
            step.select(keep)
            live = live[keep]
    return [(want[row, :n].tolist(), lp[row, :n]) for row, n in enumerate(lengths.tolist())]
