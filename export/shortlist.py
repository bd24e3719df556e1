"""Build a lexical vocabulary shortlist from parallel text (`python -m export … shortlist.build=true`).

For each source token, the target tokens most likely to appear in a sentence's translation when the source holds
it: ranked by p(t | s) = c(s, t) / c(s), sentence counts of the training pairs (the co-occurrence estimate of a
lexical translation table, no aligner needed; Marian ranks by an aligner's lexical probabilities), plus the most
frequent targets, which every batch may produce. Ranked by Dice instead, the lists held about as many of a trained
model's output tokens at more than twice the size per batch (results/runtime/README.md). What a shortlist costs in
BLEU and gains in speed is measured by `python -m export.bench.shortlist`, not assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from export.runtime.shortlist import Shortlist

CHUNK = 4096  # sentence pairs counted at once: their token pairs fit in a few MB


@dataclass(frozen=True)
class ShortlistSettings:
    per_source_token: int  # the most target tokens listed per source token
    frequent: int  # the most frequent target tokens, which every batch may produce
    min_pairs: int  # a token pair seen in fewer sentence pairs is noise, not a translation


@dataclass(frozen=True)
class PairCounts:
    """Sentence counts of (source token, target token) pairs and of each token, over a corpus' pairs."""

    pairs: np.ndarray  # [P] int64 codes s·V + t of the pairs seen, sorted
    together: np.ndarray  # [P] int64 sentence pairs holding both
    source: np.ndarray  # [V] int64 sentence pairs whose source holds the token
    target: np.ndarray  # [V] int64 sentence pairs whose target holds the token


def count_pairs(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], vocab_size: int) -> PairCounts:
    """Count every (distinct source token, distinct target token) pair once per sentence pair, chunk by chunk."""
    v = vocab_size
    source, target = np.zeros(v, dtype=np.int64), np.zeros(v, dtype=np.int64)
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    for start in range(0, len(sources), CHUNK):
        codes = []
        for src, tgt in zip(sources[start : start + CHUNK], targets[start : start + CHUNK], strict=True):
            s, t = np.unique(np.asarray(src, dtype=np.int64)), np.unique(np.asarray(tgt, dtype=np.int64))
            source[s] += 1
            target[t] += 1
            codes.append((s[:, None] * v + t[None, :]).reshape(-1))  # [|s|·|t|]
        if codes:
            parts.append(np.unique(np.concatenate(codes), return_counts=True))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return PairCounts(empty, empty, source, target)
    codes = np.concatenate([c for c, _ in parts])
    counts = np.concatenate([n for _, n in parts])
    pairs, inverse = np.unique(codes, return_inverse=True)
    return PairCounts(pairs, np.bincount(inverse, weights=counts).astype(np.int64), source, target)


def build_shortlist(
    counts: PairCounts, settings: ShortlistSettings, always: Sequence[int], banned: Sequence[int] = ()
) -> Shortlist:
    """Per source token its `per_source_token` most likely targets by p(t | s) = c(s, t) / c(s) (pairs seen at
    least `min_pairs` times; ties: lower id), and `always`: the `frequent` most frequent targets plus the ids given
    (eos, unk). `banned` ids (pad, bos: a search never emits them) are listed nowhere."""
    v = len(counts.source)
    keep = counts.together >= settings.min_pairs
    for token in banned:
        keep &= counts.pairs % v != token
    pairs, together = counts.pairs[keep], counts.together[keep]
    s, t = pairs // v, pairs % v
    likely = together / counts.source[s]  # [P] p(t | s) in (0, 1]
    order = np.lexsort((t, -likely, s))  # by source token, then most likely first, then lower id
    s, t = s[order], t[order]
    first = np.searchsorted(s, s, side="left")  # [P] index of each source token's first entry
    rank = np.arange(len(s)) - first
    chosen = rank < settings.per_source_token
    s, t = s[chosen], t[chosen]
    lists = [np.sort(t[a:b]) for a, b in zip(*_bounds(s, v), strict=True)]  # each list sorted by id
    offsets = np.zeros(v + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in lists])
    targets = np.concatenate(lists).astype(np.int32) if lists else np.zeros(0, dtype=np.int32)
    frequent = np.argsort(-counts.target, kind="stable")
    frequent = frequent[(counts.target[frequent] > 0) & ~np.isin(frequent, banned)][: settings.frequent]
    always_ids = np.union1d(frequent, np.asarray(always, dtype=np.int64)).astype(np.int32)
    return Shortlist(offsets, targets, always_ids)


def _bounds(sorted_sources: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """[V] start and end of each source token's entries in a source-sorted array."""
    tokens = np.arange(vocab_size)
    return np.searchsorted(sorted_sources, tokens, "left"), np.searchsorted(sorted_sources, tokens, "right")
