"""A second look, declared in a suite before its runs (issue 85): claims tested at the suite's seeds (look 1) that
were neither decided nor far from deciding are tested once more with the declared further seeds (look 2), and
the two looks together keep a claim's false-positive rate, and its Holm family's, at α.

Why this form. Adding seeds after seeing three is only honest when the rule that will judge the larger sample was
fixed before, and pays for the first look. Each claim's p-value under the design is

    p* = min(p₁ / r, p₂ / (1 − r))

p₁ and p₂ the claim's own p-values (claims.decision_p) over the look-1 seeds and over all of them, and r the share
of α the first look spends (`first_share`). p* is a valid p-value whatever the looks' correlation and whichever
claims continue: p* ≤ γ needs p₁ ≤ rγ or p₂ ≤ (1 − r)γ, together at most γ — a Bonferroni split of every level γ
between the looks, so Holm over a family's p* still holds its family-wise rate at α at every step level (a
spending fixed as a share of α, as in Maurer & Bretz's group-sequential Holm, not a fixed first-look level whose
floor would leave nothing for the small levels of a large family). Which claims continue only spends runs: one
whose look-1 p₁ is above `continue_below` stops there (p* = p₁ / r), one decided at look 1 needs no more seeds.
Simulated under no effect: zoo/report/simulate.py; a suite's stored rates are rendered into its REPORT.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SIMULATION_FILE = "second_look.json"  # the design's simulated false-positive rates (zoo/report/simulate.py)
# What happened to a claim under its suite's second look (Verdict.second_look)
DECIDED = "decided at look 1"  # Holm-adjusted p* below α from the first seeds alone
PENDING = "pending"  # continues, and its runs of the look-2 seeds are not all in
STOPPED = "stopped"  # p₁ above continue_below: no second look
TAKEN = "taken"  # look 2 is in: p* counts both looks


@dataclass(frozen=True)
class SecondLook:
    """The declared design: the seeds look 2 adds, the share r of α the first look spends, and the look-1 p above
    which a claim stops (a non-binding futility stop: it saves runs, and cannot raise the false-positive rate)."""

    seeds: tuple[int, ...]
    first_share: float
    continue_below: float

    def p_value(self, first: float, second: float | None = None) -> float:
        """The claim's p* from its look-1 p and, once taken, its look-2 p."""
        p = first / self.first_share
        if second is not None:
            p = min(p, second / (1.0 - self.first_share))
        return min(1.0, p)

    def share(self, look: int) -> float:
        """The share of a claim's Holm step level its look-`look` test runs at (its interval's level)."""
        return self.first_share if look == 1 else 1.0 - self.first_share


def second_look_from(raw: Mapping[str, Any] | None) -> SecondLook | None:
    """`suite.second_look: {seeds, first_share, continue_below}`, refused unless it names its seeds once each and
    its shares are proper fractions (a ValueError naming the fix). Look 1 is every other seed a claim's two runs
    have; the look-2 seeds are trained with `suite.seeds=[4,5]` (say), like any seed."""
    if not raw:
        return None
    keys = {"seeds", "first_share", "continue_below"}
    if set(raw) != keys:
        raise ValueError(f"suite.second_look needs exactly {sorted(keys)}; got {sorted(raw)}")
    added = tuple(int(s) for s in raw["seeds"])
    if not added or len(set(added)) != len(added):
        raise ValueError(f"suite.second_look.seeds={list(added)}: give the seeds look 2 adds, each once")
    share, below = float(raw["first_share"]), float(raw["continue_below"])
    if not 0.0 < share < 1.0 or not 0.0 < below <= 1.0:
        raise ValueError(
            f"suite.second_look: first_share={share:g} must lie in (0, 1) and continue_below={below:g} in (0, 1]"
        )
    return SecondLook(added, share, below)


def second_look_data(
    design: SecondLook, results_dir: Path, claims: Sequence[Mapping[str, Any]], entries: Mapping[str, Any]
) -> dict[str, Any]:
    """What a report says of its second look: the design, its stored simulation (None before the simulate stage
    ran) and the runs the pending claims still wait for, (entry, seed) in suite order."""
    stored = results_dir / SIMULATION_FILE
    pending = [c for c in claims if c["verdict"].get("second_look") == PENDING]
    names = list(dict.fromkeys(e for c in pending for e in (c["system"], c["baseline"])))
    return {
        "design": asdict(design),
        "simulation": json.loads(stored.read_text()) if stored.is_file() else None,
        "pending": len(pending),
        "runs": [[e, s] for e in names for s in design.seeds if s not in entries.get(e, {}).get("seeds", {})],
    }


__all__ = [
    "DECIDED",
    "PENDING",
    "SIMULATION_FILE",
    "STOPPED",
    "TAKEN",
    "SecondLook",
    "second_look_data",
    "second_look_from",
]
