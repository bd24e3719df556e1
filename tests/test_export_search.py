"""The torch-free runtime's search: ORT greedy, beam and n-best with scores equal zoo.decoding.generate's, dynamic
shapes,
length limits, and the steps it runs.

Every export here runs with one thread (`runtime.threads=1`): the two cores are shared.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import export
from export import runtime as rt
from export.pruning import prune
from export.runtime.generation import best_tokens, generate, padded, score, search_batch, shaped
from export.runtime.search import Scored, Search
from export.runtime.stepper import HostState
from export.verify import encode_pairs, graph_parity
from tests.export_testing import (
    PLAN,
    TRAINED_ENTRIES,
)
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.data import Tokenizer
from zoo.decoding import evaluation
from zoo.decoding.evaluation import translate_texts
from zoo.decoding.generate import TorchEngine, TorchStep
from zoo.decoding.generate import generate as torch_generate


def _heldout_batch(run_dir: Path, n: int = 32) -> tuple[torch.Tensor, list[str], Tokenizer, dict]:
    payload = load_checkpoint(run_dir)
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    texts = payload["heldout"]["src"][:n]
    src_ids, _ = encode_pairs(tok, texts, texts, payload["model_config"]["max_positions"], 8)
    width = max(map(len, src_ids))
    src = torch.zeros(len(src_ids), width, dtype=torch.long)
    for i, row in enumerate(src_ids):
        src[i, : len(row)] = torch.tensor(row)
    return src, texts, tok, payload


def test_ort_search_equals_torch_search(exported, smoke_run) -> None:
    out, _ = exported("transformer")
    src, texts, tok, payload = _heldout_batch(smoke_run("transformer"))
    model = model_from_checkpoint(payload)
    model.apply_head_plan(PLAN, remove=False)  # the gated original: what the pruned export must equal
    runtime = export.load(out, threads=1)
    for search in (
        Search(beam_size=4, len_penalty=0.6),
        Search(beam_size=2, len_penalty=1.3, min_len=3),
        Search(beam_size=1, max_len_a=0.0, max_len_b=5, min_len=5),
        Search(beam_size=5, max_len_a=0.0, max_len_b=4, min_len=4),  # fixed length
        Search(beam_size=4, no_repeat_ngram_size=2, repetition_penalty=1.3),  # whole distributions (processing.py)
        Search(beam_size=1, repetition_penalty=1.3, sampling=1, top_p=0.9, seed=3),
    ):
        ours = best_tokens(search_batch(runtime, src.numpy(), search))
        assert ours == best_tokens(torch_generate(model, src, search)), search
    reference = shaped(translate_texts(model, tok, texts, Search(beam_size=5)), lists=False)
    assert runtime.translate(texts, beam_size=5) == reference
    assert runtime.translate(texts[0]) == reference[:1]  # a single string, the manifest's defaults (beam 5)
    assert len({*reference}) > len(reference) // 3  # the (pruned) smoke model is not degenerate


@pytest.mark.parametrize("entry", TRAINED_ENTRIES)
def test_ort_beam_equals_torch_beam_on_the_test_split(entry: str, exported, smoke_run, smoke_corpus) -> None:
    """The acceptance check: ORT beam search (beam 5) returns zoo.decoding.generate's hypotheses on the smoke test
    split."""
    out, manifest = exported(entry)
    payload = load_checkpoint(smoke_run(entry))
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    # the checkpoint's model with the export's plan gated: what the (pruned) export must equal
    _, reference = prune(model_from_checkpoint(payload), manifest["head_plan"], remove=False)
    texts = (smoke_corpus / "test.de").read_text(encoding="utf-8").splitlines()
    runtime = export.load(out, threads=1)
    src = torch.from_numpy(padded(runtime.encode_texts(texts), runtime.pad_id))
    ids = best_tokens(torch_generate(reference, src, Search(beam_size=5)))
    assert best_tokens(search_batch(runtime, src.numpy(), rt.Search(beam_size=5))) == ids
    theirs = translate_texts(reference, tok, texts, Search(beam_size=5))
    assert runtime.translate(texts, beam_size=5) == shaped(theirs, lists=False)
    if entry == "transformer":  # non-degeneracy is checked on the baseline smoke checkpoint (zoo/DESIGN.md §3c);
        assert len({tuple(h) for h in ids}) > len(ids) // 3  # pruned 300-update variants repeat more


@pytest.mark.parametrize("entry", TRAINED_ENTRIES)
def test_ort_nbest_and_scores_equal_torch(entry: str, exported, smoke_run, smoke_corpus) -> None:
    """n-best lists with scores and forced-decoding scores (issue 22): ORT returns torch's hypotheses with scores
    equal to 1e-4, led by the plain output; teacher-forced scores agree per token; and scoring a hypothesis gives
    back its search score — where the search forced eos at the length limit, with that eos counted as 0."""
    out, manifest = exported(entry)
    payload = load_checkpoint(smoke_run(entry))
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    _, reference = prune(model_from_checkpoint(payload), manifest["head_plan"], remove=False)
    texts = (smoke_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:24]
    runtime = export.load(out, threads=1)
    src_ids = runtime.encode_texts(texts)
    pairs = []  # (source row, hypothesis, search) of every hypothesis ORT returned
    for search in (Search(beam_size=5, len_penalty=0.8), Search(beam_size=1)):
        settings = {"beam_size": search.beam_size, "len_penalty": search.len_penalty}
        ours = runtime.translate(texts, **settings, num_hypotheses=search.beam_size)
        theirs = translate_texts(reference, tok, texts, replace(search, num_hypotheses=search.beam_size))
        assert [hyps[0].text for hyps in ours] == runtime.translate(texts, **settings)
        for a, b in zip(ours, theirs, strict=True):
            assert a[0].tokens == b[0].tokens and len(a) == len(b) == search.beam_size
            assert all(x.score >= y.score for x, y in itertools.pairwise(a))
            # the same hypotheses with the same scores (compared as a mapping: near-ties may swap places)
            mine, ref = {tuple(h.tokens): h.score for h in a}, {tuple(h.tokens): h.score for h in b}
            assert mine.keys() == ref.keys()
            assert max(abs(mine[k] - ref[k]) for k in mine) <= 1e-4
        pairs += [(row, h, search) for row, hyps in enumerate(ours) for h in hyps]

    for len_penalty in (0.8, 1.0):
        chosen = [(row, h) for row, h, s in pairs if s.len_penalty == len_penalty]
        sources, targets = [src_ids[r] for r, _ in chosen], [h.tokens for _, h in chosen]
        got = score(runtime, sources, targets, len_penalty)
        ref = score(TorchEngine(reference), sources, targets, len_penalty)
        for g, r in zip(got, ref, strict=True):
            assert g.tokens == r.tokens and abs(g.score - r.score) <= 1e-4
            assert np.abs(np.subtract(g.token_logprobs, r.token_logprobs)).max() <= 1e-4
        limits = rt.max_lengths(
            np.array([len(s) for s in sources]), rt.Search(len_penalty=len_penalty), runtime.max_positions
        )
        for (_, hyp), g, limit in zip(chosen, got, limits, strict=True):
            counted = g.token_logprobs if len(g.tokens) < limit else g.token_logprobs[:-1]  # forced eos: 0
            assert abs(sum(counted) / len(g.tokens) ** len_penalty - hyp.score) <= 1e-4, hyp
    # the text API re-tokenises the hypotheses; it scores what `score` scores when the ids come back
    best = [hyps[0] for hyps in runtime.translate(texts, beam_size=5, len_penalty=0.8, num_hypotheses=1)]
    by_text = runtime.score(texts, [h.text for h in best], len_penalty=0.8)
    by_ids = score(runtime, src_ids, [h.tokens for h in best], 0.8)
    pairs = list(zip(by_text, by_ids, strict=True))
    for text_scored, id_scored in pairs:  # how many texts re-tokenise to the search's ids depends on the model
        if text_scored.tokens == id_scored.tokens:
            assert abs(text_scored.score - id_scored.score) <= 1e-5
    assert any(a.tokens == b.tokens for a, b in pairs)


def test_runtime_nbest_and_score_refuse_bad_values(exported) -> None:
    """Bad num_hypotheses, mismatched counts, unscorable targets: refused before anything runs, naming the
    allowed values; the results have the same fields in both engines."""
    out, _ = exported("transformer")
    runtime = export.load(out, threads=1)
    for bad in (0, 6, 2.5, "two", True, None, float("inf")):
        with pytest.raises(export.SearchError, match=r"num_hypotheses=.* allowed: an integer in \[1, 5\]"):
            rt.Search(beam_size=5, num_hypotheses=bad)
    with pytest.raises(export.SearchError, match=r"num_hypotheses=6 is out of range; .*at most beam_size=5"):
        runtime.translate(["Guten Morgen."], beam_size=5, num_hypotheses=6)
    with pytest.raises(export.SearchError, match=r"num_hypotheses=2 is out of range; .*\[1, 1\]"):
        runtime.search_settings(beam_size=1, num_hypotheses=2)
    one = runtime.translate(["Guten Morgen.", ""], beam_size=2, return_scores=True)
    assert [len(h) for h in one] == [1, 1] and isinstance(one[0][0], rt.Translation)
    with pytest.raises(rt.ScoreError, match="got 2 sources but 1 targets"):
        runtime.score(["Guten Morgen.", "Danke."], ["Good morning."])
    with pytest.raises(rt.ScoreError, match="got 1 sources but 0 targets"):
        score(runtime, [[5]], [], 1.0)
    with pytest.raises(rt.ScoreError, match=r"outside the vocabulary \[0, 1000\)"):
        score(runtime, [[5]], [[1000]], 1.0)
    with pytest.raises(rt.ScoreError, match="at most 254"):
        score(runtime, [[5]], [[5] * 255], 1.0)
    with pytest.raises(export.SearchError, match="len_penalty"):
        runtime.score("Guten Morgen.", "Good morning.", len_penalty=-1)
    (empty,) = runtime.score("Guten Morgen.", "")
    assert empty.tokens == [runtime.eos_id] and empty.score == pytest.approx(empty.token_logprobs[0])
    assert runtime.score([], []) == [] and len(runtime.encode_targets(["Haus " * 400])[0]) == 254
    assert rt.Translation._fields == evaluation.Translation._fields and rt.Scored._fields == Scored._fields


def test_dynamic_batch_and_length(exported, smoke_run) -> None:
    out, _ = exported("transformer")
    src, _, _, payload = _heldout_batch(smoke_run("transformer"))
    pruned = prune(model_from_checkpoint(payload), PLAN)[0]
    runtime = export.load(out, threads=1)
    g = torch.Generator().manual_seed(0)
    for batch, extra_pad, steps in ((1, 0, 3), (2, 5, 9), (7, 1, 14), (45, 3, 6)):
        rows = torch.arange(batch) % src.shape[0]
        s = torch.nn.functional.pad(src[rows], (0, extra_pad))
        tgt = torch.randint(4, pruned.cfg.vocab_size, (batch, steps), generator=g)
        tgt[:, 0] = pruned.cfg.bos_id
        diffs = graph_parity(runtime, pruned, s, tgt)
        assert max(diffs.values()) < 1e-4, (batch, diffs)


def test_max_lengths_match_torch() -> None:
    lengths = torch.arange(0, 400).repeat(2)
    src = (torch.arange(400)[None, :] < lengths[:, None]).long() * 5  # rows with 0…399 non-pad tokens
    for a in (0.0, 0.5, 1.1, 1.2, 1.5, 2.0):
        for b in (0, 3, 10):
            for limit in (64, 256, 1024):
                # torch's (a·len + b).long() in float32, capped at the position limit, clamped to [1, limit - 1]
                raw = torch.minimum(torch.tensor(a) * src.ne(0).sum(1).float() + b, torch.tensor(float(limit)))
                ref = raw.long().clamp(1, limit - 1).numpy()
                got = rt.max_lengths(src.ne(0).sum(1).numpy(), rt.Search(max_len_a=a, max_len_b=b), limit)
                assert np.array_equal(ref, got), (a, b, limit)


def test_beam_search_runs_its_first_step_on_one_row_per_sentence(exported, monkeypatch) -> None:
    """All beams of a sentence start as the same bos hypothesis, so the runtime's first beam step decodes one row
    per sentence and the next ones beam-size rows (the search itself is checked against zoo.decoding.generate by the
    beam-equality tests); the self-attention store is sized for the full width from the start."""
    out, _ = exported("transformer")
    runtime = export.load(out, threads=1)
    src = padded(runtime.encode_texts(["Guten Morgen.", "Das Haus ist klein.", "Ja."]), runtime.pad_id)
    rows: list[int] = []
    widths: list[int] = []
    run = HostState.run

    def spy(self, host, fetch):
        rows.append(len(host["tokens"]))
        widths.append(self.cache.width)
        return run(self, host, fetch)

    monkeypatch.setattr(HostState, "run", spy)
    hyps = search_batch(runtime, src, rt.Search(beam_size=4, max_len_a=0.0, max_len_b=6, min_len=6, num_hypotheses=4))
    assert rows[:3] == [3, 12, 12] and set(widths) == {12}
    assert all(len(h) == 4 and all(len(x.tokens) == 5 for x in h) for h in hyps)


def test_a_step_where_every_hypothesis_must_end_is_not_decoded(exported, monkeypatch) -> None:
    """At its length limit a hypothesis may only end (eos at log-prob 0, as zoo.decoding.generate), so the runtime does
    not
    run the decoder on a step where every live row is there: a fixed-length search of n tokens (eos included)
    decodes n - 1 steps, and sentences with different limits keep decoding until the longest limit's last step.
    The hypotheses and scores are checked against zoo.decoding.generate by the search-equality tests, fixed lengths
    included."""
    out, _ = exported("transformer")
    runtime = export.load(out, threads=1)
    src = padded(runtime.encode_texts(["Ja.", "Das Haus ist klein und alt, aber es hat einen Garten."]), runtime.pad_id)
    steps: list[int] = []
    run = HostState.run

    def spy(self, host, fetch):
        steps.append(int(host["step"][0]))
        return run(self, host, fetch)

    monkeypatch.setattr(HostState, "run", spy)
    for beam in (1, 4):
        steps.clear()
        fixed = rt.Search(beam_size=beam, max_len_a=0.0, max_len_b=6, min_len=6, num_hypotheses=beam)
        hyps = search_batch(runtime, src, fixed)
        assert steps == [0, 1, 2, 3, 4], beam
        assert all(len(h) == beam and all(len(x.tokens) == 5 for x in h) for h in hyps)
        # every sentence to its own limit (eos banned before it): the short one's last step is decoded for the other
        search = rt.Search(beam_size=beam, max_len_a=0.5, max_len_b=1, min_len=200, num_hypotheses=beam)
        limits = rt.max_lengths((src != runtime.pad_id).sum(1), search, runtime.max_positions)
        assert limits[0] < limits[1]
        steps.clear()
        hyps = search_batch(runtime, src, search)
        assert steps == list(range(int(limits[1]) - 1)), beam
        assert [len(h[0].tokens) for h in hyps] == [int(n) - 1 for n in limits]


@pytest.mark.parametrize("beam_size", [1, 5])
def test_forced_lengths_give_each_sentence_exactly_its_length(beam_size: int, exported, smoke_run) -> None:
    """The speed benchmark decodes rebuilt models for as many tokens as the trained model's hypotheses had:
    every hypothesis (all beams) has exactly its sentence's forced length, including 0 and lengths longer than
    the search's own max_len_a/max_len_b would allow."""
    out, _ = exported("transformer")
    src, _, _, _ = _heldout_batch(smoke_run("transformer"), n=6)
    runtime = export.load(out, threads=1)
    lengths = [0, 1, 7, 3, 40, 12]
    limits = rt.forced_limits(lengths, runtime.max_positions)
    search = rt.Search(beam_size=beam_size, max_len_a=0.0, max_len_b=2, num_hypotheses=beam_size)  # bounds ignored
    nbest = search_batch(runtime, src.numpy(), search, limits)
    # every beam finishes at once; length 0 (only eos allowed) leaves the empty hypothesis alone
    assert [len(hyps) for hyps in nbest] == [1 if n == 0 else beam_size for n in lengths]
    assert [[len(h.tokens) for h in hyps] for hyps in nbest] == [
        [n] * len(hyps) for n, hyps in zip(lengths, nbest, strict=True)
    ]
    assert [len(ids) for ids in best_tokens(nbest)] == lengths
    capped = rt.forced_limits([10**6], runtime.max_positions)  # never past the position limit
    assert capped.max_len.tolist() == [runtime.max_positions - 1]


def test_rows_with_different_length_settings_share_one_search(exported, smoke_run) -> None:
    """Per-row bounds (how a server batches requests whose min_len/max_len_a/max_len_b differ) give each row what
    a search with its own settings gives it alone."""
    out, _ = exported("transformer")
    _, texts, _, _ = _heldout_batch(smoke_run("transformer"), n=6)
    runtime = export.load(out, threads=1)
    encoded = runtime.encode_texts(texts)
    settings = [
        rt.Search(beam_size=3, min_len=4, num_hypotheses=2),
        rt.Search(beam_size=3, max_len_a=0.0, max_len_b=3, num_hypotheses=2),
        rt.Search(beam_size=3, num_hypotheses=2),
        rt.Search(beam_size=3, min_len=9, max_len_a=0.5, max_len_b=12, num_hypotheses=2),
        rt.Search(beam_size=3, max_len_a=0.0, max_len_b=1, num_hypotheses=2),
        rt.Search(beam_size=3, max_len_a=2.0, max_len_b=0, num_hypotheses=2),
    ]
    alone = [generate(runtime, [ids], s)[0] for ids, s in zip(encoded, settings, strict=True)]
    bounds = rt.concat_limits(
        [
            rt.row_limits(np.array([len(ids)]), s, runtime.max_positions)
            for ids, s in zip(encoded, settings, strict=True)
        ]
    )
    together = generate(runtime, encoded, settings[0], limits=bounds)
    assert [[t.tokens for t in hyps] for hyps in together] == [[t.tokens for t in hyps] for hyps in alone]
    for a, b in zip(together, alone, strict=True):
        assert [t.score for t in a] == pytest.approx([t.score for t in b], abs=1e-5)
    with pytest.raises(rt.SearchError, match="length bounds for 5 sentences but 6 sources"):
        generate(runtime, encoded, settings[0], limits=bounds.take(range(5)))


def _clearly_ranked(lp: np.ndarray, tol: float = 1e-4) -> np.ndarray:
    """[N, k] True where a column's log-prob is more than tol from its neighbours' (the last column's unseen
    neighbour could tie it, so it never counts): there two engines must name the same token."""
    gaps = -np.diff(lp, axis=1) > tol  # [N, k-1]: column j strictly above j+1
    clear = np.zeros(lp.shape, dtype=bool)
    clear[:, :-1] = gaps
    clear[:, 1:-1] &= gaps[:, :-1]
    return clear


@pytest.mark.parametrize("entry", TRAINED_ENTRIES)
def test_the_torch_step_equals_the_runtime_stepper(entry: str, exported, smoke_run, smoke_corpus) -> None:
    """Both engines run the runtime's one search loop; what differs is their step. Fed the same tokens and the
    same row selections (beams reordered within their sentence, with repeats; sentences leaving), the zoo model's
    `TorchStep` (cached and full recompute) and the exported graph's `Stepper` give every row the same best tokens,
    log-probs equal to 1e-4."""
    out, manifest = exported(entry)
    payload = load_checkpoint(smoke_run(entry))
    _, reference = prune(model_from_checkpoint(payload), manifest["head_plan"], remove=False)
    runtime = export.load(out, threads=1)
    texts = (smoke_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:6]
    src = padded(runtime.encode_texts(texts), runtime.pad_id)  # [B, S]
    rows = np.repeat(np.arange(len(src)), 2)  # two rows per sentence, as a beam of 2
    with torch.inference_mode():
        memory, pad_mask = reference.encode(torch.from_numpy(src))
        order = torch.from_numpy(rows)
        torch_steps = [
            TorchStep(reference, memory.index_select(0, order), pad_mask.index_select(0, order), use_cache)
            for use_cache in (True, False)
        ]
        ort_step = runtime.stepper(runtime.encode(src), rows, steps=8, slots=len(rows))
        rng = np.random.default_rng(0)
        last = np.full(len(rows), reference.cfg.bos_id, dtype=np.int64)
        for t in range(7):
            want_lp, want_tok = ort_step(last, t, 8)
            for step in torch_steps:
                lp, tok = step(last, t, 8)
                assert lp.shape == tok.shape == want_lp.shape and lp.dtype == np.float32 and tok.dtype == np.int64
                assert np.abs(lp - want_lp).max() <= 1e-4, (t, step.state is not None)
                clear = _clearly_ranked(want_lp)
                assert clear.mean() > 0.5 and np.array_equal(tok[clear], want_tok[clear]), t
            sentences = np.arange(len(last) // 2)  # rows 2s, 2s + 1 are sentence s's beams
            if t % 2 and len(sentences) > 1:
                sentences = np.delete(sentences, rng.integers(len(sentences)))  # a sentence finished: it leaves
            keep = np.concatenate([np.sort(rng.choice([2 * s, 2 * s + 1], 2)) for s in sentences])  # may repeat
            for step in (*torch_steps, ort_step):
                step.select(keep)
            last = want_tok[keep, int(t % 3 == 0)]  # each row continues with its best or second-best token


OPTION_SEARCHES = (
    Search(beam_size=4, len_penalty=0.6, no_repeat_ngram_size=2, repetition_penalty=1.3),
    Search(beam_size=1, no_repeat_ngram_size=3, repetition_penalty=1.2),
    Search(beam_size=1, sampling=1, top_p=0.9, temperature=0.8, seed=5),
)


@pytest.mark.parametrize(
    "overrides", [(), ("shortlist.build=true",), ("keep_heads=2", "quantize=true")], ids=["pruned", "shortlist", "int8"]
)
def test_the_decoding_options_in_the_runtime_equal_torch(overrides: tuple[str, ...], exported, smoke_run) -> None:
    """Target prefixes (0-2 tokens), the repetition options and sampling (3 draws, seeded) with beam 4 and greedy:
    ORT's n-best tokens equal torch's, scores to 1e-4 — over non-uniformly pruned heads (the test head plan) and
    over a shortlist. INT8 (no torch twin) keeps every prefix and repeats no banned n-gram."""
    out, _ = exported("transformer", *overrides)
    src, _, _, payload = _heldout_batch(smoke_run("transformer"), n=12)
    model = model_from_checkpoint(payload)
    if not overrides:
        model.apply_head_plan(PLAN, remove=False)
    runtime = export.load(out, threads=1)
    plain = best_tokens(torch_generate(model, src, Search(beam_size=1)))
    prefixes = [ids[: i % 3] for i, ids in enumerate(plain)]
    shortlisted = overrides == ("shortlist.build=true",)
    for search in OPTION_SEARCHES:
        n = 1 if search.beam_size == 1 and not search.sampling else 3
        search = replace(search, shortlist=int(shortlisted), num_hypotheses=n)
        ours = search_batch(runtime, src.numpy(), search, prefixes=prefixes)
        assert all(hyps[0].tokens[: len(p)] == p for hyps, p in zip(ours, prefixes, strict=True))
        if "quantize=true" in overrides:
            size = search.no_repeat_ngram_size
            if size:
                assert not any(_repeats(h.tokens, size) for hyps in ours for h in hyps)
            continue
        rows = runtime.candidates(src.numpy(), search)
        vocab_rows = None if rows is None else torch.from_numpy(rows)
        theirs = torch_generate(model, src, search, prefixes, vocab_rows=vocab_rows)
        for a, b in zip(ours, theirs, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b], search
            np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-4)


def _repeats(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))
