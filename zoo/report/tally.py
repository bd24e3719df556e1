"""How many claims of a suite have a verdict, and which: the counts results/README.md states per table.

Counted from the same numbers the report renders (quality verdicts from `collect_claims`, speed verdicts from the
current-rule speed file), stored in report.json as `verdict_counts`, and written as one line by `counts_text` —
the one home of that line, so a test can hold results/README.md to the rendered reports.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from zoo.report.claims import FAILS, HOLDS, INCONCLUSIVE
from zoo.report.render_speed import judge_speed_claims

KINDS = (HOLDS, FAILS, INCONCLUSIVE, "untested")


def _kind(verdict: str) -> str:
    for kind in (FAILS, HOLDS, INCONCLUSIVE):  # "does not hold" before "holds": neither is a prefix of the other
        if verdict.startswith(kind):
            return kind
    return "untested"  # too few seeds / rounds, not measured


def verdict_counts(data: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{"quality": {kind: n}, "speed": {kind: n}} over the suite's claims; speed counts only a file of the current
    rule (an old-rule file judges nothing: its claims count as untested)."""
    quality = Counter(_kind(c["verdict"]) for c in data.get("claims") or [])
    claims = data.get("speed_claims") or []
    current = next((s for s in data.get("speed") or [] if s.get("judged")), None)
    if current is None:
        speed = Counter({"untested": len(claims)}) if claims else Counter()
    else:
        speed = Counter(_kind(j.verdict) for j in judge_speed_claims(current, claims)[1])
    return {name: {k: n[k] for k in KINDS} for name, n in (("quality", quality), ("speed", speed))}


def counts_text(counts: dict[str, dict[str, int]]) -> str:
    """`quality 5 hold, 0 do not hold, 4 inconclusive, 6 untested; speed —`: one table cell."""

    def one(n: dict[str, int]) -> str:
        if not sum(n.values()):
            return "—"
        return f"{n[HOLDS]} hold, {n[FAILS]} do not hold, {n[INCONCLUSIVE]} inconclusive, {n['untested']} untested"

    return f"quality {one(counts['quality'])}; speed {one(counts['speed'])}"


__all__ = ["KINDS", "counts_text", "verdict_counts"]
