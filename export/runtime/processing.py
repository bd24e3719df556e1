"""Decoding options that reshape a step's next-token scores: target prefixes, repetition control and sampling.

The plain search reads each row's k best tokens from the decoder graph's in-graph TopK. These options need every
row's whole distribution ([rows, width]: the vocabulary, or a shortlist's candidates), so a search that uses
one fetches the step's `logits` and `log_probs` instead and takes the top k here, in numpy — plain decoding keeps
its fast path. Where each option acts follows transformers' `generate`, the reference users compare against:

- `repetition_penalty` p (CTRL, Keskar et al. 2019): the score s of every token already in the decoder's input
  (its start token, the target prefix, the output so far — transformers' rule: a model that starts from eos has
  eos lowered too) becomes s·p where s < 0, else s/p. Beam search applies it
  to the log-probabilities (transformers' and fairseq's beam searches process log-probs, unnormalised after); greedy
  search and sampling to the logits before the softmax (the distribution they pick from).
- `no_repeat_ngram_size` n: a token that would complete an n-gram already in the output gets -inf.
- sampling: the penalised logits / `temperature`, then the `top_k` most likely tokens, then the nucleus — the
  fewest most likely tokens whose probabilities sum to at least `top_p` (Holtzman et al. 2020) — then one draw per
  row from a generator seeded by (seed, the sentence's index in its call, the sample's index), so a sentence's
  sample does not depend on what it was batched with. The score of a sampled token is its log-prob under the
  penalised distribution (before temperature and filtering): sampling with top_k = 1 is greedy search, scores too.
- a target prefix: the first tokens of a sentence's output are given; the search forces them (as it forces eos at
  the length limit) and continues from there. As in transformers, a hypothesis' score sums and normalises only
  the tokens after its prefix; lengths (min_len, the length limit) count the whole output, prefix included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

NO_TOKEN = -1  # a prefix array's padding after a sentence's last given token


def log_softmax(x: np.ndarray) -> np.ndarray:
    """[N, W] scores → log-probabilities over the last axis (float32; rows of -inf stay -inf)."""
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = x - top
    with np.errstate(divide="ignore"):
        return (shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))).astype(np.float32)


def _columns_of(tokens: np.ndarray, columns: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [...] → (their column in a step's scores, whether they have one): the id itself over the whole
    vocabulary, else its position in the sorted shortlist `columns` [C]."""
    if columns is None:
        return tokens, tokens >= 0
    pos = np.clip(np.searchsorted(columns, tokens), 0, len(columns) - 1)
    return pos, (columns[pos] == tokens) & (tokens >= 0)


def penalise(
    scores: np.ndarray, history: np.ndarray, columns: np.ndarray | None, repetition_penalty: float, ngram: int
) -> np.ndarray:
    """A step's scores [N, W] after the repetition penalty and the no-repeat n-gram ban (module docstring), given
    each row's decoder input so far `history` [N, t] (token ids, start token first; rows that ended carry pad,
    which no search emits). A new array; `scores` is left as it was."""
    out = scores.copy()
    n, t = history.shape
    if repetition_penalty != 1.0 and t:
        col, has = _columns_of(history, columns)  # [N, t]
        seen = np.zeros(out.shape, dtype=bool)
        rows = np.broadcast_to(np.arange(n)[:, None], history.shape)
        seen[rows[has], col[has]] = True
        p = np.float32(repetition_penalty)
        out = np.where(seen, np.where(out < 0, out * p, out / p), out).astype(np.float32)
    if ngram and t >= ngram:
        windows = sliding_window_view(history, ngram, axis=1)  # [N, t-n+1, n]
        suffix = history[:, t - ngram + 1 :]  # [N, n-1]: the n-gram a next token would complete starts with it
        match = np.all(windows[:, :, : ngram - 1] == suffix[:, None, :], axis=2)  # [N, t-n+1]
        rows, which = np.nonzero(match)
        col, has = _columns_of(windows[rows, which, ngram - 1], columns)
        out[rows[has], col[has]] = -np.inf
    return out


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row's k best (score [N, k] descending, column [N, k]) of scores [N, W] — ties: lower column first,
    as the graph's TopK; k is capped at W."""
    k = min(k, scores.shape[1])
    if k < scores.shape[1]:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # [N, k] the k best, unordered
    else:
        part = np.broadcast_to(np.arange(k), scores.shape).copy()
    vals = np.take_along_axis(scores, part, 1)
    order = np.lexsort((part, -vals), axis=1)
    return np.take_along_axis(vals, order, 1), np.take_along_axis(part, order, 1)


def nucleus(probs: np.ndarray, top_k_size: int, top_p: float) -> np.ndarray:
    """[W] probabilities → the columns a draw may take, most likely first (ties: lower column first): the
    `top_k_size` most likely (0: all), then the fewest of those whose probabilities sum to at least `top_p`."""
    order = np.lexsort((np.arange(len(probs)), -probs))
    order = order[probs[order] > 0]
    if top_k_size:
        order = order[:top_k_size]
    if top_p < 1.0 and order.size:
        mass = np.cumsum(probs[order].astype(np.float64))
        keep = int(np.searchsorted(mass, top_p * mass[-1], side="left")) + 1  # mass of what top-k kept
        order = order[: min(keep, order.size)]
    return order


def sampling_generators(seed: int, keys: Sequence[tuple[int, int]]) -> list[np.random.Generator]:
    """One generator per row from (seed, sentence index in its call, sample index): reproducible per sentence."""
    return [np.random.default_rng(np.random.SeedSequence([seed, int(s), int(j)])) for s, j in keys]


def draw(
    logits: np.ndarray,
    allowed: np.ndarray,
    temperature: float,
    top_k_size: int,
    top_p: float,
    generators: Sequence[np.random.Generator],
    rows: np.ndarray,
) -> np.ndarray:
    """One sampled column per row in `rows` from the penalised logits [N, W] over the `allowed` [N, W] tokens (the
    search's bans: pad, bos, eos before min_len), tempered and filtered (`nucleus`); `generators[r]` draws for
    row r. Rows not in `rows` get -1."""
    out = np.full(logits.shape[0], -1, dtype=np.int64)
    masked = np.where(allowed, logits / np.float32(temperature), -np.inf)
    probs = np.exp(log_softmax(masked).astype(np.float64))  # [N, W]
    for r in rows.tolist():
        keep = nucleus(probs[r], top_k_size, top_p)
        p = probs[r, keep]
        u = generators[r].random() * p.sum()
        out[r] = keep[min(int(np.searchsorted(np.cumsum(p), u, side="right")), keep.size - 1)]
    return out


def prefix_array(prefixes: Sequence[Sequence[int]] | None, sentences: int) -> np.ndarray:
    """Per sentence its given first output tokens as a [B, P] array padded with NO_TOKEN ([B, 0] without any)."""
    if prefixes is None:
        return np.zeros((sentences, 0), dtype=np.int64)
    width = max((len(p) for p in prefixes), default=0)
    out = np.full((sentences, width), NO_TOKEN, dtype=np.int64)
    for i, ids in enumerate(prefixes):
        out[i, : len(ids)] = ids
    return out
