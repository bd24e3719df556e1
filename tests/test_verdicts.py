"""The verdict rule of zoo/report/claims.py on synthetic per-seed, per-sentence scores whose answer is known.

Each run is a vector of per-sentence scores on one shared test set (sentence difficulty common to every run);
the corpus score is their mean, so `delta_test` sees exactly what it sees for BLEU (summed sufficient statistics)
with effects set by hand. Every test names a case where the rule before issue 37 — per-seed paired bootstraps,
"holds" when every seed is significant, "does not hold" when one is significantly the other way, "match" when
none is significantly worse, no correction — gives another answer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.zoo_testing import REPO
from zoo.metrics import bleu_from_stats, corpus_bleu, sentence_stats
from zoo.metrics import mean_from_stats as mean_score
from zoo.report import render
from zoo.report.claims import (
    ALPHA,
    DeltaTest,
    Question,
    decision_p,
    delta_test,
    judge,
    region,
)
from zoo.report.records import convergence
from zoo.report.run_state import climbing, compaction, compaction_text
from zoo.report.simulate import SCENARIOS, shared_runs
from zoo.report.stats import FAILS, HOLDS, INCONCLUSIVE, TwoComponents, t_cdf, t_quantile
from zoo.report.suite import SuiteError, suite_from_config
from zoo.report.verdict import Decide, Verdict, verdict_cell

PAPERS = REPO.parent / "shared" / "papers"
PAPER_FILES = {  # the claims' `paper` -> its text in ../shared/papers (README.md there)
    "MGK": "000_61e8fe3075a627ec.txt",
    "Mixhead": "001_bc57274191c08c1b.txt",
    "Concise": "003_e076147654140b93.txt",
    "GHT": "004_cb7908ec8b4aa0d8.txt",
    "GHT-PS": "004_cb7908ec8b4aa0d8.txt",
}


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
    return judge([Question(expect, len(pairs), test, margin)])[0].words()


def test_a_real_effect_holds() -> None:
    # The old rule: "inconclusive: seeds disagree" for the 5-seed case — its fifth seed alone (+0.15 on 200
    # sentences of spread 2, p ≈ 0.3) is not significant, so "every seed significant" fails.
    assert verdict("better", runs([0.8, 0.9, 1.0], noise=2.0, sentences=200)) == HOLDS
    assert verdict("better", runs([1.0, 1.1, 0.9, 1.2, 0.15], noise=2.0, sentences=200)) == HOLDS
    assert verdict("worse", runs([-0.8, -0.9, -1.0], noise=2.0, sentences=200)) == HOLDS


def test_no_effect_is_inconclusive_and_says_what_would_decide_it() -> None:
    # Seeds scatter around zero, each far from it on 2000 sentences (+0.6 and −0.5 are both significant per
    # seed): across seeds there is no effect to report — and the words say so without sounding like a null.
    scattered = verdict("better", runs([0.6, -0.5, 0.1], noise=2.0, sentences=2000))
    assert scattered.startswith(f"{INCONCLUSIVE}: the 95% interval crosses 0; ") and "seeds" in scattered
    # Exactly no effect on every seed: the distance to the bound is 0, so no number of seeds decides it.
    flat = verdict("better", runs([0.0, 0.0, 0.0, 0.0], noise=2.0, sentences=300))
    assert flat.startswith(f"{INCONCLUSIVE}: the 95% interval crosses 0; ") and "no number of seeds" in flat


def test_an_effect_of_one_seed_does_not_hold() -> None:
    # One seed shifted by 3 BLEU, the others not at all: the mean is +1, and a bootstrap over sentences alone
    # would call it significant; seed to seed it is noise. The old rule: "holds" for the match claim (no seed
    # significantly worse) and, with a small real effect under the shift, "holds" for better (all three seeds
    # significant on 2000 sentences).
    assert verdict("better", runs([0.0, 0.0, 3.0], noise=2.0, sentences=2000)).startswith(INCONCLUSIVE)
    assert verdict("better", runs([0.3, 0.3, 4.0], noise=2.0, sentences=2000)).startswith(INCONCLUSIVE)
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
    # Here the noise is the test set's, shared by every seed (a 300-sentence test set, per-sentence effects of
    # sd 10): the per-seed Δs agree with each other, and all of them may be off by the same ±1.
    vague = shared_runs(np.random.default_rng(0), [-0.8, -0.9, -0.7], 0.0, 10.0, 1.0, 300)
    words = verdict("match", vague, margin=0.5)
    assert words.startswith("inconclusive: the 95% interval crosses -0.5; ") and "no number of seeds" in words


def test_holds_and_does_not_hold_need_the_same_evidence() -> None:
    # The case (transformer vs fixhead_4head): −0.44 (p ≈ 0.03) and +0.03 (n.s.) on 1420 sentences. The
    # old rule: "does not hold" — one seed against sufficed, where every seed was needed for. Two seeds are too
    # few for either; with a third seed near zero it is no difference (the old rule: still "does not hold").
    asymmetric = runs([-0.44, 0.03], noise=7.9, sentences=1420)
    assert verdict("better", asymmetric) == "too few seeds (2)"
    assert verdict("better", runs([-0.44, 0.03, 0.1], noise=7.9, sentences=1420)).startswith(INCONCLUSIVE)
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


def seeds_only(mean: float, se: float, per_seed: tuple[float, ...]) -> DeltaTest:
    """A Δ whose variance is all seed-to-seed (no shared test-set noise): a plain t-test with n − 1 df."""
    return DeltaTest(mean=mean, per_seed=per_seed, seed_var=se * se, sentence_var=0.0, sentences=1000)


def test_holm_correction_turns_a_lone_significant_claim_inconclusive() -> None:
    # p = 0.03 alone holds; beside three claims with p ≈ 0.5 Holm multiplies it by 4. The old rule corrected
    # nothing.
    se = 0.1
    alone = seeds_only(t_quantile(1 - 0.015, 2) * se, se, (0.5, 0.6, 0.7))
    assert decision_p(alone, "better")[0] == pytest.approx(0.03, abs=1e-6)
    null = seeds_only(0.05, 0.07, (0.0, 0.05, 0.1))
    assert judge([Question("better", 3, alone)])[0].kind == HOLDS
    judged = judge([Question("better", 3, alone), *(Question("better", 3, null) for _ in range(3))])
    assert judged[0].p_holm == pytest.approx(0.12, abs=1e-6)
    assert judged[0].level == pytest.approx(1 - ALPHA / 4)  # the first Holm step: α/m
    assert judged[0].words().startswith(f"{INCONCLUSIVE}: the 98.8% interval crosses 0; ")


def test_holm_families_are_per_paper() -> None:
    """One paper's verdict does not depend on how many claims another paper has (issue 60): the heads suite's
    families are its three papers' sources, and our question is a family of its own."""
    from zoo.report.claims import OURS_FAMILY, family_of

    heads = next(s for s in _suites() if s.name == "heads")
    families = {family_of(c) for c in heads.claims if not c.post_hoc}  # a claim written later: a family apart
    assert families == {"Zhang et al. 2022", "Bhojanapalli et al. 2020", "Nguyen et al. 2022", OURS_FAMILY}
    ght = next(s for s in _suites() if s.name == "ght")
    declared = {family_of(c) for c in ght.claims if not c.post_hoc}
    assert declared == {"Ni et al. 2023"}  # GHT and GHT-PS: one paper, one family


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
    for df, q in [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (10, 2.2281), (1000, 1.9623)]:
        assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    # Real df, from closed forms: df = 1 is Cauchy, df = 2 has F⁻¹(u) = (2u − 1)/√(2u(1 − u)); df = ∞ the normal.
    for u in (0.6, 0.9, 0.975, 0.999):
        assert t_quantile(u, 1.0) == pytest.approx(np.tan(np.pi * (u - 0.5)), rel=1e-9)
        assert t_quantile(u, 2.0) == pytest.approx((2 * u - 1) / np.sqrt(2 * u * (1 - u)), rel=1e-9)
    assert t_cdf(1.959963985, float("inf")) == pytest.approx(0.975, abs=1e-9)
    between = [t_quantile(0.975, df) for df in (2.0, 2.5, 3.0)]  # non-integer df sit between their neighbours
    assert between[0] > between[1] > between[2]


def test_cochran_cox_reduces_to_each_component_and_inverts() -> None:
    seeds = TwoComponents(0.04, 2, 0.0, 1419)
    sentences = TwoComponents(0.0, 2, 0.04, 1419)
    assert seeds.critical(0.975) == pytest.approx(t_quantile(0.975, 2))
    assert sentences.critical(0.975) == pytest.approx(t_quantile(0.975, 1419))
    mixed = TwoComponents(0.01, 2, 0.03, 1419)  # a quarter seeds: between the two, nearer the normal
    assert sentences.critical(0.975) < mixed.critical(0.975) < seeds.critical(0.975)
    for u in (0.6, 0.975, 0.999):
        assert mixed.cdf(mixed.critical(u)) == pytest.approx(u, abs=1e-9)
    assert t_quantile(0.975, mixed.effective_df()) == pytest.approx(mixed.critical(0.975), rel=1e-6)


def test_convergence_and_the_state_in_the_verdict() -> None:
    """Issue 86: a verdict's words carry the budget it was measured at, and a run counts as still climbing when its
    validation loss still falls (over its last quarter) — not only when the greedy sample's quality still rises."""
    points = [(250, 1.0, 7.0), (750, 3.4, 6.0), (1000, 7.2, 5.5), (1200, 10.5, 5.3)]
    curve = [{"step": s, "valid_quality": q, "valid_loss": loss} for s, q, loss in points]
    state = convergence(curve)
    # 10.5 minus 6.59 interpolated at update 960; the loss at update 900 (5.7, interpolated) minus 5.3
    assert state == {"last20_gain": 3.91, "best_at_last": True, "last25_loss_fall": 0.4}
    flat = convergence([{"step": s, "valid_quality": q} for s, q in [(400, 20.0), (800, 21.0), (1000, 20.9)]])
    assert flat is not None and flat["last20_gain"] < 0.5 and not flat["best_at_last"]
    assert flat["last25_loss_fall"] is None  # no losses on that curve
    learning = {"convergence": {"last20_gain": 0.1, "best_at_last": False, "last25_loss_fall": 0.12}}
    stalled = {"convergence": {"last20_gain": 0.3, "best_at_last": True, "last25_loss_fall": 0.01}}
    assert climbing([learning, stalled]) == {"runs": 2, "climbing": 1, "max_gain": 0.3, "max_loss_fall": 0.12}
    state = {"updates": [2400, 2400], "epochs": [1.1, 1.1], **climbing([learning, stalled])}
    assert verdict_cell(Verdict(FAILS, 3), state, "ROUGE-L") == (
        "does not hold at 2400 updates ≈ 1.10 epochs — 1 of 2 runs still climbing (validation loss down up to "
        "0.12 nats over the last quarter; ROUGE-L up to +0.3 over the last 20%)"
    )
    done = {"updates": [4800, 4800], "epochs": None, **climbing([stalled])}
    decide = Decide(bound=0, gap=0.3, floor=0.1, spread=0.5, seeds=5)
    crossing = Verdict(INCONCLUSIVE, 3, 0.2, 0.4, 0.95, (-0.1, 0.7), 1, crosses=(0.0,), decide=decide)
    assert verdict_cell(crossing, done) == (
        "inconclusive at 4800 updates: the 95% interval crosses 0; ≈ 5 seeds would decide it if Δ̄ and the seeds' "
        "spread (s = 0.50) stay"
    )
    assert verdict_cell(Verdict(None, 2), done) == "too few seeds (2)"  # no verdict: no budget to say


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
    # 9.2 − 9.04 at update 800; the curve has no validation loss
    assert record["convergence"] == {"last20_gain": 0.16, "best_at_last": True, "last25_loss_fall": None}


def test_ght_verdicts_carry_the_compaction_of_the_trained_groups_as_a_diagnostic() -> None:
    """GHT-PS is judged as the official procedure runs it (voting at a fixed point, compact or not); the groups'
    compaction at the vote stands beside the verdict — which partition it measures and how many runs compacted."""

    def run(silhouette: float, intra: float, partition: str = "trained", voted: bool = True) -> dict:
        after = {"silhouette": silhouette, "intra_cos": intra}
        return {"compactness": {"after": after, "partition": partition}, "voting": {"step": 720} if voted else None}

    assert compaction([{"compactness": None, "voting": None}]) is None  # the transformer side: nothing grouped
    d = compaction([run(0.02, 0.49), run(0.31, 0.62), {"compactness": None}])
    assert d == {
        "runs": 2,
        "silhouette": (0.02, 0.31),
        "intra_cos": (0.49, 0.62),
        "compact": 1,
        "partition": "trained",
        "at_vote": True,
    }
    assert compaction_text(d) == (
        "groups at the vote: silhouette 0.02–0.31, intra cos 0.49–0.62 (trained partition), "
        "compact (≥ 0.25) in 1 of 2 runs"
    )
    old = compaction_text(compaction([run(0.03, 0.49, "probe", voted=False)] * 3))
    assert (
        old == "groups at the end: silhouette 0.03, intra cos 0.49 (probe partition), compact (≥ 0.25) in 0 of 3 runs"
    )


def _suites():
    return [suite_from_config(OmegaConf.load(p), REPO / "conf") for p in sorted((REPO / "conf/suite").glob("*.yaml"))]


def test_the_delta_cell_shows_every_number_the_words_are_made_from() -> None:
    delta = {"mean": 0.31, "low": -1.2, "high": 1.9, "seeds": 3}
    delta = {**delta, "df": 2.4}
    verdict = Verdict(INCONCLUSIVE, 3, p=0.2, p_holm=0.4, level=0.975, interval=(-1.5, 2.2), family_size=2)
    assert render._delta_cell({"delta": delta, "verdict": verdict.to_json()}) == (
        "+0.31 [-1.20, +1.90] (df 2); at the Holm level 97.5%: [-1.50, +2.20]; p=0.200, Holm 0.400"
    )


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
    quoted = [(s.name, c) for s in _suites() for c in (*s.claims, *s.speed_claims) if c.source]
    assert quoted and all(c.paper in texts for _, c in quoted)
    missing = [(suite, c.claim) for suite, c in quoted if c.source.quote not in texts[c.paper]]
    assert not missing, missing


# ---------------------------------------------------------------------------------------------- simulations
SIMULATIONS = 1000


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_effect_gives_a_verdict_at_most_five_percent_of_the_time(seeds: int, scenario: str) -> None:
    """Under no effect a definite verdict — the 95% interval off 0, which is p < α for a claim alone — is a false
    positive; its rate stays within α plus three simulation standard errors."""
    rng = np.random.default_rng(60 + seeds)
    seed_sd, shared_sd, noise = SCENARIOS[scenario]
    definite = 0
    for i in range(SIMULATIONS):
        pairs = shared_runs(rng, [0.0] * seeds, seed_sd, shared_sd, noise, sentences=200)
        low, high = delta_test(pairs, score=mean_score, samples=200, seed=i).interval(0.95)
        definite += low > 0 or high < 0
    rate = definite / SIMULATIONS
    assert rate <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / SIMULATIONS), (scenario, seeds, rate)


def test_a_definite_verdict_alone_is_the_95_percent_interval_off_the_bound() -> None:
    """What the simulations count (the interval) is what `judge` decides for a claim alone (the p-value)."""
    rng = np.random.default_rng(7)
    for i in range(12):
        offsets = list(rng.normal(0.3 * (i % 4), 0.3, 3))
        test = delta_test(shared_runs(rng, offsets, 0.2, 2.0, 2.0, 200), score=mean_score, samples=200, seed=i)
        low, high = test.interval(0.95)
        judged = judge([Question("better", 3, test)])[0]
        assert (judged.kind in (HOLDS, FAILS)) == (low > 0 or high < 0), (offsets, judged, low, high)


def test_a_consistent_effect_with_small_seed_variance_holds_beside_seven_null_claims() -> None:
    """The issue's case: 32 standard heads lose −2.21, −2.20 and −2.59 BLEU (test-set SE ≈ 0.18 on 1,420
    sentences), judged in a family of eight; the rule before issue 60 said "no significant difference"."""
    rng = np.random.default_rng(32)
    real = delta_test(shared_runs(rng, [-2.21, -2.20, -2.59], 0.0, 6.0, 3.0, 1420), score=mean_score, samples=500)
    nulls = [
        delta_test(shared_runs(rng, [0.0, 0.1, -0.1], 0.3, 6.0, 3.0, 1420), score=mean_score, samples=500, seed=s)
        for s in range(7)
    ]
    judged = judge([Question("worse", 3, real), *(Question("worse", 3, t) for t in nulls)])
    assert judged[0].kind == HOLDS, judged[0]
    assert judged[0].interval is not None and judged[0].interval[1] < 0 < 1 - judged[0].level


def test_a_shift_of_one_seed_does_not_hold() -> None:
    rng = np.random.default_rng(3)
    pairs = shared_runs(rng, [0.0, 0.0, 3.0], 0.0, 2.0, 2.0, 1420)
    assert judge([Question("better", 3, delta_test(pairs, score=mean_score))])[0].kind == INCONCLUSIVE


# ---------------------------------------------------------------------------------------------- rendered words
def verdict_problem(c: dict) -> str | None:
    """Why a stored claim's verdict disagrees with the numbers it carries, or its words with its kind (None: they
    agree)."""
    v = Verdict.from_json(c["verdict"])
    words = v.words()
    if "no significant difference" in words:
        return "a null-sounding verdict"
    if v.p is None or v.p_holm is None or v.interval is None:
        ok = v.kind is None and words.startswith(("too few seeds", "degenerate outputs"))
        return None if ok else "no test, yet a verdict"
    if not words.startswith(v.kind or "?"):
        return "words that do not begin with the kind"
    lo, hi = region(c["expect"], c.get("margin"))
    low, high = v.interval
    inside, outside = lo < low and high < hi, high < lo or low > hi
    if v.kind == HOLDS:
        return None if v.p_holm < ALPHA and inside else "holds without the numbers for it"
    if v.kind == FAILS:
        return None if v.p_holm < ALPHA and outside else "does not hold without the numbers for it"
    if v.kind == INCONCLUSIVE:
        if v.p_holm < ALPHA:
            return "inconclusive with an adjusted p below α"
        if v.holm_stops:
            return None if v.p < (1 - (v.level or 1)) / v.share else "Holm stops, yet its own test failed"
        return None if not (inside or outside) and v.crosses else "inconclusive, but the interval decides"
    return "unknown verdict kind"


def test_every_stored_verdict_agrees_with_its_interval_and_adjusted_p() -> None:
    import json

    checked = 0
    for path in sorted((REPO / "results").glob("*/report.json")):
        for c in json.loads(path.read_text()).get("claims") or []:
            problem = verdict_problem(c)
            assert problem is None, (path.parent.name, c["claim"], c["verdict"], problem)
            checked += c["verdict"]["p"] is not None
    assert checked >= 10  # the committed suites do have tested claims


def test_results_readme_states_each_tables_verdict_counts() -> None:
    """results/README.md says, per table, how many claims hold / do not hold / are inconclusive / untested — the
    counts the render stored in report.json (zoo/report/tally.py), not typed from memory."""
    import json

    from zoo.report.tally import counts_text

    lines = (REPO / "results" / "README.md").read_text().splitlines()
    stated = 0
    for path in sorted((REPO / "results").glob("*/report.json")):
        counts = json.loads(path.read_text()).get("verdict_counts")
        if not counts or not any(sum(n.values()) for n in counts.values()):
            continue
        row = next((line for line in lines if line.startswith(f"| `{path.parent.name}` |")), None)
        assert row is not None, f"results/README.md has no row for {path.parent.name}"
        assert counts_text(counts) in row, (path.parent.name, counts_text(counts))
        stated += 1
    assert stated >= 5


def test_each_claim_says_whether_its_pairs_share_cpu_and_commit() -> None:
    """Issue 86: `ght_ps_gct16` seeds 2–3 ran on a Xeon at another commit, their baselines on an AMD EPYC; the paired
    design no longer controlled machine or code and nothing said so. A claim's pairing names the seeds across CPUs
    (and their machines), those with a CPU model unrecorded (records before the signature), and those across
    commits."""
    from zoo.report.run_state import pairing, pairing_text, same_machine

    xeon, epyc = "cpu:Intel(R) Xeon(R) Processor (family 6 model 207, AMX)", "cpu:AMD EPYC (family 25 model 1, AVX2)"
    assert same_machine(epyc, epyc) and same_machine(xeon, epyc) is False
    assert same_machine("cpu:AMD EPYC", epyc) is None  # same vendor string, model not recorded on one side
    pairs = [
        (1, {"machine": "cpu:AMD EPYC", "git_sha": "a"}, {"machine": epyc, "git_sha": "a"}),
        (2, {"machine": xeon, "git_sha": "b"}, {"machine": epyc, "git_sha": "a"}),
        (3, {"machine": epyc, "git_sha": "c"}, {"machine": epyc, "git_sha": "a"}),
    ]
    p = pairing(pairs)
    assert p == {"pairs": 3, "across_cpus": {2: [xeon, epyc]}, "cpu_unrecorded": [1], "across_commits": [2, 3]}
    assert pairing_text(p) == (
        "pairs on one CPU model: 1 of 3 (seed 2 across CPUs: Intel(R) Xeon(R) Processor (family 6 model 207, AMX) "
        "vs AMD EPYC (family 25 model 1, AVX2); seed 1: a CPU model unrecorded); at one commit: 1 of 3"
    )
    assert pairing_text(pairing(pairs[2:])) == "pairs on one CPU model: 1 of 1; at one commit: 0 of 1"


def test_the_results_status_block_is_generated_from_every_report(tmp_path) -> None:
    """Issue 86: the status was typed by hand and read a 1.1-epoch snapshot as an answer. results/README.md's status
    block is status_table over every report.json (the render stage rewrites it: write_status), per paper, verdicts
    reached by runs still climbing apart from settled ones."""
    from zoo.report.publish import write_status
    from zoo.report.readme import read_block
    from zoo.report.tally import STATUS_BLOCK, read_reports, status_counts, status_table

    results = REPO / "results"
    assert read_block((results / "README.md").read_text(), STATUS_BLOCK) == status_table(read_reports(results))
    climbing = {"paper": "GHT", "verdict": Verdict(FAILS, 6).to_json(), "state": {"climbing": 6}}
    settled = {"paper": "GHT", "verdict": Verdict(HOLDS, 3).to_json(), "state": {"climbing": 0}}
    ours = {"paper": "ours", "verdict": Verdict(None, 2).to_json(), "state": {}}
    reports = {"a": {"claims": [climbing, ours]}, "b": {"claims": [settled]}}
    counts = status_counts(reports)
    assert list(counts) == ["GHT", "ours"]  # our questions last
    assert counts["GHT"] == {"does not hold (climbing)": 1, "holds (settled)": 1} and counts["ours"]["untested"] == 1
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps(reports["a"]))
    (tmp_path / "README.md").write_text("x\n<!-- results:status -->\nold\n<!-- /results:status -->\n")
    assert write_status(tmp_path) and "| GHT | 0 | 0 | 0 | 1 | 0 | 0 | `a` |" in (tmp_path / "README.md").read_text()


def test_a_claim_written_after_the_records_cannot_move_the_declared_verdicts() -> None:
    """Issue 86 asked for claim rows the records could answer; written after the runs, they are `post_hoc`: a Holm
    family of their own, so the verdicts of the claims declared before the runs stay what they were."""
    from zoo.report.claims import family_of
    from zoo.report.suite import Claim, Source

    source = Source("Ni et al. 2023", "§5.1", "…")
    declared = Claim("GHT-PS", "c", "d", "ght_ps", "transformer", "better", source)
    added = Claim("GHT-PS", "c", "d", "ght_ps", "ght", "not_worse", source, margin=0.5, post_hoc=True)
    assert family_of(declared) == "Ni et al. 2023"
    assert family_of(added) == "Ni et al. 2023, written after the records"
    rows = {
        name: json.loads((REPO / "results" / name / "report.json").read_text())["claims"]
        for name in ("ght_4800", "heads", "ght")
    }
    for claims in rows.values():
        for c in claims:  # a family's size counts its own tested claims: the late ones never join a declared one
            tested = [d for d in claims if d["family"] == c["family"] and d["verdict"]["p"] is not None]
            assert c["verdict"]["p"] is None or c["verdict"]["family_size"] == len(tested)
    late = [c for claims in rows.values() for c in claims if c["family"].endswith("written after the records")]
    assert len(late) == 7


def test_a_verdict_is_stored_as_fields_and_an_old_report_of_words_is_refused(tmp_path) -> None:
    """Issue 87: report.json stores each verdict's fields (kind, p, Holm p, interval, reason) and the words are
    rendered from them; a report.json of the older format (words) is refused with the command that rewrites it."""
    from zoo.report.records import RecordError
    from zoo.report.tally import read_reports

    decide = Decide(bound=0.0, gap=0.31, floor=0.12, spread=0.69, seeds=4)
    v = Verdict(INCONCLUSIVE, 3, 0.026, 0.052, 0.975, (-0.06, 4.9), 3, crosses=(0.0,), decide=decide)
    assert Verdict.from_json(json.loads(json.dumps(v.to_json()))) == v
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(json.dumps({"claims": [{"paper": "GHT", "verdict": "holds"}]}))
    with pytest.raises(RecordError, match=r"stores its verdicts as words .* python -m zoo.devtools.render_all"):
        read_reports(tmp_path)
