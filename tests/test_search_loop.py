"""The runtime's search loop (export/runtime/search_loop.py) tested alone against references written from its rules:
a scripted step (fixed log-probs per sentence and decoder input) stands in for the decoder — no model, ORT or torch."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from export.runtime.search import RowLimits, Search, SearchError
from export.runtime.search_loop import (
    BANNED,
    SearchVocab,
    beam,
    beam_first_rows,
    check_prefixes,
    given_for,
    greedy,
    sample_rows,
    samples_by_sentence,
)

V, PAD, BOS, EOS = 8, 0, 1, 2
VOCAB = SearchVocab(V, PAD, BOS, EOS)
SCALE = 2.0  # logits' spread: peaky enough that greedy, beam and the beam widths disagree
EOS_RISE = 0.6  # eos' logit grows with the decoder input's length, so hypotheses end at different lengths
FLAT = 0  # the sentence whose every next-token distribution is uniform: every candidate ties

Ref = tuple[list[int], float]  # a reference hypothesis: its tokens (no bos/eos) and its score


# ---- the scripted decoder ---------------------------------------------------------------------------------------


@functools.cache
def model_logits(sentence: int, history: tuple[int, ...]) -> np.ndarray:
    """The scripted decoder's next-token logits [V] f32: a fixed function of the sentence and its decoder input so
    far (start token first) — no ties, in practice, except in sentence FLAT (all ties)."""
    if sentence == FLAT:
        out = np.zeros(V, dtype=np.float32)
    else:
        rng = np.random.default_rng([sentence, len(history), *history])
        logits = SCALE * rng.standard_normal(V)  # [V]
        logits[EOS] += EOS_RISE * len(history) - 2.0
        out = logits.astype(np.float32)
    out.flags.writeable = False
    return out


def ref_log_softmax(x: np.ndarray) -> np.ndarray:
    """[V] scores → log-probs [V] f32 (in float64; -inf stays -inf)."""
    x = x.astype(np.float64)
    top = x[np.isfinite(x)].max()
    return (x - top - np.log(np.exp(x - top).sum())).astype(np.float32)


@functools.cache
def model_log_probs(sentence: int, history: tuple[int, ...]) -> np.ndarray:
    out = ref_log_softmax(model_logits(sentence, history))
    out.flags.writeable = False
    return out


class ScriptedStep:
    """A `Step` over the scripted decoder: every row keeps its sentence and decoder input (appending each call's
    `last`, reordered by `select`) and records what the loop asked of it."""

    def __init__(self, sentences: Sequence[int]) -> None:
        self.sentence = [int(s) for s in sentences]  # [N] the scripted sentence of every row
        self.history: list[list[int]] = [[] for _ in self.sentence]  # [N] each row's decoder input so far
        self.calls: list[tuple[int, int | None, list[int]]] = []  # (t, k (None: full), the rows' sentences)
        self.selects: list[list[int]] = []

    def _advance(self, last: np.ndarray, t: int, k: int | None) -> None:
        assert last.dtype == np.int64 and last.shape == (len(self.sentence),)
        assert t > 0 or (last == BOS).all()
        for h, token in zip(self.history, last.tolist(), strict=True):
            assert len(h) == t  # one call per position, none skipped
            h.append(token)
        self.calls.append((t, k, list(self.sentence)))

    def _rows(self, table) -> np.ndarray:
        return np.stack([table(s, tuple(h)) for s, h in zip(self.sentence, self.history, strict=True)])  # [N, V]

    def __call__(self, last: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        self._advance(last, t, k)
        lp = self._rows(model_log_probs)  # [N, V]
        ids = np.broadcast_to(np.arange(V), lp.shape)  # [N, V]
        order = np.lexsort((ids, -lp), axis=1)[:, : min(k, V)]  # [N, k] best first, lower id among ties
        return np.take_along_axis(lp, order, 1), order.astype(np.int64)

    def full(self, last: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray, None]:
        self._advance(last, t, None)
        return self._rows(model_logits), self._rows(model_log_probs), None  # [N, V] each

    def select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows).tolist()
        self.selects.append(rows)
        self.sentence = [self.sentence[r] for r in rows]
        self.history = [list(self.history[r]) for r in rows]


def limits_of(min_len: Sequence[int], max_len: Sequence[int]) -> RowLimits:
    return RowLimits(np.asarray(min_len, dtype=np.int64), np.asarray(max_len, dtype=np.int64))


def run_beam(sentences, limits, search, prefixes=None):
    """The loop's beam search as generation.search_batch drives it: `beam_first_rows` rows per sentence first."""
    g = beam_first_rows(search.beam_size, V)
    step = ScriptedStep(np.repeat(sentences, g))
    out = beam(step, g, limits, search, VOCAB, given_for(len(sentences), search, prefixes))
    return [[(h.tokens, h.score) for h in hyps] for hyps in out], step


def run_greedy(sentences, limits, search, prefixes=None):
    step = ScriptedStep(sentences)
    out = greedy(step, limits, search, VOCAB, given_for(len(sentences), search, prefixes))
    return [(h.tokens, h.score) for h in out], step


def run_sampling(sentences, limits, search, prefixes=None, keys=None):
    """Sampling as search_batch drives it: greedy's loop over every sentence num_hypotheses times, each row with
    the generator of (its sentence's key, the sample's index)."""
    n = search.num_hypotheses
    rows, row_keys = sample_rows(len(sentences), n, keys)  # rows [B·n]: the sentence of every row
    given = given_for(len(rows), search, None if prefixes is None else [prefixes[i] for i in rows], row_keys)
    step = ScriptedStep(np.asarray(sentences)[rows])
    hyps = greedy(step, limits.take(rows), search, VOCAB, given)
    return [[(h.tokens, h.score) for h in sample] for sample in samples_by_sentence(hyps, n)]


def assert_same(got: Sequence[Ref], want: Sequence[Ref]) -> None:
    """Equal tokens, scores to 1e-5, in order."""
    assert [h[0] for h in got] == [h[0] for h in want]
    np.testing.assert_allclose([h[1] for h in got], [h[1] for h in want], rtol=0, atol=1e-5)


# ---- references: one sentence at a time, plain Python, from the documented rules ---------------------------------


def ref_penalised(scores: np.ndarray, history: Sequence[int], search: Search) -> np.ndarray:
    """processing.py's rules on one row's scores [V]: a token already in the decoder input (start token included)
    has s·p where s < 0, else s/p; a token that would complete an n-gram already in it gets -inf."""
    out = scores.copy()
    p = np.float32(search.repetition_penalty)
    for v in set(history):
        out[v] = out[v] * p if out[v] < 0 else out[v] / p
    n = search.no_repeat_ngram_size
    if n:
        seen = {tuple(history[i : i + n]) for i in range(len(history) - n + 1)}
        for v in range(V):
            if (*history[len(history) - n + 1 :], v) in seen:
                out[v] = -np.inf
    return out


def ref_scores(sentence: int, history: tuple[int, ...], search: Search, greedy_step: bool) -> np.ndarray:
    """One row's next-token scores [V]: the model's log-probs; with repetition options greedy penalises the logits
    before the softmax, beam search the log-probs."""
    if search.repetition_penalty == 1.0 and not search.no_repeat_ngram_size:
        return model_log_probs(sentence, history)
    if greedy_step:
        return ref_log_softmax(ref_penalised(model_logits(sentence, history), history, search))
    return ref_penalised(model_log_probs(sentence, history), history, search)


def ref_candidates(scores: np.ndarray, t: int, min_len: int, max_len: int, prefix: Sequence[int]):
    """(log-prob, token) the output's token t+1 may be: the given prefix token at log-prob 0, eos at log-prob 0 at
    the length limit, else any token but pad and bos (and eos before min_len) that is not banned."""
    if t < len(prefix):
        return [(np.float32(0), prefix[t])]
    if t + 1 >= max_len:
        return [(np.float32(0), EOS)]
    banned = {PAD, BOS} | ({EOS} if t < min_len else set())
    return [(scores[v], v) for v in range(V) if v not in banned and scores[v] > -np.inf]


def ref_normalised(total: float, length: int, len_penalty: float) -> float:
    return float(total) / float(length) ** len_penalty


def ref_greedy(sentence: int, search: Search, min_len: int, max_len: int, prefix: Sequence[int] = ()) -> Ref:
    """Argmax decoding of one sentence: the best candidate each step, the lowest id among equal ones."""
    history, total = [BOS], np.float32(0)
    for t in range(max_len):
        scores = ref_scores(sentence, tuple(history), search, greedy_step=True)
        lp, token = min(ref_candidates(scores, t, min_len, max_len, prefix), key=lambda c: (-c[0], c[1]))
        total = np.float32(total + lp)
        history.append(token)
        if token == EOS:
            break
    tokens = history[1:-1]
    return tokens, ref_normalised(total, len(tokens) + 1 - len(prefix), search.len_penalty)


class RefBeam:
    """Beam search of one sentence by the rules of `beam`'s docstring: the 2K best candidates of all beams by
    summed log-prob (ties: beam·V + token first), an eos among the top K finishes a hypothesis while the sentence
    has fewer than K, the best K non-eos candidates continue; scores normalised by the length counting eos (after
    the prefix). Also keeps when the sentence was done and whether a new best beam ever came from another beam."""

    def __init__(self, sentence: int, search: Search, min_len: int, max_len: int, prefix: Sequence[int] = ()):
        k = search.beam_size
        beams: list[tuple[tuple[int, ...], np.float32]] = [((), np.float32(0))]  # best first
        finished: list[Ref] = []
        self.done_at: int | None = None  # the step at which it reached K hypotheses (None: never, a 1-token limit)
        self.reordered = False
        for t in range(max_len):
            cands = []
            for i, (toks, total) in enumerate(beams):
                scores = ref_scores(sentence, (BOS, *toks), search, greedy_step=False)
                for lp, v in ref_candidates(scores, t, min_len, max_len, prefix):
                    cands.append((np.float32(total + lp), i * V + v, i, v))
            top = sorted(cands, key=lambda c: (-c[0], c[1]))[: 2 * k]
            for total, _, i, v in top[:k]:
                if v == EOS and len(finished) < k:
                    length = t + 1 - len(prefix)
                    finished.append((list(beams[i][0]), ref_normalised(total, length, search.len_penalty)))
            if len(finished) >= k:
                self.done_at = t
                break
            kept = [c for c in top if c[3] != EOS][:k]
            if not kept:
                break
            self.reordered |= kept[0][2] != 0
            beams = [((*beams[i][0], v), total) for total, _, i, v in kept]
        self.hyps = sorted(finished, key=lambda h: -h[1])  # stable: the first finished wins ties


def ref_score(sentence: int, tokens: Sequence[int], prefix: Sequence[int], max_len: int, len_penalty: float) -> float:
    """Teacher-forced score of an output: the model's log-probs of the tokens after the prefix and of eos (0 where
    eos was forced at the length limit), summed and normalised by their count."""
    history, total = [BOS, *tokens[: len(prefix)]], 0.0
    for token in [*tokens[len(prefix) :], EOS]:
        forced = token == EOS and len(history) == max_len
        total += 0.0 if forced else float(model_log_probs(sentence, tuple(history))[token])
        history.append(token)
    return ref_normalised(total, len(tokens) + 1 - len(prefix), len_penalty)


def repeats(tokens: Sequence[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


# ---- the tests ----------------------------------------------------------------------------------------------------

SENTENCES = [3, 14, 15, 92]  # the scripted decoder's sentence ids
LIMITS = limits_of(min_len=[2, 0, 4, 1], max_len=[7, 1, 5, 9])  # sentence 14: a length limit of 1 token


@pytest.mark.parametrize(("beam_size", "len_penalty"), [(2, 1.0), (3, 0.6), (3, 1.3)])
def test_beam_search_equals_a_reference_beam_search(beam_size: int, len_penalty: float) -> None:
    search = Search(beam_size=beam_size, len_penalty=len_penalty)
    got, step = run_beam(SENTENCES, LIMITS, search)
    refs = [RefBeam(s, search, *lims) for s, *lims in zip(SENTENCES, *LIMITS, strict=True)]
    for i, (hyps, ref) in enumerate(zip(got, refs, strict=True)):
        assert_same(hyps, ref.hyps)
        assert len(hyps) == (1 if LIMITS.max_len[i] == 1 else beam_size)
        for tokens, score in hyps:
            assert LIMITS.min_len[i] <= len(tokens) < LIMITS.max_len[i]
            assert score == pytest.approx(ref_score(SENTENCES[i], tokens, (), LIMITS.max_len[i], len_penalty), abs=1e-5)
    # the case the loop's row reordering exists for: a new best beam continuing another than the last best one
    assert any(ref.reordered for ref in refs)
    assert any(rows != sorted(rows) for rows in step.selects)
    assert {k for _, k, _ in step.calls} == {2 * beam_size + BANNED}  # the loop fetches what its bans may remove
    # the first step: one row per sentence where a row's 2K + BANNED best hold 2K allowed tokens (V = 8: beam 2),
    # else K rows
    assert step.calls[0][2] == [s for s in SENTENCES for _ in range(1 if beam_size == 2 else beam_size)]


@pytest.mark.parametrize("beam_size", [1, 2, 3])
def test_sentences_with_different_limits_in_one_batch_get_what_they_get_alone(beam_size: int) -> None:
    search = Search(beam_size=beam_size)
    run = run_greedy if beam_size == 1 else run_beam
    batched, step = run(SENTENCES, LIMITS, search)
    for i, s in enumerate(SENTENCES):
        alone, _ = run([s], LIMITS.take([i]), search)
        assert batched[i] == alone[0]
    if beam_size > 1:  # a sentence with K hypotheses, or at its length limit, leaves the batch: the step sees its
        for s, *lims in zip(SENTENCES, *LIMITS, strict=True):  # rows until then only
            done = RefBeam(s, search, *lims).done_at
            last = int(lims[1]) - 1 if done is None else min(done, int(lims[1]) - 1)
            stepped = [t for t, _, _ in step.calls]
            assert [t for t, _, rows in step.calls if s in rows] == [t for t in stepped if t <= last]


@pytest.mark.parametrize("beam_size", [1, 2, 3])
@pytest.mark.parametrize("lengths", [[3, 1, 5], [4], [1]])
def test_a_step_where_every_row_must_end_is_not_called(beam_size: int, lengths: list[int]) -> None:
    # forced lengths: n tokens counting eos, eos banned before; n - 1 steps, the n-th is eos at the limit alone
    limits = limits_of([n - 1 for n in lengths], lengths)
    search = Search(beam_size=beam_size)
    sentences = SENTENCES[: len(lengths)]
    if beam_size == 1:
        got, step = run_greedy(sentences, limits, search)
        outputs = [[h] for h in got]
    else:
        outputs, step = run_beam(sentences, limits, search)
    assert len(step.calls) == max(lengths) - 1
    assert [t for t, _, _ in step.calls] == list(range(max(lengths) - 1))
    for hyps, n in zip(outputs, lengths, strict=True):
        assert hyps and all(len(tokens) == n - 1 for tokens, _ in hyps)


@pytest.mark.parametrize("len_penalty", [1.0, 0.5])
def test_greedy_search_equals_a_reference_greedy_search(len_penalty: float) -> None:
    search = Search(beam_size=1, len_penalty=len_penalty)
    got, step = run_greedy(SENTENCES, LIMITS, search)
    want = [ref_greedy(s, search, *lims) for s, *lims in zip(SENTENCES, *LIMITS, strict=True)]
    assert_same(got, want)
    for i, (tokens, score) in enumerate(got):
        assert score == pytest.approx(ref_score(SENTENCES[i], tokens, (), LIMITS.max_len[i], len_penalty), abs=1e-5)
    assert {k for _, k, _ in step.calls} == {1 + BANNED}
    # greedy and beam search disagree somewhere, or the beam tests would not show the beam's own rules
    assert [h[0] for h in got] != [hyps[0][0] for hyps in run_beam(SENTENCES, LIMITS, Search(beam_size=3))[0]]


@pytest.mark.parametrize("beam_size", [1, 2, 3])
def test_ties_go_to_the_lower_beam_and_token_and_the_first_finished(beam_size: int) -> None:
    # uniform distributions: every candidate of a step ties with its beam's others, and the beams tie with each other
    search = Search(beam_size=beam_size)
    limits = limits_of(min_len=[0, 2, 3], max_len=[4, 4, 6])
    if beam_size == 1:
        got, _ = run_greedy([FLAT] * 3, limits, search)
        assert [tokens for tokens, _ in got] == [[], [3, 3], [3, 3, 3]]  # eos (id 2) is the lowest id allowed
        assert_same(got, [ref_greedy(FLAT, search, *lims) for lims in zip(*limits, strict=True)])
        return
    got, _ = run_beam([FLAT] * 3, limits, search)
    for hyps, lims in zip(got, zip(*limits, strict=True), strict=True):
        assert_same(hyps, RefBeam(FLAT, search, *lims).hyps)
    # min_len 0: eos, the lowest id, finishes first; then beam 0's eos (the empty hypothesis' best extension, 3)
    assert [tokens for tokens, _ in got[0]] == [[], [3], [3, 3]][:beam_size]


PREFIXES = [[5, 6], [], [3, 3, 4], [7]]  # LIMITS' sentences; the third: one free token (min_len 4), then eos at 5


@pytest.mark.parametrize("beam_size", [1, 2, 3])
def test_a_given_prefix_starts_the_output_and_is_not_scored(beam_size: int) -> None:
    search = Search(beam_size=beam_size, len_penalty=0.8)
    check_prefixes(PREFIXES, LIMITS, VOCAB)
    if beam_size == 1:
        got, _ = run_greedy(SENTENCES, LIMITS, search, PREFIXES)
        outputs = [[h] for h in got]
        want = [[ref_greedy(s, search, *x)] for s, *x in zip(SENTENCES, *LIMITS, PREFIXES, strict=True)]
    else:
        outputs, _ = run_beam(SENTENCES, LIMITS, search, PREFIXES)
        want = [RefBeam(s, search, *x).hyps for s, *x in zip(SENTENCES, *LIMITS, PREFIXES, strict=True)]
    for i, (hyps, ref) in enumerate(zip(outputs, want, strict=True)):
        assert_same(hyps, ref)
        for tokens, score in hyps:
            assert tokens[: len(PREFIXES[i])] == PREFIXES[i]
            assert LIMITS.min_len[i] <= len(tokens) < LIMITS.max_len[i]
            scored = ref_score(SENTENCES[i], tokens, PREFIXES[i], LIMITS.max_len[i], search.len_penalty)
            assert score == pytest.approx(scored, abs=1e-5)


@pytest.mark.parametrize(
    ("prefixes", "max_len", "rows", "message"),
    [
        ([[3], [4, EOS]], [3, 4], None, "target prefix 1 holds token ids outside the vocabulary or pad/bos/eos"),
        ([[PAD], [4]], [3, 4], None, "target prefix 0 holds token ids outside the vocabulary or pad/bos/eos"),
        ([[3], [BOS]], [3, 4], [7, 9], "target prefix 9 holds token ids outside the vocabulary or pad/bos/eos"),
        ([[V], [4]], [3, 4], None, "target prefix 0 holds token ids outside the vocabulary or pad/bos/eos"),
        ([[3, 4, 5], [4]], [3, 4], None, "target prefix 0 has 3 tokens but the output length limit is 3 tokens"),
        ([[3], [4]], [3, 1], None, "target prefix 1 has 1 tokens but the output length limit is 1 tokens counting"),
        ([[3]], [3, 4], None, "got 1 target prefixes for 2 sources; give one per source"),
    ],
)
def test_check_prefixes_refuses_what_the_search_cannot_take(prefixes, max_len, rows, message: str) -> None:
    check_prefixes([[3, 4], [5, 6, 7]], limits_of([0, 0], [3, 4]), VOCAB)  # room for eos left: taken
    with pytest.raises(SearchError, match=message):
        check_prefixes(prefixes, limits_of([0, 0], max_len), VOCAB, rows)


NGRAM_LIMITS = limits_of(min_len=[6, 8, 4, 7], max_len=[12, 11, 10, 12])


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize(
    ("ngram", "penalty"),
    [(2, 1.0), (3, 1.0), (0, 1.8), (0, 0.6), (2, 1.5)],
    ids=["ng2", "ng3", "rp1.8", "rp0.6", "both"],
)
def test_repetition_options_equal_a_reference(beam_size: int, ngram: int, penalty: float) -> None:
    search = Search(beam_size=beam_size, no_repeat_ngram_size=ngram, repetition_penalty=penalty)
    plain = Search(beam_size=beam_size)
    if beam_size == 1:
        got = [[h] for h in run_greedy(SENTENCES, NGRAM_LIMITS, search)[0]]
        unbanned = [[h] for h in run_greedy(SENTENCES, NGRAM_LIMITS, plain)[0]]
        want = [[ref_greedy(s, search, *lims)] for s, *lims in zip(SENTENCES, *NGRAM_LIMITS, strict=True)]
    else:
        got, _ = run_beam(SENTENCES, NGRAM_LIMITS, search)
        unbanned, _ = run_beam(SENTENCES, NGRAM_LIMITS, plain)
        want = [RefBeam(s, search, *lims).hyps for s, *lims in zip(SENTENCES, *NGRAM_LIMITS, strict=True)]
    for hyps, ref in zip(got, want, strict=True):
        assert_same(hyps, ref)
        assert all(math.isfinite(score) for _, score in hyps)
    assert got != unbanned  # the options changed something
    if ngram:  # no n-gram twice in any output (its decoder input: the start token too) — which plain search repeats
        assert not any(repeats([BOS, *tokens], ngram) for hyps in got for tokens, _ in hyps)
        assert any(repeats([BOS, *tokens], ngram) for hyps in unbanned for tokens, _ in hyps)


def ref_allowed_draws(sentence: int, history: Sequence[int], t: int, min_len: int, search: Search) -> set[int]:
    """The tokens a draw may give at position t: the allowed tokens' logits / temperature, the top_k most likely,
    then the fewest most likely whose probabilities sum to at least top_p."""
    scaled = model_logits(sentence, tuple(history)).astype(np.float64) / search.temperature
    allowed = [v for v in range(V) if v not in (PAD, BOS) and not (v == EOS and t < min_len)]
    p = np.exp(scaled[allowed] - scaled[allowed].max())
    p /= p.sum()
    order = sorted(range(len(allowed)), key=lambda j: (-p[j], allowed[j]))[: search.top_k or len(allowed)]
    kept, mass = set(), 0.0
    for j in order:  # (these tests filter by top_k or by top_p, not both)
        kept.add(allowed[j])
        mass += p[j]
        if mass >= search.top_p + 1e-6:  # a token at the boundary, to float error, counts as inside
            break
    return kept


SAMPLE_LIMITS = limits_of(min_len=[1, 3, 0, 2], max_len=[8, 6, 1, 10])
SAMPLE_PREFIXES = [[], [4, 5], [], [6]]


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 2, 1.0), (1.5, 0, 0.7)], ids=["plain", "k2", "p0.7"]
)
def test_samples_are_keyed_by_sentence_and_seed_and_scored_by_the_model(
    temperature: float, top_k: int, top_p: float
) -> None:
    n = 4
    search = Search(
        beam_size=1, sampling=1, seed=11, num_hypotheses=n, temperature=temperature, top_k=top_k, top_p=top_p
    )
    batched = run_sampling(SENTENCES, SAMPLE_LIMITS, search, SAMPLE_PREFIXES)
    assert len(batched) == len(SENTENCES) and all(len(samples) == n for samples in batched)
    for i, s in enumerate(SENTENCES):  # alone, with its key: its index in the original call
        alone = run_sampling([s], SAMPLE_LIMITS.take([i]), search, [SAMPLE_PREFIXES[i]], keys=[i])
        assert alone[0] == batched[i]
    assert (
        run_sampling(
            SENTENCES[::-1], SAMPLE_LIMITS.take([3, 2, 1, 0]), search, SAMPLE_PREFIXES[::-1], keys=[3, 2, 1, 0]
        )[::-1]
        == batched
    )
    for samples in batched:  # best first
        assert [score for _, score in samples] == sorted((score for _, score in samples), reverse=True)
    for i, samples in enumerate(batched):
        prefix, (min_len, max_len) = SAMPLE_PREFIXES[i], (SAMPLE_LIMITS.min_len[i], SAMPLE_LIMITS.max_len[i])
        for tokens, score in samples:
            assert tokens[: len(prefix)] == prefix and min_len <= len(tokens) < max_len
            assert score == pytest.approx(ref_score(SENTENCES[i], tokens, prefix, max_len, 1.0), abs=1e-5)
            out = [*tokens, EOS]
            for t in range(len(prefix), min(len(out), max_len - 1)):  # every drawn token (not given, not forced)
                assert out[t] in ref_allowed_draws(SENTENCES[i], [BOS, *out[:t]], t, min_len, search)
    assert len({tuple(tokens) for samples in batched for tokens, _ in samples}) > len(SENTENCES)  # draws differ
    other = run_sampling(SENTENCES, SAMPLE_LIMITS, replace(search, seed=12), SAMPLE_PREFIXES)
    assert [[h[0] for h in samples] for samples in other] != [[h[0] for h in samples] for samples in batched]


def test_sampling_with_top_k_1_is_greedy_search() -> None:
    search = Search(beam_size=1, sampling=1, seed=5, num_hypotheses=2, top_k=1, temperature=0.6)
    sampled = run_sampling(SENTENCES, LIMITS, search, PREFIXES)
    greedy_out, _ = run_greedy(SENTENCES, LIMITS, Search(beam_size=1), PREFIXES)
    for samples, best in zip(sampled, greedy_out, strict=True):
        assert_same(samples, [best, best])


CHI2_999 = {4: 18.47, 5: 20.52}  # chi-square's 0.999 quantile by degrees of freedom


@pytest.mark.parametrize("min_len", [0, 1])
def test_draws_follow_the_tempered_distribution_over_the_allowed_tokens(min_len: int) -> None:
    # 16 keys × 64 samples of one drawn token (then eos at the limit): its frequencies are softmax(logits / T) over
    # the tokens the search allows — eos only from min_len on — and not the untempered distribution's
    rows, n, temperature, sentence = 16, 64, 2.0, 92
    search = Search(beam_size=1, sampling=1, seed=3, num_hypotheses=n, temperature=temperature)
    samples = run_sampling([sentence] * rows, limits_of([min_len] * rows, [2] * rows), search)
    drawn = [tokens[0] if tokens else EOS for per_key in samples for tokens, _ in per_key]  # [rows·n]
    allowed = [v for v in range(V) if v not in (PAD, BOS) and (v != EOS or min_len == 0)]
    counts = np.bincount(drawn, minlength=V)  # [V]
    assert counts[[v for v in range(V) if v not in allowed]].sum() == 0
    logits = model_logits(sentence, (BOS,)).astype(np.float64)[allowed]  # [A]

    def chi2(t: float) -> float:
        expected = len(drawn) * np.exp(logits / t) / np.exp(logits / t).sum()  # [A]
        return float(((counts[allowed] - expected) ** 2 / expected).sum())

    assert chi2(temperature) < CHI2_999[len(allowed) - 1] < chi2(1.0)
