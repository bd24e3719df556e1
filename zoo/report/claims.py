"""The papers' claims (and our own questions), each answered by one comparison of the suite's records.

A claim row quotes the paper's sentence, says how the comparison is designed, and shows the measured numbers:
per seed the paired bootstrap of the two runs trained with that seed (sacreBLEU, test sentences resampled);
over seeds Δ̄, the mean of the seeds' corpus-score differences, with its intervals; the budget and whether the
runs had stopped climbing; and a verdict whose words follow from the numbers beside it by this rule (issue 60):

* **Variance of Δ̄: two components.** Var(Δ̄) = S²/n + c̄. S² is the sample variance of the n per-seed Δs (n − 1
  degrees of freedom): seed-to-seed variation, plus the part of the test-set noise that differs between seeds. c̄
  is the part every seed shares, because all were scored on one test set: the mean covariance between two seeds'
  Δs when the test sentences are resampled (one bootstrap draw for both systems and every seed), estimated from
  the sentences (their count − 1 degrees of freedom). The two parts add to Var(Δ̄) without counting anything twice.
  The interval and p read the statistic against Cochran–Cox's reference (zoo/report/stats.py: the components'
  t critical values averaged with their variances as weights), shown as an effective df: near n − 1 when seeds
  dominate, large when the test set does. Welch–Satterthwaite was simulated too and rejected: at 3 seeds its
  estimated df rises when S² is small by chance, giving a 7.6% false-positive rate (tests/test_verdicts.py).
* **Each expectation is a region for the true Δ**: better (0, ∞), worse (−∞, 0), match (−m, m) — an equivalence
  test —, not_worse (−m, ∞) "comparable or better", not_better (−∞, m) "does not improve"; m is the suite's
  `equivalence_margin` or the claim's `margin`. The claim's p is twice the smaller of the one-sided p-values for
  being inside the region (every bound passed) and outside it (some bound passed the other way).
* **One Holm family per paper** (a paper's claims in one suite; our own questions are one more family), at
  α = 0.05. The claim's test runs at its Holm step level α/(m − rank); the interval at 1 − that level is shown
  beside the 95% one. **holds** / **does not hold**: the Holm-adjusted p is below α — then that interval lies
  inside / outside the region. Otherwise **inconclusive**, naming the bound its interval crosses and what would
  decide it: about how many seeds (if Δ̄ and the seeds' spread stay), or that the test set's own sampling error
  is larger than the distance to the bound, so no number of seeds can.
* **At least 3 seeds** per verdict: fewer render "too few seeds (n)", the per-seed numbers still shown.
* **State** (zoo/report/run_state.py describes the runs): a verdict names the budget it was measured at, and that
  its runs were still climbing when their validation loss still fell by ≥ 0.05 nats over the last quarter of their
  updates or their validation BLEU rose by ≥ 0.5 over the last 20%. GHT and GHT-PS claims are judged as the paper's
  procedure runs — Voting-to-Stay at a fixed point of the budget, compact groups or not (the official code has no
  compactness test; issue 62) — and the compaction of the trained groups at the vote (GHT: at the end of training)
  stands beside the verdict as a diagnostic: mean silhouette and intra-group cos of the partition the loss trained;
  silhouette ≥ 0.25 reads "compact" (below it a clustering has "no substantial structure", Kaufman & Rousseeuw).
* **Degenerate outputs**: a claim one of whose runs gives fewer distinct test outputs than 2% of its documents
  (near-constant text, issue 64) renders "degenerate outputs (…)" with the counts, not a verdict: a difference
  between outputs that hardly depend on the input says nothing about the claim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from zoo.metrics import bleu_from_stats
from zoo.report.run_state import budget, climbing, compaction, degenerate_outputs, pairing
from zoo.report.second_look import DECIDED, PENDING, STOPPED, TAKEN, SecondLook
from zoo.report.stats import FAILS, HOLDS, INCONCLUSIVE, TwoComponents, holm, holm_levels, t_quantile
from zoo.report.suite import Claim, Suite
from zoo.report.verdict import HINT_MAX_SEEDS, MIN_SEEDS, Decide, Verdict

ALPHA = 0.05  # family-wise, per paper and suite (Holm)
LEVEL = 0.95  # the plain interval shown beside each claim
BOOTSTRAP_SEED = 12345  # one fixed stream: a re-render reproduces every number
OURS_FAMILY = "our questions"

Score = Callable[[np.ndarray], np.ndarray]  # summed per-sentence statistics [..., k] -> corpus score [...]


# ---------------------------------------------------------------------------------------------- Δ over seeds
@dataclass(frozen=True)
class DeltaTest:
    """A claim's Δ = system − baseline, the mean over seeds of per-seed corpus-score differences, and the two
    components of its variance: `seed_var` = S²/n (n − 1 df) and `sentence_var` = c̄, the test-set noise all seeds
    share (`sentences` − 1 df)."""

    mean: float
    per_seed: tuple[float, ...]
    seed_var: float
    sentence_var: float
    sentences: int

    @property
    def seeds(self) -> int:
        return len(self.per_seed)

    @property
    def components(self) -> TwoComponents:
        return TwoComponents(self.seed_var, self.seeds - 1, self.sentence_var, self.sentences - 1)

    @property
    def se(self) -> float:
        return math.sqrt(self.seed_var + self.sentence_var)

    @property
    def df(self) -> float:
        """Effective degrees of freedom of the 95% interval (inf: the normal's)."""
        return self.components.effective_df(0.5 + LEVEL / 2)

    def p_above(self, x: float) -> float:
        """One-sided p-value for "the true Δ is above x" (null: Δ ≤ x)."""
        if math.isinf(x):
            return 0.0 if x < 0 else 1.0
        if self.se == 0:
            return 0.0 if self.mean > x else 1.0
        return 1.0 - self.components.cdf((self.mean - x) / self.se)

    def p_below(self, x: float) -> float:
        """One-sided p-value for "the true Δ is below x" (null: Δ ≥ x)."""
        if math.isinf(x):
            return 0.0 if x > 0 else 1.0
        if self.se == 0:
            return 0.0 if self.mean < x else 1.0
        return self.components.cdf((self.mean - x) / self.se)

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        half = self.components.critical(0.5 + level / 2) * self.se
        return self.mean - half, self.mean + half


def delta_test(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]],
    score: Score = bleu_from_stats,
    samples: int = 1000,
    seed: int = BOOTSTRAP_SEED,
) -> DeltaTest:
    """Δ̄ and its variance components from (system, baseline) per-sentence statistics [N, k], one pair per seed:
    S²/n from the per-seed Δs, and c̄ from `samples` multinomial resamples of the N sentences, each shared by
    every seed and both systems (the test set is one sample for all of them). `score` turns summed statistics
    into a corpus score (BLEU by default; the tests use a mean of per-sentence scores)."""
    n = len(pairs)
    if n < 2:
        raise ValueError(f"a test over seeds needs at least 2 seeds, got {n}")
    sentences = {len(s) for pair in pairs for s in pair}
    if len(sentences) != 1:
        raise ValueError(f"every run must be scored on the same sentences, got lengths {sorted(sentences)}")
    (size,) = sentences
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(size, np.full(size, 1.0 / size), size=samples).astype(np.float64)  # [B, N]
    observed = np.array([score(sys.sum(axis=0)) - score(base.sum(axis=0)) for sys, base in pairs])  # [n]
    resampled = np.stack([score(weights @ sys) - score(weights @ base) for sys, base in pairs])  # [n, B]
    cov = np.cov(resampled)  # [n, n]: the seeds' Δs co-vary through the shared test sentences
    shared = (float(cov.sum()) - float(np.trace(cov))) / (n * (n - 1))
    return DeltaTest(
        mean=float(observed.mean()),
        per_seed=tuple(float(d) for d in observed),
        seed_var=float(observed.var(ddof=1)) / n,
        sentence_var=max(0.0, shared),
        sentences=size,
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


@dataclass(frozen=True)
class Question:
    """One claim as the rule sees it: the expectation, its margin and the measured Δ over seeds (None below 2
    seeds)."""

    expect: str
    seeds: int
    test: DeltaTest | None = None
    margin: float | None = None
    degenerate: str | None = None  # why the outputs cannot carry a verdict ("degenerate outputs (…)")
    second: DeltaTest | None = None  # over look 1's and the second look's seeds, once every one is paired


@dataclass(frozen=True)
class _Tested:
    """A tested claim before Holm: its p (p* under a second look), side, the look whose test carries the interval,
    the looks' own p-values and the second look's status."""

    p: float
    side: str
    look: int = 1
    looks: tuple[float, ...] = ()
    status: str | None = None


def judge(questions: Sequence[Question], alpha: float = ALPHA, design: SecondLook | None = None) -> list[Verdict]:
    """The verdicts of one Holm family (one paper's claims in a suite): the claims with ≥ MIN_SEEDS seeds and
    outputs that depend on their inputs are tested; a definite verdict needs the adjusted p below α. Under a
    declared second look (`design`) each claim's p is its p* over the looks it took (zoo/report/second_look.py)."""
    tested = {
        i: decision_p(q.test, q.expect, q.margin)
        for i, q in enumerate(questions)
        if q.seeds >= MIN_SEEDS and q.test is not None and q.degenerate is None
    }
    if design is None:
        final = {i: _Tested(p, side) for i, (p, side) in tested.items()}
    else:
        final = _looks(questions, tested, alpha, design)
    ps = [final[i].p for i in tested]
    adjusted = dict(zip(tested, holm(ps), strict=True))
    steps = dict(zip(tested, holm_levels(ps, alpha), strict=True))
    out = []
    for i, q in enumerate(questions):
        if i not in tested:
            out.append(Verdict(None, q.seeds, degenerate=q.degenerate))
            continue
        t = final[i]
        test = q.test if t.look == 1 else q.second
        assert test is not None
        share = design.share(t.look) if design else 1.0
        level = 1.0 - steps[i] * share  # the look's own test runs at its share of the claim's Holm step level
        numbers = Verdict(t.side, test.seeds, t.p, adjusted[i], level, test.interval(level), len(tested))
        numbers = replace(numbers, looks=t.looks, second_look=t.status, share=share, look=t.look)
        out.append(_reason(numbers, q, test, steps[i], alpha))
    return out


def _looks(
    questions: Sequence[Question], first: Mapping[int, tuple[float, str]], alpha: float, design: SecondLook
) -> dict[int, _Tested]:
    """Each tested claim's p* and status under the second look: decided at look 1 (Holm over the look-1 p*s below
    α: the later looks only lower the others' p*s, so it stays decided), stopped (p₁ above continue_below),
    pending (its look-2 runs are not all in; p* from look 1 until they are) or taken."""
    at_first = {i: design.p_value(p) for i, (p, _) in first.items()}
    decided = dict(zip(first, (p < alpha for p in holm(list(at_first.values()))), strict=True))
    out = {}
    for i, (p1, side) in first.items():
        q = questions[i]
        status = DECIDED if decided[i] else STOPPED if p1 > design.continue_below else PENDING
        if status == PENDING and q.second is not None:
            p2, side2 = decision_p(q.second, q.expect, q.margin)
            p = design.p_value(p1, p2)
            second_carries = p2 / design.share(2) <= p1 / design.share(1)
            out[i] = _Tested(p, side2 if second_carries else side, 2 if second_carries else 1, (p1, p2), TAKEN)
        else:
            out[i] = _Tested(at_first[i], side, 1, (p1,), status)
    return out


def _reason(v: Verdict, q: Question, test: DeltaTest, step: float, alpha: float) -> Verdict:
    """The verdict's kind and the reason its words give, from the numbers it carries: the adjusted p, and the
    interval at the step level (at the look's share of it under a second look)."""
    assert v.p is not None and v.p_holm is not None and v.interval is not None
    if v.p_holm < alpha:
        if v.kind == FAILS and q.expect == "match":
            return replace(v, outside="above" if test.mean > 0 else "below", margin=q.margin)
        return v
    if v.p < step:  # its own test passed at its step, but Holm stopped at a smaller p of the family before it
        return replace(v, kind=INCONCLUSIVE, holm_stops=True)
    lo, hi = region(q.expect, q.margin)
    crossed = tuple(b for b in (lo, hi) if not math.isinf(b) and v.interval[0] < b < v.interval[1])
    bound = min(crossed or [b for b in (lo, hi) if not math.isinf(b)], key=lambda b: abs(test.mean - b))
    decide = what_would_decide(test, bound, step * v.share)
    return replace(v, kind=INCONCLUSIVE, crosses=crossed or (bound,), decide=decide)


def what_would_decide(test: DeltaTest, bound: float, step: float) -> Decide:
    """What would move the interval (at level 1 − step) off `bound`, if Δ̄ and the seeds' spread stayed: the seeds
    needed, or that the test set's shared sampling error alone is wider than the distance to the bound."""
    u = 1.0 - step / 2
    gap = abs(test.mean - bound)
    floor = t_quantile(u, test.sentences - 1) * math.sqrt(test.sentence_var)
    s2 = test.seed_var * test.seeds
    needed = None
    if gap > floor:
        for n in range(test.seeds + 1, HINT_MAX_SEEDS + 1):
            comp = TwoComponents(s2 / n, n - 1, test.sentence_var, test.sentences - 1)
            if comp.critical(u) * math.sqrt(comp.total) < gap:
                needed = n
                break
    return Decide(bound, gap, floor, math.sqrt(s2), needed)


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
    budget and state, and the verdict — each paper's claims one Holm family, our questions another.
    `bootstrap(system, seed, baseline)` is the per-seed paired bootstrap, `stats(entry, seed)` a run's
    per-segment statistics (BLEU's, or per-document ROUGE) that `score` turns into a corpus score, `epoch_batches`
    the training batches in one epoch (None: unknown). Under a declared second look, look 1 is every seed but the
    second look's, and a claim's look 2 (all of them) is measured once each of its seeds is paired."""
    design = suite.second_look
    first = [s for s in seeds if design is None or s not in design.seeds]

    def look(claim: Claim, look_seeds: Sequence[int]) -> dict[str, Any]:
        return _look(claim, entries, look_seeds, bootstrap, stats, score, samples, epoch_batches)

    later = [s for s in design.seeds if s in seeds] if design else []
    rows = []
    for claim in suite.claims:
        looks = [look(claim, first)]
        paired = looks[0]["paired"]
        if design and len(paired) >= MIN_SEEDS and len(later) == len(design.seeds):
            both = look(claim, [*paired, *later])
            looks += [both] if both["paired"] == [*paired, *later] else []
        rows.append((claim, looks))
    out = [_claim_row(claim, entries, looks[0]) for claim, looks in rows]
    for name in dict.fromkeys(r["family"] for r in out):
        members = [i for i, r in enumerate(out) if r["family"] == name]
        questions = [
            replace(rows[i][1][0]["question"], second=rows[i][1][1]["question"].test if len(rows[i][1]) > 1 else None)
            for i in members
        ]
        for i, verdict in zip(members, judge(questions, design=design), strict=True):
            out[i].update(_shown(rows[i][1][verdict.look - 1]), verdict=verdict.to_json())
    return out


def family_of(claim: Claim) -> str:
    """The claim's Holm family: the paper it quotes (its source), or our own questions; a claim written after the
    records (`post_hoc`) is in a family apart, so it cannot move the verdicts declared before the runs."""
    family = OURS_FAMILY if claim.ours else claim.source.paper if claim.source else claim.paper
    return f"{family}, written after the records" if claim.post_hoc else family


def _look(
    claim: Claim,
    entries: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    bootstrap: Bootstrap,
    stats: Stats,
    score: Score,
    samples: int,
    epoch_batches: float | None,
) -> dict[str, Any]:
    """What a claim's pairs over `seeds` measure: the per-seed bootstraps, Δ over the seeds both runs have, the
    runs' budget, state, compaction and pairing, and the question the rule judges."""
    system, baseline = entries.get(claim.system), entries.get(claim.baseline)
    paired = [
        (seed, a, b)
        for seed in seeds
        if (a := stats(claim.system, seed)) is not None and (b := stats(claim.baseline, seed)) is not None
    ]
    test = delta_test([(a, b) for _, a, b in paired], score=score, samples=samples) if len(paired) >= 2 else None
    runs = [e["seeds"][seed] for e in (system, baseline) if e for seed, _, _ in paired if seed in e["seeds"]]
    per_side = [
        (name, [e["seeds"][seed] for seed, _, _ in paired if seed in e["seeds"]])
        for name, e in ((claim.system, system), (claim.baseline, baseline))
        if e
    ]
    return {
        "paired": [seed for seed, _, _ in paired],
        "bootstrap": [b for seed in seeds if (b := bootstrap(claim.system, seed, claim.baseline)) is not None],
        "delta": _delta(test),
        "state": {**budget(runs, epoch_batches), **climbing(runs)},
        "compaction": compaction(runs),
        "pairing": pairing(
            [
                (seed, system["seeds"][seed], baseline["seeds"][seed])
                for seed, _, _ in paired
                if seed in system["seeds"] and seed in baseline["seeds"]
            ]
            if system and baseline
            else []
        ),
        "question": Question(claim.expect, len(paired), test, claim.margin, degenerate_outputs(per_side)),
    }


SHOWN = ("bootstrap", "delta", "state", "compaction", "pairing")  # a look's parts a claim row shows


def _shown(look: Mapping[str, Any]) -> dict[str, Any]:
    return {k: look[k] for k in SHOWN}


def _claim_row(claim: Claim, entries: Mapping[str, Mapping[str, Any]], look: Mapping[str, Any]) -> dict[str, Any]:
    system, baseline = entries.get(claim.system), entries.get(claim.baseline)
    sides = (("system", system), ("baseline", baseline))
    row = {
        "paper": claim.paper,
        "ours": claim.ours,
        "family": family_of(claim),
        "claim": claim.claim,
        "source": vars(claim.source) if claim.source else None,
        "design": claim.design,
        "system": claim.system,
        "baseline": claim.baseline,
        "expect": claim.expect,
        "margin": claim.margin,
        "quality": {side: (e["quality"] if e else None) for side, e in sides},
        "size": {side: (e["size"] if e else None) for side, e in sides},
    }
    return {**row, **_shown(look)}


def _delta(test: DeltaTest | None) -> dict[str, Any] | None:
    """Δ̄, its variance components and effective df, and the 95% interval (from MIN_SEEDS seeds)."""
    if test is None:
        return None
    low, high = test.interval() if test.seeds >= MIN_SEEDS else (None, None)
    return {
        "mean": test.mean,
        "se": test.se,
        "seeds": test.seeds,
        "low": low,
        "high": high,
        "seed_se": math.sqrt(test.seed_var),
        "sentence_se": math.sqrt(test.sentence_var),
        "df": df if test.seeds >= MIN_SEEDS and math.isfinite(df := test.df) else None,
    }


__all__ = [
    "ALPHA",
    "OURS_FAMILY",
    "DeltaTest",
    "Question",
    "collect_claims",
    "decision_p",
    "delta_test",
    "family_of",
    "judge",
    "region",
    "what_would_decide",
]
