"""A quality claim's verdict as fields, and its words.

The rule (zoo/report/claims.py) decides a `Verdict`: its kind, the numbers it rests on and why — report.json stores
those fields, `tally.py` counts kinds from them, and the words of a REPORT.md cell are rendered from them here, at
render time (issue 87: verdicts used to be stored as text and read back by prefix).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from zoo.report.run_state import budget_words, climbing_words
from zoo.report.second_look import DECIDED, PENDING, STOPPED, TAKEN
from zoo.report.stats import FAILS, INCONCLUSIVE

MIN_SEEDS = 3  # a verdict needs this many seeds on both sides
HINT_MAX_SEEDS = 30  # "≈ n seeds would decide it" is said up to this many
SECOND_LOOK_FIELDS = ("looks", "second_look", "share", "look")  # stored only under a declared second look
RESOLUTION = 0.005  # a Δ̄ this close to a region bound sits on it: half the tables' last printed digit


@dataclass(frozen=True)
class Decide:
    """What would move an inconclusive claim's interval off `bound` if Δ̄ and the seeds' spread stayed."""

    bound: float
    gap: float  # |Δ̄ − bound|
    floor: float  # the half-width the test set's shared sampling error alone gives the interval
    spread: float  # s, the standard deviation of the per-seed Δs
    seeds: int | None  # the fewest seeds whose interval would clear the bound (None: more than HINT_MAX_SEEDS)


@dataclass(frozen=True)
class Verdict:
    """One claim's verdict: HOLDS, FAILS or INCONCLUSIVE (`kind`; None where no test ran), the p-values and the
    interval at the claim's Holm step level it was decided with, and the reason its words give."""

    kind: str | None
    seeds: int  # the seeds both sides have: a test needs MIN_SEEDS
    p: float | None = None  # the claim's own p-value
    p_holm: float | None = None  # Holm-adjusted over its family's tested claims
    level: float | None = None  # the interval's confidence level: 1 − the claim's Holm step level
    interval: tuple[float, float] | None = None  # Δ̄'s interval at `level`
    family_size: int = 0  # tested claims in its Holm family
    degenerate: str | None = None  # why the outputs cannot carry a verdict (run_state.degenerate_outputs)
    outside: str | None = None  # a "match" claim that fails: Δ̄ "above" or "below" its ±margin
    margin: float | None = None
    holm_stops: bool = False  # inconclusive although its own test passed: Holm stopped at a smaller p before it
    crosses: tuple[float, ...] = ()  # inconclusive: the bounds its interval crosses (else the nearest)
    decide: Decide | None = None
    # under a declared second look (zoo/report/second_look.py): `p` is the claim's p*, `looks` the looks' own
    # p-values, `second_look` what became of the claim, `share` the part of its Holm step level its look ran at
    looks: tuple[float, ...] = ()
    second_look: str | None = None
    share: float = 1.0
    look: int = 1  # the look whose test gives the interval (and `seeds`)

    def to_json(self) -> dict[str, Any]:
        """Its fields; those of a second look only where the suite declared one."""
        fields = asdict(self)
        return fields if self.second_look else {k: v for k, v in fields.items() if k not in SECOND_LOOK_FIELDS}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Verdict:
        interval, decide = raw.get("interval"), raw.get("decide")
        return cls(
            **{
                **raw,
                "interval": tuple(interval) if interval else None,
                "crosses": tuple(raw.get("crosses") or ()),
                "looks": tuple(raw.get("looks") or ()),
                "decide": Decide(**decide) if decide else None,
            }
        )

    def p_words(self) -> str:
        """`p=0.026, Holm 0.052`; under a second look the looks' own p-values and p*: `p₁=0.026, p₂=0.004, p*=0.005,
        Holm 0.010`."""
        looks = "".join(f"p{'₁₂'[i]}={p:.3f}, " for i, p in enumerate(self.looks))
        return f"{looks}{'p*' if self.looks else 'p'}={self.p:.3f}, Holm {self.p_holm:.3f}"

    def words(self) -> str:
        """The verdict alone: `holds`, `inconclusive: the 98.8% interval crosses 0; ≈ 5 seeds would …`."""
        if self.kind is None:
            few = f"too few seeds ({self.seeds})" if self.seeds < MIN_SEEDS else None
            return "; ".join(t for t in (self.degenerate, few) if t) or f"too few seeds ({self.seeds})"
        look = _look_words(self)
        if self.outside is not None:
            return f"{FAILS} (Δ {self.outside} the ±{self.margin:g} margin){look}"
        if self.kind != INCONCLUSIVE:
            return f"{self.kind}{look}"
        if self.second_look == PENDING:
            return f"{INCONCLUSIVE} after look 1 ({self.seeds} seeds): the declared second look decides it"
        if self.second_look == STOPPED:
            return (
                f"{INCONCLUSIVE}: p₁ = {self.looks[0]:.3f} at look 1 is above the second look's threshold, so it "
                "stops there (declared)"
            )
        if self.holm_stops:
            stops = "Holm stops at a claim of this paper with a smaller p"
            return f"{INCONCLUSIVE}: {stops} (adjusted p {self.p_holm:.3f}){look}"
        where = " and ".join(_bound(b) for b in self.crosses)
        hint = _decide_words(self.decide) if self.decide else ""
        return f"{INCONCLUSIVE}: the {percent(self.level or 0.0)} interval crosses {where}{look}; {hint}"


def _look_words(v: Verdict) -> str:
    """' (at the second look: 5 seeds)' / ' (decided at look 1)' under a second look, else ''."""
    if v.second_look == TAKEN:
        carried = f": {v.seeds} seeds" if v.look == 2 else f", carried by look 1's {v.seeds} seeds"
        return f" (at the second look{carried})"
    return f" ({DECIDED})" if v.second_look == DECIDED else ""


def _decide_words(d: Decide) -> str:
    if d.gap < RESOLUTION:
        return f"Δ̄ sits on {_bound(d.bound)} (within {RESOLUTION:g}), so no number of seeds decides it"
    if d.gap <= d.floor:
        return (
            f"the test set's sampling error alone (±{d.floor:.2f}) exceeds |Δ̄ − ({d.bound:+g})| = {d.gap:.2f}, so no "
            "number of seeds decides it: a larger effect, budget or test set would"
        )
    if d.seeds is not None:
        return f"≈ {d.seeds} seeds would decide it if Δ̄ and the seeds' spread (s = {d.spread:.2f}) stay"
    return f"more than {HINT_MAX_SEEDS} seeds: Δ̄ is small against the seeds' spread (s = {d.spread:.2f})"


def _bound(b: float) -> str:
    return "0" if b == 0 else f"{b:+g}"


def percent(level: float) -> str:
    """0.9875 → `98.8%`, 0.95 → `95%`: an interval's level as the tables print it."""
    return f"{level:.1%}".replace(".0%", "%")


def verdict_cell(verdict: Verdict, state: Mapping[str, Any], validation: str = "BLEU") -> str:
    """The verdict at the budget it was measured at, and that its runs were still climbing (in `validation`, the
    metric training validated on) when they were — "does not hold at 2400 updates ≈ 1.10 epochs — 12 of 12 runs
    still climbing (…)": the words say what was measured (issue 86). An untested claim's words stand alone."""
    words = verdict.words()
    if verdict.kind is None:
        return words
    if state.get("updates"):
        words = f"{verdict.kind} at {budget_words(state)}{words[len(verdict.kind) :]}"
    if not state.get("climbing"):
        return words
    return f"{words} — {climbing_words(state, validation)}"


__all__ = ["HINT_MAX_SEEDS", "MIN_SEEDS", "RESOLUTION", "Decide", "Verdict", "percent", "verdict_cell"]
