"""The verdict rule of zoo/report/claims.py on synthetic per-seed, per-sentence scores whose answer is known.

Each run is a vector of per-sentence scores on one shared test set (sentence difficulty common to every run);
the corpus score is their mean, so `delta_test` sees exactly what it sees for BLEU (summed sufficient statistics)
with effects set by hand. Every test names a case where the rule before issue 37 — per-seed paired bootstraps,
"holds" when every seed is significant, "does not hold" when one is significantly the other way, "match" when
none is significantly worse, no correction — gives another answer.
"""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.zoo_testing import REPO
from zoo.metrics import bleu_from_stats, corpus_bleu, sentence_stats
from zoo.report import render
from zoo.report.claims import (
    FAILS,
    HOLDS,
    NO_DIFFERENCE,
    DeltaTest,
    Question,
    decision_p,
    delta_test,
    judge,
    precondition,
    t_quantile,
    with_state,
)
from zoo.report.records import convergence
from zoo.report.suite import SuiteError, suite_from_config

PAPERS = REPO.parent / "shared" / "papers"
PAPER_FILES = {  # the claims' `paper` -> its text in ../shared/papers (README.md there)
    "MGK": "000_61e8fe3075a627ec.txt",
    "Mixhead": "001_bc57274191c08c1b.txt",
    "Concise": "003_e076147654140b93.txt",
    "GHT": "004_cb7908ec8b4aa0d8.txt",
    "GHT-PS": "004_cb7908ec8b4aa0d8.txt",
}


def mean_score(stats: np.ndarray) -> np.ndarray:
    """Corpus score of summed [score, count] statistics: the mean per-sentence score."""
    return stats[..., 0] / stats[..., 1]


def runs(offsets: list[float], noise: float, sentences: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(system, baseline) statistics per seed: the system's per-sentence scores are the baseline's plus that
    seed's offset (exactly, on this test set) plus per-sentence noise of the given spread."""
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(20.0, 6.0, sentences)
    pairs = []
    for offset in offsets:
        base = difficulty + rng.normal(0.0, 2.0, sentences)
        wobble = rng.normal(0.0, noise, sentences)
        system = base + offset + wobble - wobble.mean()
        pairs.append(tuple(np.stack([s, np.ones(sentences)], axis=1) for s in (system, base)))
    return pairs  # type: ignore[return-value]


def verdict(expect: str, pairs, margin: float | None = None) -> str:
    test = delta_test(pairs, score=mean_score, samples=1000) if len(pairs) >= 2 else None
    return judge([Question(expect, len(pairs), test, margin)])[0].verdict


def test_a_real_effect_holds() -> None:
    # The old rule: "inconclusive: seeds disagree" for the 5-seed case — its fifth seed alone (+0.15 on 200
    # sentences of spread 2, p ≈ 0.3) is not significant, so "every seed significant" fails.
    assert verdict("better", runs([0.8, 0.9, 1.0], noise=2.0, sentences=200)) == HOLDS
    assert verdict("better", runs([1.0, 1.1, 0.9, 1.2, 0.15], noise=2.0, sentences=200)) == HOLDS
    assert verdict("worse", runs([-0.8, -0.9, -1.0], noise=2.0, sentences=200)) == HOLDS


def test_no_effect_is_no_significant_difference() -> None:
    # Seeds scatter around zero, each far from it on 2000 sentences (+0.6 and −0.5 are both significant per
    # seed): the old rule says "inconclusive: seeds disagree"; across seeds there is no effect to report.
    assert verdict("better", runs([0.6, -0.5, 0.1], noise=2.0, sentences=2000)) == NO_DIFFERENCE
    assert verdict("better", runs([0.0, 0.0, 0.0, 0.0], noise=2.0, sentences=300)) == NO_DIFFERENCE


def test_an_effect_of_one_seed_does_not_hold() -> None:
    # One seed shifted by 3 BLEU, the others not at all: the mean is +1, and a bootstrap over sentences alone
    # would call it significant; seed to seed it is noise. The old rule: "holds" for the match claim (no seed
    # significantly worse) and, with a small real effect under the shift, "holds" for better (all three seeds
    # significant on 2000 sentences).
    assert verdict("better", runs([0.0, 0.0, 3.0], noise=2.0, sentences=2000)) == NO_DIFFERENCE
    assert verdict("better", runs([0.3, 0.3, 4.0], noise=2.0, sentences=2000)) == NO_DIFFERENCE
    assert verdict("match", runs([0.0, 0.0, 3.0], noise=2.0, sentences=2000), margin=0.5).startswith("inconclusive")


def test_equivalence_within_the_margin_holds_and_outside_it_does_not() -> None:
    # ±0.05 on 2000 sentences: the old rule says "inconclusive: seeds disagree" (two seeds differ significantly,
    # in opposite directions, by a twentieth of a BLEU point); within a ±0.5 margin they are equal.
    close = runs([0.05, -0.05, 0.02], noise=1.0, sentences=2000)
    assert verdict("match", close, margin=0.5) == HOLDS
    assert verdict("not_worse", close, margin=0.5) == HOLDS and verdict("not_better", close, margin=0.5) == HOLDS
    far = runs([-1.0, -1.1, -0.9], noise=1.0, sentences=2000)
    assert verdict("match", far, margin=0.5) == f"{FAILS} (Δ below the ±0.5 margin)"
    assert verdict("not_worse", far, margin=0.5) == FAILS
    assert verdict("not_better", far, margin=0.5) == HOLDS
    # No evidence is not evidence of equivalence: −0.8 on every seed, each n.s. on 300 noisy sentences. The old
    # rule: "holds" (no seed significantly worse); here the interval crosses −0.5.
    vague = runs([-0.8, -0.9, -0.7], noise=10.0, sentences=300)
    assert verdict("match", vague, margin=0.5) == "inconclusive: the 95% interval crosses -0.5 and +0.5"


def test_holds_and_does_not_hold_need_the_same_evidence() -> None:
    # The case (transformer vs fixhead_4head): −0.44 (p ≈ 0.03) and +0.03 (n.s.) on 1420 sentences. The
    # old rule: "does not hold" — one seed against sufficed, where every seed was needed for. Two seeds are too
    # few for either; with a third seed near zero it is no difference (the old rule: still "does not hold").
    asymmetric = runs([-0.44, 0.03], noise=7.9, sentences=1420)
    assert verdict("better", asymmetric) == "too few seeds (2)"
    assert verdict("better", runs([-0.44, 0.03, 0.1], noise=7.9, sentences=1420)) == NO_DIFFERENCE
    # Mirror images get mirrored verdicts with the same p.
    up = runs([0.8, 0.9, 1.0], noise=2.0, sentences=200)
    down = [(base, system) for system, base in up]
    assert (verdict("better", up), verdict("better", down)) == (HOLDS, FAILS)
    p_up = decision_p(delta_test(up, score=mean_score), "better")
    p_down = decision_p(delta_test(down, score=mean_score), "better")
    assert p_up[0] == pytest.approx(p_down[0]) and (p_up[1], p_down[1]) == (HOLDS, FAILS)


def test_too_few_seeds_gives_no_verdict() -> None:
    # The old rule: "holds" for two seeds that are each significant.
    assert verdict("better", runs([2.0, 2.1], noise=2.0, sentences=500)) == "too few seeds (2)"
    assert verdict("better", runs([2.0], noise=2.0, sentences=500)) == "too few seeds (1)"
    assert judge([Question("worse", 2, unmet="precondition not met (silhouette 0.02)")])[0].verdict == (
        "precondition not met (silhouette 0.02); too few seeds (2)"
    )


def test_holm_correction_turns_a_lone_significant_claim_inconclusive() -> None:
    # p = 0.03 alone holds; beside three claims with p ≈ 0.5 Holm multiplies it by 4. The old rule corrected
    # nothing.
    se = 0.1
    alone = DeltaTest(mean=t_quantile(1 - 0.015, 2) * se, se=se, per_seed=(0.5, 0.6, 0.7))
    assert decision_p(alone, "better")[0] == pytest.approx(0.03, abs=1e-6)
    null = DeltaTest(mean=0.05, se=0.07, per_seed=(0.0, 0.05, 0.1))
    assert judge([Question("better", 3, alone)])[0].verdict == HOLDS
    judged = judge([Question("better", 3, alone), *(Question("better", 3, null) for _ in range(3))])
    assert judged[0].p_holm == pytest.approx(0.12, abs=1e-6)
    assert judged[0].verdict == f"{NO_DIFFERENCE} after Holm (p=0.030, adjusted 0.120)"


def test_the_seed_and_sentence_bootstrap_scores_corpus_bleu_from_sentence_statistics() -> None:
    rng = np.random.default_rng(1)
    words = "the a cat dog sat ran on under mat tree house small big red".split()
    refs = [" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(60)]

    def noisy(p: float) -> list[str]:
        return [" ".join(w if rng.random() > p else str(rng.choice(words)) for w in r.split()) for r in refs]

    seeds = [(noisy(0.2), noisy(0.4)) for _ in range(3)]
    pairs = [(sentence_stats(s, refs), sentence_stats(b, refs)) for s, b in seeds]
    test = delta_test(pairs, samples=200)
    expected = [corpus_bleu(s, refs) - corpus_bleu(b, refs) for s, b in seeds]
    assert test.per_seed == pytest.approx(expected, abs=1e-9) and test.mean == pytest.approx(np.mean(expected))
    idx = rng.integers(0, len(refs), 40)
    resampled = bleu_from_stats(pairs[0][0][idx].sum(axis=0))
    assert resampled == pytest.approx(corpus_bleu([seeds[0][0][i] for i in idx], [refs[i] for i in idx]))


def test_the_student_t_quantiles() -> None:
    for df, q in [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (10, 2.2281)]:
        assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)


def test_convergence_and_the_state_in_the_verdict() -> None:
    curve = [{"step": s, "valid_quality": q} for s, q in [(250, 1.0), (750, 3.4), (1000, 7.2), (1200, 10.5)]]
    state = convergence(curve)
    assert state == {"last20_gain": 3.91, "best_at_last": True}  # 10.5 minus 6.59 interpolated at update 960
    flat = convergence([{"step": s, "valid_quality": q} for s, q in [(400, 20.0), (800, 21.0), (1000, 20.9)]])
    assert flat is not None and flat["last20_gain"] < 0.5 and not flat["best_at_last"]
    assert with_state(HOLDS, {"climbing": 3, "max_gain": 2.1}) == (
        "holds — runs still climbing (up to +2.1 BLEU over the last 20%)"
    )
    assert with_state(HOLDS, {"climbing": 0, "max_gain": 0.2}) == HOLDS


def test_new_records_store_their_convergence(tmp_path) -> None:
    from zoo.report.records import References, record_from_run

    (tmp_path / "metrics.csv").write_text(
        "step,valid_quality\n50,\n250,4.0\n500,8.0\n750,9.0\n1000,9.2\n"  # a training row has no valid_quality
    )
    (tmp_path / "summary.json").write_text('{"updates": 1000, "train_minutes": 1.0, "test": {"bleu": 1.0}}')
    (tmp_path / "test_hypotheses.txt").write_text("a\nb\n")
    (tmp_path / "config.yaml").write_text("model: {name: transformer}\ntrainer: {update_freq: 1}\n")
    (tmp_path / "machine.json").write_text('{"class": "cpu"}')
    quick = next(s for s in _suites() if s.name == "quick")
    record = record_from_run(tmp_path, quick, "transformer", 1, References(("a", "b"), ("x", "x")))
    assert record["convergence"] == {"last20_gain": 0.16, "best_at_last": True}  # 9.2 − 9.04 at update 800


def test_ght_ps_is_judged_only_where_its_groups_compacted() -> None:
    def run(silhouette: float, trigger: str) -> dict:
        return {"compactness": {"after": {"silhouette": silhouette}}, "voting": {"step": 720, "trigger": trigger}}

    converged = "group centres converged on the probe batch"
    assert precondition([{"voting": None}]) is None  # nothing voted: no precondition
    assert precondition([run(0.4, converged), run(0.3, converged)]) is None
    assert precondition([run(0.02, "reached vote_at=0.6"), run(0.0, "reached vote_at=0.6")]) == (
        "precondition not met (silhouette 0.00–0.02, voted at the vote_at fallback)"
    )
    assert precondition([run(0.4, converged), run(0.3, "reached vote_at=0.6")]) == (
        "precondition not met (silhouette 0.30–0.40, voted at the vote_at fallback in 1 of 2 runs)"
    )


def _suites():
    return [suite_from_config(OmegaConf.load(p), REPO / "conf") for p in sorted((REPO / "conf/suite").glob("*.yaml"))]


def test_an_untested_claim_shows_its_interval_and_says_it_was_not_tested() -> None:
    """Three seeds give Δ̄ an interval, but a claim whose precondition failed is not tested: it has no p."""
    delta = {"mean": 0.31, "low": -1.2, "high": 1.9, "seeds": 3}
    assert render._delta_cell({"delta": delta, "p": None, "p_holm": None}) == "+0.31 [-1.20, +1.90]; not tested"
    assert render._delta_cell({"delta": delta, "p": 0.2, "p_holm": 0.4}) == "+0.31 [-1.20, +1.90]; p=0.200, Holm 0.400"


def test_a_paper_claim_without_its_source_is_refused() -> None:
    node = OmegaConf.load(REPO / "conf" / "suite" / "heads.yaml")
    del node.claims[0]["source"]
    with pytest.raises(SuiteError, match=r"suite heads, claim 0 \('Mixing heads .*'\) has no source"):
        suite_from_config(node, REPO / "conf")
    node = OmegaConf.load(REPO / "conf" / "suite" / "heads.yaml")
    node.equivalence_margin = None
    with pytest.raises(SuiteError, match="needs a margin"):
        suite_from_config(node, REPO / "conf")


@pytest.mark.skipif(not PAPERS.is_dir(), reason="the papers' texts (../shared/papers) are not on this machine")
def test_every_quote_is_verbatim_in_its_paper() -> None:
    """Up to line breaks (a word hyphenated across a line is joined)."""
    texts = {name: " ".join((PAPERS / f).read_text().replace("-\n", "-").split()) for name, f in PAPER_FILES.items()}
    quoted = [(s.name, c) for s in _suites() for c in s.claims if c.source]
    assert quoted and all(c.paper in texts for _, c in quoted)
    missing = [(suite, c.claim) for suite, c in quoted if c.source.quote not in texts[c.paper]]
    assert not missing, missing
