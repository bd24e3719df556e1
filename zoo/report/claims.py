"""The papers' claims (and our own questions), each answered by one comparison of the suite's records.

A claim row quotes the paper's sentence, says how the comparison is designed, and shows the measured numbers:
per seed the paired bootstrap of the two runs trained with that seed (sacreBLEU, test sentences resampled);
over seeds Δ̄, the mean of the seeds' corpus-BLEU differences, with its 95% interval; the budget and whether
the runs had stopped climbing; and a verdict that follows from those numbers by this rule (issue 37):

* **Uncertainty of Δ̄: seeds and sentences.** Two seeds of one model differ by more than most claimed effects, so
  Δ̄'s standard error comes from a two-way bootstrap: draw n seeds with replacement, then the test sentences
  with replacement — one draw for both systems and every drawn seed, as all were scored on the one test set —
  recompute each drawn seed's corpus BLEU from per-sentence statistics and average. The bootstrap variance is
  scaled by n/(n−1) (resampling n seeds sees (n−1)/n of their variance) and read against Student's t with n−1
  degrees of freedom rather than the bootstrap's percentiles: with 3–5 seeds a percentile interval is no wider
  than the seeds' own spread and covers far less than 95%. A plain t-interval over per-seed Δs was not chosen
  because it misses the test-set sampling all seeds share.
* **Each expectation is a region for the true Δ**: better (0, ∞), worse (−∞, 0), match (−m, m) — an equivalence
  test —, not_worse (−m, ∞) "comparable or better", not_better (−∞, m) "does not improve"; m is the suite's
  `equivalence_margin` or the claim's `margin`. The claim **holds** when the interval lies inside its region and
  **does not hold** when it lies outside — the same strength of evidence either way. The claim's p is twice the
  smaller of the two one-sided p-values (for being inside, for being outside); a table's claims are
  Holm-corrected together at α = 0.05. Short of that: "no significant difference at this budget" (better,
  worse) or "inconclusive" with the interval and the margin it crosses.
* **At least 3 seeds** per verdict: fewer render "too few seeds (n)", the per-seed numbers still shown.
* **State**: a verdict from runs whose validation BLEU still rose by ≥ 0.5 over their last 20% of updates says
  they were still climbing. A claim with Voting-to-Stay runs is judged only when the GHT paper's precondition
  held — groups compact at the end of GCT (mean silhouette ≥ 0.25; below it a clustering has "no substantial
  structure", Kaufman & Rousseeuw) and voting triggered by converged group centres, not the `vote_at` fallback —
  else the verdict is "precondition not met (…)" with those numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo.metrics import bleu_from_stats
from zoo.report.suite import Claim, Suite

HOLDS, FAILS = "holds", "does not hold"
NO_DIFFERENCE = "no significant difference at this budget"
ALPHA = 0.05  # family-wise, per table (Holm)
LEVEL = 0.95  # the interval shown beside each claim
MIN_SEEDS = 3
BOOTSTRAP_SEED = 12345  # one fixed stream: a re-render reproduces every number
CLIMBING_GAIN = 0.5  # validation BLEU gained over the last 20% of updates that counts as still climbing
COMPACT_SILHOUETTE = 0.25  # end-of-GCT mean silhouette below which the groups did not compact
FALLBACK_TRIGGER = "reached vote_at"  # zoo/ght/procedure.py's reason when voting ran at the budget fallback

Score = Callable[[np.ndarray], np.ndarray]  # summed per-sentence statistics [..., k] -> corpus score [...]


# ---------------------------------------------------------------------------------------------- Student's t
def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with an integer df ≥ 1: the finite series of Abramowitz & Stegun 26.7.3–4
    (no scipy in the dependencies)."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    series, term = 0.0, c if df % 2 else 1.0
    for k in range((df - 1) // 2 if df % 2 else df // 2):
        if k:
            term *= c * c * ((2 * k) / (2 * k + 1) if df % 2 else (2 * k - 1) / (2 * k))
        series += term
    a = 2 / math.pi * (theta + s * series) if df % 2 else s * series
    return 0.5 + 0.5 * a


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t (bisection on `t_cdf`)."""
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


# ---------------------------------------------------------------------------------------------- Δ over seeds
@dataclass(frozen=True)
class DeltaTest:
    """A claim's Δ = system − baseline, the mean over seeds of per-seed corpus-score differences, and its
    standard error from the two-way bootstrap (seeds, then sentences)."""

    mean: float
    se: float
    per_seed: tuple[float, ...]

    @property
    def seeds(self) -> int:
        return len(self.per_seed)

    @property
    def df(self) -> int:
        return self.seeds - 1

    def p_above(self, x: float) -> float:
        """One-sided p-value for "the true Δ is above x" (null: Δ ≤ x)."""
        if math.isinf(x):
            return 0.0 if x < 0 else 1.0
        if self.se == 0:
            return 0.0 if self.mean > x else 1.0
        return 1.0 - t_cdf((self.mean - x) / self.se, self.df)

    def p_below(self, x: float) -> float:
        """One-sided p-value for "the true Δ is below x" (null: Δ ≥ x)."""
        if math.isinf(x):
            return 0.0 if x > 0 else 1.0
        if self.se == 0:
            return 0.0 if self.mean < x else 1.0
        return t_cdf((self.mean - x) / self.se, self.df)

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        half = t_quantile(0.5 + level / 2, self.df) * self.se
        return self.mean - half, self.mean + half


def delta_test(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]],
    score: Score = bleu_from_stats,
    samples: int = 1000,
    seed: int = BOOTSTRAP_SEED,
) -> DeltaTest:
    """Δ̄ and its standard error from (system, baseline) per-sentence statistics [N, k], one pair per seed:
    each replicate draws n seeds with replacement and one multinomial resample of the N sentences shared by
    every drawn seed and both systems (the test set is one sample for all of them); the replicates' variance ×
    n/(n−1) is Δ̄'s squared standard error. `score` turns summed statistics into a corpus score (BLEU by default;
    the tests use a mean of per-sentence scores)."""
    n = len(pairs)
    if n < 2:
        raise ValueError(f"a test over seeds needs at least 2 seeds, got {n}")
    sentences = {len(s) for pair in pairs for s in pair}
    if len(sentences) != 1:
        raise ValueError(f"every run must be scored on the same sentences, got lengths {sorted(sentences)}")
    (size,) = sentences
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(size, np.full(size, 1.0 / size), size=samples).astype(np.float64)  # [B, N]
    observed = np.array([score(sys.sum(axis=0)) - score(base.sum(axis=0)) for sys, base in pairs])
    resampled = np.stack([score(weights @ sys) - score(weights @ base) for sys, base in pairs])  # [n, B]
    draws = rng.integers(0, n, size=(samples, n))
    means = resampled[draws, np.arange(samples)[:, None]].mean(axis=1)
    return DeltaTest(
        mean=float(observed.mean()),
        se=math.sqrt(float(means.var(ddof=1)) * n / (n - 1)),
        per_seed=tuple(float(d) for d in observed),
    )


# ---------------------------------------------------------------------------------------------- verdicts
def region(expect: str, margin: float | None = None) -> tuple[float, float]:
    """The values of the true Δ under which the claim is true."""
    m = margin if margin is not None else math.nan
    regions = {
        "better": (0.0, math.inf),
        "worse": (-math.inf, 0.0),
        "match": (-m, m),
        "not_worse": (-m, math.inf),
        "not_better": (-math.inf, m),
    }
    lo, hi = regions[expect]
    if math.isnan(lo) or math.isnan(hi):
        raise ValueError(f"expect={expect} needs a margin")
    return lo, hi


def decision_p(test: DeltaTest, expect: str, margin: float | None = None) -> tuple[float, str]:
    """The claim's p-value and the verdict it points to: twice the smaller of p(inside the region) — every
    bound passed — and p(outside it) — some bound passed the other way."""
    lo, hi = region(expect, margin)
    inside = max(test.p_above(lo), test.p_below(hi))
    outside = min(test.p_below(lo), test.p_above(hi))
    return min(1.0, 2 * min(inside, outside)), HOLDS if inside <= outside else FAILS


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: a table's verdicts are wrong with probability ≤ α together."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Question:
    """One claim as the rule sees it: the expectation, its margin, the measured Δ over seeds (None below 2
    seeds) and, when a precondition of the claim failed, why ("precondition not met (…)")."""

    expect: str
    seeds: int
    test: DeltaTest | None = None
    margin: float | None = None
    unmet: str | None = None


@dataclass(frozen=True)
class Judgement:
    verdict: str
    p: float | None = None  # the claim's own p-value (None: not tested)
    p_holm: float | None = None  # Holm-adjusted over the table's tested claims


def judge(questions: Sequence[Question], alpha: float = ALPHA) -> list[Judgement]:
    """The verdicts of one table's claims: those with ≥ MIN_SEEDS seeds and their preconditions met form the
    Holm family; a verdict needs its adjusted p below α."""
    tested = {
        i: q.test for i, q in enumerate(questions) if q.unmet is None and q.seeds >= MIN_SEEDS and q.test is not None
    }
    decisions = {i: decision_p(test, questions[i].expect, questions[i].margin) for i, test in tested.items()}
    adjusted = dict(zip(tested, holm([decisions[i][0] for i in tested]), strict=True))
    out = []
    for i, q in enumerate(questions):
        few = f"too few seeds ({q.seeds})" if q.seeds < MIN_SEEDS else None
        if q.unmet or few:
            out.append(Judgement("; ".join(t for t in (q.unmet, few) if t)))
            continue
        p, side = decisions[i]
        out.append(Judgement(_verdict(q, side if adjusted[i] < alpha else None, p, adjusted[i], alpha), p, adjusted[i]))
    return out


def _verdict(q: Question, side: str | None, p: float, p_holm: float, alpha: float) -> str:
    assert q.test is not None
    if side == FAILS and q.expect == "match":
        return f"{FAILS} (Δ {'above' if q.test.mean > 0 else 'below'} the ±{q.margin:g} margin)"
    if side is not None:
        return side
    text = NO_DIFFERENCE if q.expect in ("better", "worse") else _crosses(q)
    return text + (f" after Holm (p={p:.3f}, adjusted {p_holm:.3f})" if p < alpha else "")


def _crosses(q: Question) -> str:
    lo, hi = region(q.expect, q.margin)
    bounds = " and ".join(f"{b:+g}" for b in (lo, hi) if not math.isinf(b))
    return f"inconclusive: the {LEVEL:.0%} interval crosses {bounds}"


# ---------------------------------------------------------------------------------------------- state
def climbing(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many of a comparison's runs were still climbing (validation gain ≥ CLIMBING_GAIN over their last
    20% of updates), and the largest gain among them."""
    gains = [r["convergence"]["last20_gain"] for r in runs if r.get("convergence")]
    up = [g for g in gains if g >= CLIMBING_GAIN]
    return {"runs": len(gains), "climbing": len(up), "max_gain": max(gains) if gains else None}


def precondition(runs: Sequence[Mapping[str, Any]]) -> str | None:
    """GHT-PS's precondition for Voting-to-Stay — compact groups at converged GCT — on every run of the
    comparison that voted; None when it held or nothing voted, else "precondition not met (…)"."""
    voted = [r for r in runs if r.get("voting") and r["voting"].get("step") is not None]
    if not voted:
        return None
    silhouettes = [r["compactness"]["after"]["silhouette"] for r in voted if r.get("compactness")]
    fallback = sum(str(r["voting"].get("trigger") or "").startswith(FALLBACK_TRIGGER) for r in voted)
    loose = len(silhouettes) < len(voted) or min(silhouettes) < COMPACT_SILHOUETTE
    if not loose and not fallback:
        return None
    parts = []
    if silhouettes:
        lo, hi = min(silhouettes), max(silhouettes)
        parts.append(f"silhouette {lo:.2f}" + (f"–{hi:.2f}" if f"{hi:.2f}" != f"{lo:.2f}" else ""))
    if len(silhouettes) < len(voted):
        parts.append(f"no compactness probe in {len(voted) - len(silhouettes)} of {len(voted)} runs")
    if fallback:
        parts.append(
            "voted at the vote_at fallback" + (f" in {fallback} of {len(voted)} runs" if fallback < len(voted) else "")
        )
    return f"precondition not met ({', '.join(parts)})"


def with_state(verdict: str, state: Mapping[str, Any], validation: str = "BLEU") -> str:
    """The verdict cell: the verdict, and that its runs were still climbing (in `validation`, the metric
    training validated on) when they were."""
    if not state["climbing"]:
        return verdict
    return f"{verdict} — runs still climbing (up to {state['max_gain']:+.1f} {validation} over the last 20%)"


# ---------------------------------------------------------------------------------------------- claim rows
Bootstrap = Callable[[str, int, str], "dict[str, Any] | None"]
Stats = Callable[[str, int], "np.ndarray | None"]


def collect_claims(
    suite: Suite,
    entries: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    bootstrap: Bootstrap,
    stats: Stats,
    score: Score = bleu_from_stats,
    samples: int = 1000,
    epoch_batches: float | None = None,
) -> list[dict[str, Any]]:
    """One row per claim: the claim and its source, both sides' quality and size, per-seed Δ, Δ̄ over seeds, the
    budget and state, and the verdict — papers' claims and our questions each judged as one table.
    `bootstrap(system, seed, baseline)` is the per-seed paired bootstrap, `stats(entry, seed)` a run's
    per-segment statistics (BLEU's, or per-document ROUGE) that `score` turns into a corpus score, `epoch_batches`
    the training batches in one epoch (None: unknown)."""
    rows = [_claim_row(c, entries, seeds, bootstrap, stats, score, samples, epoch_batches) for c in suite.claims]
    for ours in (False, True):
        table = [r for r in rows if r["ours"] == ours]
        for row, judged in zip(table, judge([r.pop("question") for r in table]), strict=True):
            verdict = with_state(judged.verdict, row["state"], "BLEU" if suite.task == "translation" else "ROUGE-L")
            row.update(verdict=verdict, p=judged.p, p_holm=judged.p_holm)
    return rows


def _claim_row(
    claim: Claim,
    entries: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    bootstrap: Bootstrap,
    stats: Stats,
    score: Score,
    samples: int,
    epoch_batches: float | None,
) -> dict[str, Any]:
    system, baseline = entries.get(claim.system), entries.get(claim.baseline)
    rows = [b for seed in seeds if (b := bootstrap(claim.system, seed, claim.baseline)) is not None]
    paired = [
        (seed, a, b)
        for seed in seeds
        if (a := stats(claim.system, seed)) is not None and (b := stats(claim.baseline, seed)) is not None
    ]
    test = delta_test([(a, b) for _, a, b in paired], score=score, samples=samples) if len(paired) >= 2 else None
    runs = [e["seeds"][seed] for e in (system, baseline) if e for seed, _, _ in paired if seed in e["seeds"]]
    state = {**_budget(runs, epoch_batches), **climbing(runs)}
    sides = (("system", system), ("baseline", baseline))
    return {
        "paper": claim.paper,
        "ours": claim.ours,
        "claim": claim.claim,
        "source": vars(claim.source) if claim.source else None,
        "design": claim.design,
        "system": claim.system,
        "baseline": claim.baseline,
        "expect": claim.expect,
        "margin": claim.margin,
        "quality": {side: (e["quality"] if e else None) for side, e in sides},
        "size": {side: (e["size"] if e else None) for side, e in sides},
        "bootstrap": rows,
        "delta": _delta(test),
        "state": state,
        "question": Question(claim.expect, len(paired), test, claim.margin, precondition(runs)),
    }


def _delta(test: DeltaTest | None) -> dict[str, Any] | None:
    if test is None:
        return None
    low, high = test.interval() if test.seeds >= MIN_SEEDS else (None, None)
    return {"mean": test.mean, "se": test.se, "seeds": test.seeds, "low": low, "high": high}


def _budget(runs: Sequence[Mapping[str, Any]], epoch_batches: float | None) -> dict[str, Any]:
    """The comparison's updates (min, max over its runs) and, where an epoch's length is known, epochs."""
    updates = sorted(int(r["updates"]) for r in runs)
    batches = sorted(int(r["updates"]) * int(r.get("update_freq") or 1) for r in runs)
    return {
        "updates": [updates[0], updates[-1]] if updates else None,
        "epochs": [round(b / epoch_batches, 2) for b in (batches[0], batches[-1])] if epoch_batches and runs else None,
    }


__all__ = [
    "ALPHA",
    "CLIMBING_GAIN",
    "COMPACT_SILHOUETTE",
    "FAILS",
    "HOLDS",
    "MIN_SEEDS",
    "NO_DIFFERENCE",
    "DeltaTest",
    "Judgement",
    "Question",
    "climbing",
    "collect_claims",
    "decision_p",
    "delta_test",
    "holm",
    "judge",
    "precondition",
    "region",
    "t_cdf",
    "t_quantile",
    "with_state",
]
