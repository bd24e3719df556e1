"""The runtime's greedy and beam search over a step function — the one search loop of both engines.

zoo.decoding.generate runs these loops over a torch `Step` (its `TorchStep`), the runtime over the exported graph's, so
every
rule of the search is the same in both by construction and engine parity is the parity of two steppers. The rules:
pad and bos are banned (bos not where it is eos: fairseq's models start from eos), eos is banned before `min_len`
and forced at each sentence's length limit (`max_lengths`), a sentence's given target prefix is forced token by
token; beam search keeps fairseq's 2·K candidates, counts only eos among the top K as finished, stops a sentence
after K finished hypotheses and drops it from the batch; greedy runs until every row has ended.

The step function returns each row's k best (log-prob, token) — the decoder graph's in-graph TopK — instead of
[rows, vocab]: the bans remove at most BANNED of a row's best tokens, so with k = 2·beam + BANNED each row's, and
each sentence's, 2·beam best allowed candidates (what `torch.topk` over [beams·vocab] finds) are among them. The
options that reshape a distribution (repetition control, sampling: processing.py) fetch it whole instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from .processing import NO_TOKEN, draw, log_softmax, penalise, prefix_array, sampling_generators, top_k
from .search import Hypothesis, RowLimits, Search, SearchError, greedy_hypotheses, normalised, strip

BANNED = 3  # tokens the search may ban from a row (pad, bos, eos): fetch this many extra best tokens


class SearchVocab(NamedTuple):
    """What the search needs of a vocabulary."""

    size: int
    pad_id: int
    bos_id: int
    eos_id: int


class Step(Protocol):
    """A decoding state over the live rows (the runtime's `Stepper`)."""

    def __call__(self, last: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """last [N] tokens at position t → every row's k best (log-prob [N, k] f32, token [N, k]), descending."""
        ...

    def full(self, last: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """last [N] tokens at position t → every row's whole (logits [N, W] f32, log-probs [N, W] f32) and the
        token id of each column ([W] sorted ids over a shortlist; None: column = token id, W = vocabulary)."""
        ...

    def select(self, rows: np.ndarray) -> None:
        """Continue from these rows of the last step (beam reordering, finished sentences leaving)."""
        ...


def never_emitted(pad_id: int, bos_id: int, eos_id: int) -> list[int]:
    """The tokens no search emits: pad, and the decoder's start token unless it is eos (fairseq's models start from
    eos, which still ends a hypothesis)."""
    return [pad_id] if bos_id in (pad_id, eos_id) else [pad_id, bos_id]


def _mask(lp: np.ndarray, tok: np.ndarray, no_eos: np.ndarray, at_limit: np.ndarray, vocab: SearchVocab) -> None:
    """The bans on a row's best-token list: pad and bos always (never_emitted), eos on rows still short of their
    min_len (`no_eos` [N]); a row at its length limit gets only eos (log-prob 0). In place on lp/tok [N, k]."""
    banned = (tok == vocab.eos_id) & no_eos[:, None]  # [N, k]
    for token in never_emitted(vocab.pad_id, vocab.bos_id, vocab.eos_id):
        banned |= tok == token
    lp[banned] = -np.inf
    if at_limit.any():
        lp[at_limit] = -np.inf
        lp[at_limit, 0] = 0.0
        tok[at_limit, 0] = vocab.eos_id


class Given(NamedTuple):
    """What a search is given per sentence beyond its lengths: its target prefix and, when sampling, the
    generators its rows draw with (processing.py)."""

    prefix: np.ndarray  # [B, P] the first output tokens of every sentence, NO_TOKEN-padded ([B, 0]: none)
    generators: list[np.random.Generator] | None = None  # one per sentence (greedy row) when sampling

    @property
    def prefix_lengths(self) -> np.ndarray:
        """[B] how many output tokens each sentence is given."""
        return (self.prefix != NO_TOKEN).sum(1)


def given_for(
    sentences: int,
    search: Search,
    prefixes: Sequence[Sequence[int]] | None = None,
    sample_keys: Sequence[tuple[int, int]] | None = None,
) -> Given:
    """A search's per-sentence givens: `prefixes` (token ids, one list per sentence) and the sampling
    generators, keyed by (sentence index in its call, sample index) — default (i, 0) for sentence i."""
    generators = None
    if search.sampling:
        keys = [(i, 0) for i in range(sentences)] if sample_keys is None else sample_keys
        generators = sampling_generators(search.seed, keys)
    return Given(prefix_array(prefixes, sentences), generators)


def sample_rows(sentences: int, n: int, keys: Sequence[int] | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Sampling n hypotheses per sentence runs greedy's loop over every sentence n times: (the sentence of every
    row [B·n], each row's generator key (the sentence's key — its index in its call, `keys` — and the sample's))."""
    rows = np.repeat(np.arange(sentences, dtype=np.int64), n)
    named = list(range(sentences)) if keys is None else [int(k) for k in keys]
    return rows, [(named[s], j) for s in range(sentences) for j in range(n)]


def samples_by_sentence(hyps: Sequence[Hypothesis], n: int) -> list[list[Hypothesis]]:
    """Greedy's hypotheses over `sample_rows`' rows → per sentence its n samples, best score first (draw order
    among equal scores)."""
    return [sorted(hyps[i : i + n], key=lambda h: -h.score) for i in range(0, len(hyps), n)]


def _token_ids(columns: np.ndarray | None, col: np.ndarray) -> np.ndarray:
    """Columns of a step's scores → token ids."""
    return col if columns is None else columns[col]


def _processed(
    step: Step, tokens: np.ndarray, t: int, k: int, search: Search, greedy_step: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """A step over every row's whole distribution with the repetition options applied (processing.py): (the k
    best log-probs [N, k] and tokens [N, k] — greedy: of the penalised logits' softmax, beam: of the penalised
    log-probs — then the penalised logits [N, W] and the columns' token ids) — what sampling draws from too."""
    logits, log_probs, columns = step.full(tokens[:, -1], t)
    args = (tokens, columns, search.repetition_penalty, search.no_repeat_ngram_size)  # tokens: the start token too
    if greedy_step:
        logits = penalise(logits, *args)
        scores = log_softmax(logits)
    else:
        scores = penalise(log_probs, *args)
    lp, col = top_k(scores, k)
    return lp, _token_ids(columns, col), logits, columns


def _sampled(
    step: Step,
    tokens: np.ndarray,
    t: int,
    search: Search,
    vocab: SearchVocab,
    no_eos: np.ndarray,
    draw_rows: np.ndarray,
    given: Given,
) -> tuple[np.ndarray, np.ndarray]:
    """One drawn token per row in `draw_rows` (log-prob [N, 1] under the penalised distribution, token [N, 1];
    the other rows get pad at -inf for the caller to force)."""
    assert given.generators is not None
    logits, _, columns = step.full(tokens[:, -1], t)
    logits = penalise(logits, tokens, columns, search.repetition_penalty, search.no_repeat_ngram_size)
    width = logits.shape[1]
    ids = np.arange(width) if columns is None else columns  # [W] token id of every column
    allowed = ~np.isin(ids, never_emitted(vocab.pad_id, vocab.bos_id, vocab.eos_id))[None, :].repeat(len(logits), 0)
    allowed[no_eos] &= ids != vocab.eos_id
    col = draw(logits, allowed, search.temperature, search.top_k, search.top_p, given.generators, draw_rows)
    lp = np.full((len(logits), 1), -np.inf, dtype=np.float32)
    tok = np.full((len(logits), 1), vocab.pad_id, dtype=np.int64)
    if draw_rows.size:
        picked = col[draw_rows]
        lp[draw_rows, 0] = log_softmax(logits[draw_rows])[np.arange(draw_rows.size), picked]
        tok[draw_rows, 0] = _token_ids(columns, picked)
    return lp, tok


def _best_tokens(
    step: Step,
    tokens: np.ndarray,
    t: int,
    k: int,
    no_eos: np.ndarray,
    at_limit: np.ndarray,
    vocab: SearchVocab,
    search: Search,
    forced: np.ndarray | None,
    ended: np.ndarray | None = None,
    given: Given | None = None,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The k best (log-prob [N, k], token [N, k]) of every row at position t after the bans, and whether the
    decoder ran (the step's attention is this position's); `tokens` [N, t+1]
    every row's tokens so far (start token first), `no_eos` [N]: rows that may not end yet, `ended` [N]: rows
    that have finished already (greedy keeps them as padding), `forced` [N]: a row's given prefix token at t+1
    (NO_TOKEN: none; it comes at log-prob 0, not counted, as eos at the limit). A step where every row must end
    or is given its token does not fetch a distribution; one where every row must end (at its limit or finished)
    does not run the decoder at all: eos at log-prob 0 is all it could give. Measured:
    results/runtime/docstring_figures.md."""
    must_end = at_limit if ended is None else at_limit | ended
    if must_end.all():
        shape = (len(must_end), min(k, vocab.size))  # what the decoder's top-k would have returned
        lp, tok = np.zeros(shape, dtype=np.float32), np.full(shape, vocab.eos_id, dtype=np.int64)
        _mask(lp, tok, no_eos, must_end, vocab)
        return lp, tok, False
    is_forced = None if forced is None else forced != NO_TOKEN  # None: past every prefix (no numpy work per step)
    if not search.processed or (is_forced is not None and (must_end | is_forced).all()):
        lp, tok = step(tokens[:, -1], t, k)
    elif search.sampling:
        assert given is not None
        free = must_end if is_forced is None else must_end | is_forced
        lp, tok = _sampled(step, tokens, t, search, vocab, no_eos, np.flatnonzero(~free), given)
    else:
        lp, tok = _processed(step, tokens, t, k, search, greedy_step=ended is not None)[:2]
    _mask(lp, tok, no_eos, at_limit, vocab)
    if is_forced is not None and is_forced.any():
        assert forced is not None
        lp[is_forced] = -np.inf
        lp[is_forced, 0] = 0.0
        tok[is_forced, 0] = forced[is_forced]
    return lp, tok, True


def _attended(step: Step, rows: int, ran: bool) -> np.ndarray:
    """[N] the source position each row's last decoder run attended to most (the step's `attention` [N, S], kept
    by steppers asked for alignments); -1 where the decoder did not run (only eos was left: it has no token)."""
    attention = getattr(step, "attention", None)
    if not ran or attention is None:
        return np.full(rows, -1, dtype=np.int64)
    return attention.argmax(-1).astype(np.int64)


def _aligning(step: Step) -> bool:
    """Whether the step keeps its attention (a stepper asked for alignments)."""
    return bool(getattr(step, "alignments", False))


def _forced_at(given: Given, sentence_of_row: np.ndarray, t: int) -> np.ndarray | None:
    """[N] each row's given token at output position t+1 (NO_TOKEN: none); None past every prefix."""
    if t >= given.prefix.shape[1]:
        return None
    return given.prefix[sentence_of_row, t]


def check_prefixes(
    prefixes: Sequence[Sequence[int]], limits: RowLimits, vocab: SearchVocab, rows: Sequence[int] | None = None
) -> None:
    """SearchError unless every sentence's prefix is token ids the search may emit (not pad, bos or eos) and
    leaves room for eos within its length limit; the message names sentence i as `rows[i]` (default i)."""
    if len(prefixes) != len(limits.max_len):
        raise SearchError(f"got {len(prefixes)} target prefixes for {len(limits.max_len)} sources; give one per source")
    never = {*never_emitted(vocab.pad_id, vocab.bos_id, vocab.eos_id), vocab.eos_id}
    for i, ids in enumerate(prefixes):
        row = i if rows is None else rows[i]
        if any(not 0 <= int(x) < vocab.size or int(x) in never for x in ids):
            raise SearchError(f"target prefix {row} holds token ids outside the vocabulary or pad/bos/eos")
        if len(ids) >= int(limits.max_len[i]):
            raise SearchError(
                f"target prefix {row} has {len(ids)} tokens but the output length limit is {int(limits.max_len[i])} "
                "tokens counting eos; give a shorter prefix or raise max_len_a/max_len_b"
            )


def greedy(
    step: Step, limits: RowLimits, search: Search, vocab: SearchVocab, given: Given | None = None
) -> list[Hypothesis]:
    """Argmax decoding — or, with `search.sampling`, a draw per token — of B sentences within their length
    bounds `limits`, each continuing its given prefix (`given`): one hypothesis per sentence, scored as beam
    search scores."""
    min_len, max_len = limits
    b = len(max_len)
    given = given or given_for(b, search)
    tokens = np.full((b, 1), vocab.bos_id, dtype=np.int64)  # [B, t+1]
    finished = np.zeros(b, dtype=bool)
    total = np.zeros(b, dtype=np.float32)  # [B] summed log-probs of the emitted tokens, eos included
    rows = np.arange(b)
    aligning = _aligning(step)
    aligned = np.zeros((b, 0), dtype=np.int64)  # [B, t] per emitted token its source position (alignments)
    for t in range(int(max_len.max())):
        forced = _forced_at(given, rows, t)
        lp, tok, ran = _best_tokens(
            step, tokens, t, BANNED + 1, min_len > t, max_len <= t + 1, vocab, search, forced, finished, given
        )
        if aligning:
            aligned = np.concatenate([aligned, _attended(step, b, ran)[:, None]], axis=1)
        best = lp.argmax(-1)  # [B] first maximum = lowest id among ties, as argmax
        total += np.where(finished, np.float32(0), lp[rows, best])
        nxt = tok[rows, best]
        nxt[finished] = vocab.pad_id
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        finished |= nxt == vocab.eos_id
        if finished.all():
            break
    return greedy_hypotheses(
        tokens.tolist(),
        total.tolist(),
        search.len_penalty,
        vocab.eos_id,
        vocab.pad_id,
        given.prefix_lengths,
        aligned.tolist() if aligning else None,
    )


def beam_first_rows(beam_size: int, vocab_size: int) -> int:
    """Rows per sentence of beam search's first step. All beams start as the same bos hypothesis, whose 2K
    candidates come from beam 0 alone (the others score -inf), so one row per sentence gives them for 1/K of the
    step — if a row's list holds 2K allowed tokens: a smaller vocabulary (test models) starts with K rows.
    Measured: results/runtime/docstring_figures.md."""
    return 1 if min(2 * beam_size + BANNED, vocab_size) - BANNED >= 2 * beam_size else beam_size


def beam(
    step: Step, first_rows: int, limits: RowLimits, search: Search, vocab: SearchVocab, given: Given | None = None
) -> list[list[Hypothesis]]:
    """Beam search of B sentences within their length bounds `limits`, each continuing its given prefix
    (`given`), `step` starting on `first_rows` consecutive rows per sentence (`beam_first_rows`): every finished
    hypothesis per sentence (beam_size of them; fewer only when the length limit is 1 token), best first — the
    first finished wins ties."""
    k, g = search.beam_size, first_rows  # g: rows per sentence this step
    min_len, max_len = limits
    b = len(max_len)
    given = given or given_for(b, search)
    given_len = given.prefix_lengths  # [B]
    active = np.arange(b)  # original sentence ids still searching
    tokens = np.full((b * g, 1), vocab.bos_id, dtype=np.int64)  # [n*g, t+1]
    scores = np.full((b, g), -np.inf, dtype=np.float32)  # [n, g]
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step yields distinct ones
    finals: list[list[Hypothesis]] = [[] for _ in range(b)]
    arange2k = np.arange(2 * k)
    aligning = _aligning(step)
    aligned = np.zeros((b * g, 0), dtype=np.int64)  # [n*g, t] per row's emitted token its source position
    for t in range(int(max_len.max())):
        n = active.size
        at_limit = np.repeat(max_len[active] <= t + 1, g)  # [n*g]
        no_eos = np.repeat(min_len[active] > t, g)  # [n*g]
        forced = _forced_at(given, np.repeat(active, g), t) if t < given.prefix.shape[1] else None  # [n*g]
        lp, tok, ran = _best_tokens(step, tokens, t, 2 * k + BANNED, no_eos, at_limit, vocab, search, forced)
        attended = _attended(step, n * g, ran) if aligning else None  # [n*g]: for the token each row adds now
        c = lp.shape[1]
        # torch.topk(2K) over [n, K*V] finds the same finite candidates among each row's c best
        cand = (scores.reshape(-1, 1) + lp).reshape(n, g * c)
        flat_tok = tok.reshape(n, g * c)
        flat_id = (np.arange(g * c) // c)[None, :] * vocab.size + flat_tok  # beam*V + token: tie order
        top = np.lexsort((flat_id, -cand), axis=1)[:, : 2 * k]  # [n, 2K] sorted by score desc
        top_scores = np.take_along_axis(cand, top, 1)
        beam_idx, token_idx = top // c, np.take_along_axis(flat_tok, top, 1)
        is_eos = (token_idx == vocab.eos_id) & (top_scores > -np.inf)
        done = np.zeros(n, dtype=bool)
        if is_eos.any():
            prefix = tokens.reshape(n, g, -1)
            for r, j in zip(*np.nonzero(is_eos), strict=True):
                bucket = finals[int(active[r])]
                if len(bucket) < k and j < k:  # only eos among the top K counts, as fairseq
                    hyp = strip(prefix[r, beam_idx[r, j], 1:].tolist(), vocab.eos_id, vocab.pad_id)
                    scored = t + 1 - int(given_len[active[r]])  # tokens after the given prefix, eos included
                    score = normalised(float(top_scores[r, j]), scored, search.len_penalty)
                    row_aligned = aligned[r * g + beam_idx[r, j], : len(hyp)].tolist() if aligning else None
                    bucket.append(Hypothesis(hyp, score, row_aligned))
            done = np.array([len(finals[int(s)]) >= k for s in active])
        # at its length limit a sentence has nothing left to continue (every candidate was eos): it leaves now,
        # not when the batch ends, even with fewer than K finished (a 1-token limit leaves the empty one alone)
        done |= max_len[active] <= t + 1
        # continue with the best K non-eos candidates of every live sentence
        keep = np.argsort(arange2k[None, :] + is_eos * (2 * k), axis=1, kind="stable")[:, :k]  # [n, K]
        new_scores = np.take_along_axis(top_scores, keep, 1)
        new_beams = np.take_along_axis(beam_idx, keep, 1)
        new_tokens = np.take_along_axis(token_idx, keep, 1)
        live = np.nonzero(~done)[0]
        if live.size == 0:
            break
        rows = (live[:, None] * g + new_beams[live]).reshape(-1)  # rows of tokens/cache to continue
        tokens = np.concatenate([tokens[rows], new_tokens[live].reshape(-1, 1)], axis=1)
        if attended is not None:
            aligned = np.concatenate([aligned[rows], attended[rows][:, None]], axis=1)
        scores = new_scores[live]
        active = active[live]
        step.select(rows)
        g = k
    return [sorted(bucket, key=lambda h: -h.score) for bucket in finals]  # stable: first finished wins ties
