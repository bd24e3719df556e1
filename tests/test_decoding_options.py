"""The search's options beyond plain search (export/runtime/processing.py) on a tiny random zoo model, torch
engine: sampling with top-k 1 is greedy search, a seed reproduces a draw whatever the batch, top-p draws stay in
their step's nucleus with the filtered distribution's frequencies, prefixes are kept and not scored, no n-gram
repeats, and bad settings are refused naming the setting. Parity with transformers' generate():
tests/test_convert_marian.py; the runtime equals torch: tests/test_export_search.py."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from export.runtime.generation import generate
from export.runtime.processing import nucleus, penalise
from export.runtime.search import Search, SearchError
from tests.zoo_testing import random_batch, tiny_model
from zoo.decoding.generate import TorchEngine

GREEDY = Search(beam_size=1, max_len_a=0, max_len_b=12, min_len=1)


@pytest.fixture(scope="module")
def model():
    return tiny_model("transformer")


@pytest.fixture(scope="module")
def src():
    return random_batch(b=4)[0]


def generate_nbest(model, src, search, num_hypotheses=1, **kw):
    """Per row of src [B, S] its hypotheses from the runtime's driver over the torch engine (inputs checked)."""
    ids = [row[row != model.cfg.pad_id].tolist() for row in src]
    return generate(TorchEngine(model), ids, replace(search, num_hypotheses=num_hypotheses), **kw)


def _best(model, src, search, **kw):
    return [hyps[0] for hyps in generate_nbest(model, src, search, **kw)]


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_sampling_with_top_k_1_is_greedy_search_tokens_and_scores(model, src, penalty: float) -> None:
    greedy = _best(model, src, replace(GREEDY, repetition_penalty=penalty))
    sampled = _best(model, src, replace(GREEDY, repetition_penalty=penalty, sampling=1, top_k=1, temperature=0.7))
    assert [h.tokens for h in sampled] == [h.tokens for h in greedy]
    np.testing.assert_allclose([h.score for h in sampled], [h.score for h in greedy], atol=1e-5)


def test_a_seed_reproduces_each_sources_samples_whatever_it_is_batched_with(model, src) -> None:
    search = replace(GREEDY, sampling=1, top_p=0.9, seed=7)
    whole = generate_nbest(model, src, search, num_hypotheses=3)
    assert whole == generate_nbest(model, src, search, num_hypotheses=3)
    alone = generate_nbest(model, src[2:3], search, num_hypotheses=3, keys=[2])  # source 2, on its own
    assert [h.tokens for h in alone[0]] == [h.tokens for h in whole[2]]  # scores: to float error of the batch
    np.testing.assert_allclose([h.score for h in alone[0]], [h.score for h in whole[2]], atol=1e-5)
    other = generate_nbest(model, src, replace(search, seed=8), num_hypotheses=3)
    assert other != whole
    assert all(len({tuple(h.tokens) for h in hyps}) > 1 for hyps in whole)  # samples differ


def _chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """The upper tail of the chi-square statistic (Wilson–Hilferty's normal approximation; no scipy here)."""
    stat, df = float(((observed - expected) ** 2 / expected).sum()), len(observed) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_top_p_draws_stay_in_the_nucleus_at_the_filtered_frequencies(model, src) -> None:
    """4000 first tokens of one source (keys differ per draw): none outside its step's nucleus (top-p 0.8 of the
    tempered distribution, pad/bos banned, eos before min_len), frequencies within chance of the renormalised
    nucleus (chi-square, fixed seed)."""
    temperature, top_p, copies, n = 0.5, 0.8, 80, 50
    search = Search(beam_size=1, max_len_a=0, max_len_b=2, min_len=1, sampling=1, top_p=top_p, temperature=temperature)
    one = src[:1].repeat(copies, 1)
    drawn = [h.tokens[0] for hyps in generate_nbest(model, one, search, num_hypotheses=n) for h in hyps]
    with torch.inference_mode():
        memory, mask = model.encode(src[:1])
        logits = model.decode(torch.tensor([[model.cfg.bos_id]]), memory, mask, model.init_state(), 0)[0, -1]
    logits = logits.float().numpy() / temperature
    banned = [model.cfg.pad_id, model.cfg.bos_id, model.cfg.eos_id]
    logits[banned] = -np.inf
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    kept = nucleus(probs, 0, top_p)
    assert 2 < kept.size < len(probs) / 2  # a real filter: several tokens in, most out
    assert set(drawn) <= set(kept.tolist())
    expected = probs[kept] / probs[kept].sum() * len(drawn)
    observed = np.array([drawn.count(int(c)) for c in kept], dtype=float)
    assert expected.min() >= 5
    assert _chi_square_p(observed, expected) > 0.001


@pytest.mark.parametrize("beam", [1, 4])
def test_a_prefix_starts_the_output_and_is_not_scored(model, src, beam: int) -> None:
    search = replace(GREEDY, beam_size=beam)
    prefixes = [[5, 6, 7], [], [9], [10, 11]]
    out = _best(model, src, search, prefixes=prefixes)
    assert all(h.tokens[: len(p)] == p for h, p in zip(out, prefixes, strict=True))
    # a sentence without a prefix searches as without the option
    free = _best(model, src[1:2], search)  # source 1 has no prefix: the same search
    assert out[1].tokens == free[0].tokens and out[1].score == pytest.approx(free[0].score, abs=1e-5)
    long = [[5] * 12, [], [], []]
    with pytest.raises(SearchError, match="target prefix 0 has 12 tokens but the output length limit is 12"):
        generate_nbest(model, src, search, prefixes=long)
    with pytest.raises(SearchError, match="pad/bos/eos"):
        generate_nbest(model, src, search, prefixes=[[model.cfg.eos_id], [], [], []])


@pytest.mark.parametrize("beam", [1, 4])
def test_no_repeat_ngram_size_leaves_no_repeated_ngram(model, src, beam: int) -> None:
    plain = _best(model, src, replace(GREEDY, beam_size=beam, max_len_b=30, min_len=29))
    assert any(_repeats(h.tokens, 2) for h in plain)  # the random model repeats without it
    for n in (2, 3):
        out = _best(model, src, replace(GREEDY, beam_size=beam, max_len_b=30, min_len=29, no_repeat_ngram_size=n))
        assert not any(_repeats(h.tokens, n) for h in out)


def _repeats(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def test_repetition_penalty_scales_seen_tokens_by_sign_and_n_grams_ban_by_shortlist_column() -> None:
    scores = np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32)
    got = penalise(scores, np.array([[0, 1, 1]]), None, 2.0, 0)
    np.testing.assert_array_equal(got, [[-2.0, 1.0, -3.0, 4.0]])
    # history 7 8 7: the 2-gram (7, 8) was seen, so 8 is banned after 7 — column 1 of the shortlist [3, 8, 9]
    got = penalise(np.zeros((1, 3), dtype=np.float32), np.array([[7, 8, 7]]), np.array([3, 8, 9]), 1.0, 2)
    np.testing.assert_array_equal(got, [[0.0, -np.inf, 0.0]])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"top_p": 0}, r"top_p=0 is out of range; allowed: a finite number in \(0.0, 1.0\]"),
        ({"temperature": -1}, r"temperature=-1 is out of range"),
        ({"no_repeat_ngram_size": -2}, r"no_repeat_ngram_size=-2 is out of range"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty=0.0 is out of range"),
        ({"sampling": 1, "beam_size": 4}, r"sampling=1 with beam_size=4"),
        ({"top_p": 0.9}, r"top_p=0.9 acts only when sampling; set sampling=1 too"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(settings: dict, message: str) -> None:
    with pytest.raises(SearchError, match=message):
        Search(**settings)
