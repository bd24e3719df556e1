"""Do a summarizer's outputs say anything about their own documents? The paired-minus-shuffled control (issue 64):
each output's ROUGE-L against its own document's reference, less its ROUGE-L against other documents' references
(`SHUFFLES` fixed derangements of the test set, the same for every run). An output that ignores its document scores
the same either way — a constant exactly so, since the shuffled references are the same multiset — so the difference
is the part of the score that the input earns. Distinct-output counts say only whether outputs vary; this says
whether they vary with the document.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from zoo.metrics import reordered_rouge_l

SHUFFLES = 3  # derangements averaged: their spread (≈ 0.1 ROUGE-L on 1,492 documents) is below the CI's width
SHUFFLE_SEED = 0  # fixed, so that every run of a suite is shuffled against the same pairings


def derangements(n: int, count: int = SHUFFLES, seed: int = SHUFFLE_SEED) -> np.ndarray:
    """`count` permutations of range(n) [count, n] in which no index stays in place (n ≥ 2), drawn from `seed`:
    each a uniform permutation redrawn until it has no fixed point (about e ≈ 2.7 draws each)."""
    if n < 2:
        raise ValueError(f"cannot pair {n} document(s) with other documents' references: the control needs ≥ 2")
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        p = rng.permutation(n)
        if not np.any(p == np.arange(n)):
            out.append(p)
    return np.stack(out)


def input_dependence(
    hypotheses: Sequence[str], references: Sequence[str], own: np.ndarray | None = None
) -> dict[str, float]:
    """ROUGE-L F1 × 100 (`own` per document if already computed, as zoo.metrics.document_stats gives it) against the
    document's own reference and, averaged over `derangements`, against others': the means, their difference
    (`gain`) and its 95% interval half-width over documents (normal, n ≥ 2). Nothing to pair below 2 documents."""
    n = len(hypotheses)
    perms = derangements(n)  # [K, N]
    if own is None:
        perms = np.concatenate([np.arange(n)[None], perms])  # the own pairing first, from the same tokens
    scores = 100.0 * reordered_rouge_l(hypotheses, references, perms)  # [K(+1), N]
    own = scores[0] if own is None else np.asarray(own, dtype=np.float64)  # [N]
    shuffled = scores[-SHUFFLES:].mean(axis=0)  # [N]
    diff = own - shuffled  # [N]
    return {
        "own": float(own.mean()),
        "shuffled": float(shuffled.mean()),
        "gain": float(diff.mean()),
        "ci95": float(1.96 * diff.std(ddof=1) / math.sqrt(n)),
    }


def above_floor(own: np.ndarray, floor: np.ndarray) -> dict[str, float]:
    """A run's per-document score (`own`, [N]) less a baseline's on the same documents (`floor`, [N], e.g. the
    constant summary's): the mean and its 95% interval half-width over documents (normal, n ≥ 2)."""
    diff = np.asarray(own, dtype=np.float64) - np.asarray(floor, dtype=np.float64)  # [N]
    return {"gain": float(diff.mean()), "ci95": float(1.96 * diff.std(ddof=1) / math.sqrt(len(diff)))}


def dependence_text(d: dict[str, Any]) -> str:
    """`+20.71 ± 0.62` (the gain and its 95% half-width; zero within it reads as no dependence). A constant's
    gain, zero up to the last bit of a float sum, reads +0.00."""
    return f"{round(d['gain'], 2) + 0.0:+.2f} ± {d['ci95']:.2f}"


__all__ = ["SHUFFLES", "SHUFFLE_SEED", "above_floor", "dependence_text", "derangements", "input_dependence"]
