"""The speed verdict rule: a paper's "X decodes faster than Y" judged from interleaved timing rounds.

Per round i the ratio r_i = system sent/s ÷ baseline sent/s of the same round (every entry decodes the same forced
lengths, so this is also the per-token ratio; a machine-wide slowdown during a round hits both sides of it). On
x_i = ln r_i: mean, sample sd, Student's t with n − 1 df. A claim **holds** when its one-sided p for "the true
ratio is at most ×MARGIN" is below ALPHA after Holm over the paper's speed claims — for a claim alone, the 95 %
interval's lower end above ×MARGIN; it **does not hold** when, symmetrically, the ratio is shown below ×MARGIN
("slower" when the interval's upper end is below ×1); anything else is inconclusive. The margin is the noise
floor: timing two identical models differs by a few percent on a shared machine (the `ght` suite measured
×1.04–×1.18 for a model of the transformer's exact shapes), so a speed-up within it is not one. With independent
rounds, P(holds) ≤ ALPHA per claim when the true ratio is ≤ ×MARGIN, and Holm keeps each direction's family-wise
error ≤ ALPHA (≤ 2·ALPHA = 5 % for any wrong verdict in a family). Fewer than MIN_ROUNDS rounds get no verdict:
with 2 df the t quantile (4.30) makes the interval too wide to mean anything, and the sd itself is a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zoo.report.stats import FAILS, HOLDS, INCONCLUSIVE, holm, t_cdf, t_quantile

MARGIN = 1.05  # a speed-up must exceed 5 % to count: a practical margin (the negative controls' own spread, shown
# beside the claims in every report, has been wider: intervals to ×0.78–×1.27 on this shared 2-core machine)
ALPHA = 0.025  # one-sided, per direction: the 95 % interval's ends
MIN_ROUNDS = 5
MAX_ROUNDS_HINT = 60  # beyond this many rounds, "more rounds" is no practical advice: the mean sits on the margin

NOT_MEASURED = "not measured"
CONTROL_OK, CONTROL_WIDE, CONTROL_FAILED = "passes", "passes, but wide", "FAILS"


@dataclass(frozen=True)
class RatioTest:
    """Student's t on the log per-round ratios of one (system, baseline, point)."""

    ratios: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.ratios)

    @property
    def logs(self) -> list[float]:
        return [math.log(r) for r in self.ratios]

    @property
    def mean(self) -> float:
        return sum(self.logs) / self.n

    @property
    def sd(self) -> float:
        if self.n < 2:
            return math.nan
        m = self.mean
        return math.sqrt(sum((x - m) ** 2 for x in self.logs) / (self.n - 1))

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n)

    @property
    def geo_mean(self) -> float:
        """The geometric-mean ratio: exp of the mean log ratio."""
        return math.exp(self.mean)

    def interval(self) -> tuple[float, float]:
        """The 95 % interval of the true ratio (both ends as ratios)."""
        half = t_quantile(1 - ALPHA, self.n - 1) * self.se
        return math.exp(self.mean - half), math.exp(self.mean + half)

    def p_at_most(self, ratio: float = MARGIN) -> float:
        """One-sided p of H0 "the true ratio is ≤ `ratio`" (small: the system is faster than that)."""
        return 1.0 - self._below(ratio)

    def p_at_least(self, ratio: float = MARGIN) -> float:
        """One-sided p of H0 "the true ratio is ≥ `ratio`" (small: the system is not that much faster)."""
        return self._below(ratio)

    def _below(self, ratio: float) -> float:
        """P(T ≤ t) of the observed t statistic against ln `ratio`; a zero spread decides by the mean's side."""
        diff = self.mean - math.log(ratio)
        if self.se == 0.0:
            return 1.0 if diff > 0 else 0.0 if diff < 0 else 0.5
        return t_cdf(diff / self.se, self.n - 1)


def ratio_test(values: Sequence[float], base: Sequence[float]) -> RatioTest | None:
    """Per-round ratios of two entries timed in the same rounds (None unless both have every round, all > 0)."""
    if not values or len(values) != len(base) or min(*values, *base) <= 0:
        return None
    return RatioTest(tuple(v / b for v, b in zip(values, base, strict=True)))


@dataclass(frozen=True)
class SpeedJudgement:
    """A speed claim's verdict, the words that qualify it, and its p-values (None: not tested)."""

    verdict: str  # HOLDS, FAILS, INCONCLUSIVE, or why there is none ("too few rounds (3)", NOT_MEASURED)
    detail: str = ""
    p: float | None = None
    p_holm: float | None = None

    @property
    def kind(self) -> str | None:
        """HOLDS, FAILS or INCONCLUSIVE; None where the claim was not tested."""
        return self.verdict if self.verdict in (HOLDS, FAILS, INCONCLUSIVE) else None


def rounds_to_decide(test: RatioTest) -> int | None:
    """How many rounds would put the interval's end past ×MARGIN if the mean and sd stayed (None: not within
    MAX_ROUNDS_HINT — the mean sits on the margin)."""
    gap = abs(test.mean - math.log(MARGIN))
    if test.sd == 0.0:
        return test.n if gap > 0 else None
    for n in range(max(test.n, MIN_ROUNDS), MAX_ROUNDS_HINT + 1):
        if gap > t_quantile(1 - ALPHA, n - 1) * test.sd / math.sqrt(n):
            return n
    return None


def _inconclusive_detail(test: RatioTest) -> str:
    """What would decide an inconclusive claim: more rounds (about how many), or nothing practical."""
    n = rounds_to_decide(test)
    if n is None:
        return f"on the margin: ×{test.geo_mean:.2f} is too close to ×{MARGIN:.2f} for more rounds to decide"
    if n <= test.n:  # decided for this claim alone: Holm over the paper's claims asks for more
        return "decided for this claim alone, not after Holm over the paper's claims: more rounds"
    return f"about {n} rounds would decide it if the mean and spread stayed (now {test.n})"


def judge_family(tests: Sequence[RatioTest | None]) -> list[SpeedJudgement]:
    """Verdicts of one paper's speed claims on one machine: Holm over the claims with enough rounds, one
    direction at a time (holds: ratio > ×MARGIN; does not hold: ratio < ×MARGIN)."""
    ready = [i for i, t in enumerate(tests) if t is not None and t.n >= MIN_ROUNDS]
    up = holm([tests[i].p_at_most() for i in ready])  # type: ignore[union-attr]
    down = holm([tests[i].p_at_least() for i in ready])  # type: ignore[union-attr]
    out = []
    for i, test in enumerate(tests):
        if test is None:
            out.append(SpeedJudgement(NOT_MEASURED))
            continue
        if i not in ready:
            out.append(SpeedJudgement(f"too few rounds ({test.n})", f"a verdict needs {MIN_ROUNDS}"))
            continue
        k = ready.index(i)
        p, p_holm = test.p_at_most(), up[k]
        if p_holm < ALPHA:
            out.append(SpeedJudgement(HOLDS, f"faster than ×{MARGIN:.2f}", p, p_holm))
        elif down[k] < ALPHA:
            slower = test.interval()[1] < 1.0
            detail = "slower" if slower else f"no speed-up beyond the ×{MARGIN:.2f} margin"
            out.append(SpeedJudgement(FAILS, detail, p, p_holm))
        else:
            out.append(SpeedJudgement(INCONCLUSIVE, _inconclusive_detail(test), p, p_holm))
    return out


def judge_control(test: RatioTest | None) -> tuple[str, str]:
    """A negative control (two timings of the same work): (status, words). Expected: the interval within
    ×1/MARGIN … ×MARGIN. It FAILS when the rule would call it faster or slower beyond the margin — then the
    measurement, not the model, made the difference, and no claim of that file should be trusted."""
    if test is None:
        return NOT_MEASURED, ""
    if test.n < MIN_ROUNDS:
        return f"too few rounds ({test.n})", f"a check needs {MIN_ROUNDS}"
    lo, hi = test.interval()
    if lo > MARGIN:
        return CONTROL_FAILED, f"would **hold** as faster than ×{MARGIN:.2f}: the measurement is not trustworthy"
    if hi < 1 / MARGIN:
        return CONTROL_FAILED, f"would hold as slower than ×{1 / MARGIN:.2f}: the measurement is not trustworthy"
    if 1 / MARGIN <= lo and hi <= MARGIN:
        return CONTROL_OK, "within the margin"
    return CONTROL_WIDE, "the interval reaches past the margin: the noise on this machine is wider than it"


def judge_claims(tests: Sequence[RatioTest | None], families: Sequence[str]) -> list[SpeedJudgement]:
    """`judge_family` per family (the claims' source paper), results in the claims' order."""
    out: list[SpeedJudgement | None] = [None] * len(tests)
    for family in dict.fromkeys(families):
        idx = [i for i, f in enumerate(families) if f == family]
        for i, j in zip(idx, judge_family([tests[i] for i in idx]), strict=True):
            out[i] = j
    return [j for j in out if j is not None]


RULE_TEXT = (
    f"Rule: per round, ratio = system sent/s ÷ baseline sent/s of the same round (same work, so also the per-token "
    f"ratio); Student's t on the log ratios ({MIN_ROUNDS} rounds or more, else no verdict). **holds**: faster than "
    f"×{MARGIN:.2f} — a practical margin: a speed-up under 5 % is not claimed (the negative controls show how "
    "wide timing the same work twice reads on this machine) — with Holm-adjusted one-sided "
    f"p < {ALPHA} over the paper's speed claims (for one claim: the 95 % interval's lower end above ×{MARGIN:.2f}); "
    f'**does not hold**: shown below ×{MARGIN:.2f} the same way ("slower" when the interval ends below ×1.00); '
    "else **inconclusive**. False-positive rate: with independent rounds, P(holds) ≤ 2.5 % per claim when the true "
    "speed-up is ×1.05 or less; with Holm, ≤ 2.5 % that any claim of a paper wrongly holds (≤ 5 % for any wrong "
    'verdict, either way). p: the one-sided p of "speed-up ≤ ×1.05"; Holm: adjusted over the paper\'s claims.'
)

__all__ = [
    "ALPHA",
    "CONTROL_FAILED",
    "CONTROL_OK",
    "CONTROL_WIDE",
    "MARGIN",
    "MIN_ROUNDS",
    "NOT_MEASURED",
    "RULE_TEXT",
    "RatioTest",
    "SpeedJudgement",
    "judge_claims",
    "judge_control",
    "judge_family",
    "ratio_test",
    "rounds_to_decide",
]
