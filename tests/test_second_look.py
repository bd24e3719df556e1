"""A declared second look (zoo/report/second_look.py, issue 85): p* = min(p₁/r, p₂/(1 − r)) is a valid p-value
whichever claims continue, the suites' rows take seeds 4–5 only for claims that continue, and the two looks keep
the false-positive rate at α where adding the seeds without a design does not."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from zoo.metrics import mean_from_stats as mean_score
from zoo.report.claims import ALPHA, DeltaTest, Question, collect_claims, judge
from zoo.report.second_look import DECIDED, PENDING, STOPPED, TAKEN, SecondLook, second_look_from
from zoo.report.simulate import shared_runs, two_look_rates
from zoo.report.stats import HOLDS, INCONCLUSIVE
from zoo.report.suite import Claim, Suite, SuiteError

DESIGN = SecondLook(seeds=(4, 5), first_share=0.23, continue_below=0.2)


def seeds_only(mean: float, per_seed: tuple[float, ...]) -> DeltaTest:
    """A Δ whose variance is all seed-to-seed: a plain t-test with n − 1 df."""
    s2 = float(np.var(per_seed, ddof=1))
    return DeltaTest(mean=mean, per_seed=per_seed, seed_var=s2 / len(per_seed), sentence_var=0.0, sentences=1000)


def test_p_star_passes_a_level_only_where_one_look_passes_its_share() -> None:
    """The union bound the design rests on: p* ≤ γ needs p₁ ≤ rγ or p₂ ≤ (1 − r)γ, so P(p* ≤ γ) ≤ γ under no
    effect, however the looks correlate and whichever claims continue."""
    grid = [0.0005, 0.002, 0.01, 0.02, 0.04, 0.1, 0.3, 1.0]
    for p1, p2, level in itertools.product(grid, grid, [0.005, 0.01, 0.025, 0.05]):
        passes = DESIGN.p_value(p1, p2) <= level
        assert passes == (p1 <= DESIGN.first_share * level or p2 <= (1 - DESIGN.first_share) * level)
    assert DESIGN.p_value(0.01) == pytest.approx(0.01 / 0.23)  # before look 2: look 1 alone, at its share


def test_a_family_under_the_second_look() -> None:
    """A clear claim is decided at look 1 and stays so; a near one waits for its look-2 runs, then the five seeds
    decide it; a far one stops at look 1; Holm runs over the family's p*."""
    clear = Question("better", 3, seeds_only(2.0, (1.9, 2.0, 2.1)))
    near = seeds_only(0.5, (0.2, 0.5, 0.8))  # p₁ ≈ 0.07: not decided, continues
    far = Question("better", 3, seeds_only(0.1, (-1.0, 0.1, 1.2)))
    near_five = seeds_only(0.5, (0.2, 0.5, 0.8, 0.45, 0.55))

    before = judge([clear, Question("better", 3, near), far], design=DESIGN)
    assert [v.second_look for v in before] == [DECIDED, PENDING, STOPPED]
    assert before[0].kind == HOLDS and "decided at look 1" in before[0].words()
    assert before[1].kind == INCONCLUSIVE and "the declared second look decides it" in before[1].words()
    assert before[2].kind == INCONCLUSIVE and "stops there" in before[2].words()

    after = judge([clear, Question("better", 3, near, second=near_five), far], design=DESIGN)
    assert [v.second_look for v in after] == [DECIDED, TAKEN, STOPPED]
    assert after[0].p_holm is not None and before[0].p_holm is not None
    assert after[0].p_holm <= before[0].p_holm  # a lower p* elsewhere never undoes a decided claim
    taken = after[1]
    assert taken.kind == HOLDS and taken.seeds == 5 and taken.look == 2 and len(taken.looks) == 2
    assert taken.p == pytest.approx(min(taken.looks[0] / 0.23, taken.looks[1] / 0.77))
    assert taken.share == pytest.approx(0.77) and "(at the second look: 5 seeds)" in taken.words()
    assert "p₁=" in taken.p_words() and "p*=" in taken.p_words()
    # without a design the same three seeds are judged as before (one look, its own p)
    plain = judge([clear, Question("better", 3, near), far])
    assert [v.second_look for v in plain] == [None] * 3 and "looks" not in plain[0].to_json()


def _suite(design: SecondLook | None) -> Suite:
    return Suite(
        name="t",
        task="translation",
        data="d",
        size=None,
        trainer=None,
        experiment=None,
        seeds=(1, 2, 3),
        baseline="base",
        entries=("base", "near", "clear"),
        claims=(Claim("P", "c", "d", "near", "base", "better"), Claim("P", "c", "d", "clear", "base", "better")),
        second_look=design,
    )


def test_a_claims_row_takes_seeds_4_and_5_only_when_it_continues() -> None:
    """The records of seeds 4–5 are in for every entry; under the design only the continuing claim is measured
    over them (a decided one keeps its three seeds); without one every claim uses every seed, as before."""
    rng = np.random.default_rng(5)
    stats = {}
    for name, offsets in (("near", [0.4, 0.8, 0.2, 0.6, 0.5]), ("clear", [3.0] * 5)):
        for seed, (system, base) in enumerate(shared_runs(rng, offsets, 0.0, 0.0, 2.0, 200), 1):
            stats[(name, seed)], stats[("base", seed)] = system, base
    entries = {e: {"seeds": {s: {"updates": 1200} for s in range(1, 6)}, "quality": {}, "size": None} for e in stats}

    def rows(design: SecondLook | None, seeds: list[int]) -> list[dict]:
        return collect_claims(
            _suite(design), entries, seeds, lambda *_: None, lambda e, s: stats.get((e, s)), mean_score, 200
        )

    near, clear = rows(DESIGN, [1, 2, 3, 4, 5])
    assert clear["verdict"]["second_look"] == DECIDED and clear["delta"]["seeds"] == 3
    assert near["verdict"]["second_look"] == TAKEN and near["delta"]["seeds"] == 5
    near3, _ = rows(DESIGN, [1, 2, 3, 4])  # seed 5 not in yet: look 2 waits
    assert near3["verdict"]["second_look"] == PENDING and near3["delta"]["seeds"] == 3
    assert [r["delta"]["seeds"] for r in rows(None, [1, 2, 3, 4, 5])] == [5, 5]


def test_the_two_looks_keep_the_false_positive_rate_where_added_seeds_do_not() -> None:
    """Under no effect, in the scenario where seeds dominate (the stored simulation's worst), the declared two looks
    stay within α plus three simulation standard errors; a definite verdict of theirs is one of testing the added
    seeds at α without a design, which is why that rate is higher."""
    n = 1000
    rates = two_look_rates(DESIGN, 3, "seeds", n, seed=7)
    assert rates["designed"] <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / n), rates
    assert rates["naive"] >= rates["designed"]


def test_a_second_look_is_refused_unless_it_names_new_seeds_and_proper_shares() -> None:
    assert second_look_from({"seeds": [4, 5], "first_share": 0.23, "continue_below": 0.2}) == DESIGN
    for bad in (
        {"seeds": [4, 4], "first_share": 0.23, "continue_below": 0.2},
        {"seeds": [4, 5], "first_share": 1.0, "continue_below": 0.2},
        {"seeds": [4, 5], "first_share": 0.23},
    ):
        with pytest.raises(ValueError, match="second_look"):
            second_look_from(bad)
    assert issubclass(SuiteError, ValueError)
    assert replace(DESIGN, first_share=0.5).share(2) == 0.5
