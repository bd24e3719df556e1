"""The papers' claims, each answered by one paired comparison of the suite's records.

A claim row says what a paper claims in one line, how the comparison is designed (equal parameters,
equal FLOPs, equal budget), the measured numbers (mean ± std over seeds, the per-seed paired bootstrap
recomputed from the stored hypotheses) and a verdict that follows from those numbers by a fixed rule —
nothing in the row is typed by hand:

* `better` — holds when the system is significantly better (p < 0.05) for every seed; does not hold when
  no seed is significantly better and at least one is significantly worse;
* `worse` — the mirror image (e.g. Avghead below plain heads, more standard heads hurting);
* `match` — "matches at equal parameters": holds when no seed is significantly worse; does not hold when
  every seed is significantly worse;
* otherwise "no significant difference at this budget" (every seed n.s.) or "inconclusive: seeds disagree";
  a claim with fewer recorded seeds than the suite's is "incomplete".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zoo.report.suite import Claim, Suite

HOLDS, FAILS = "holds", "does not hold"
NO_DIFFERENCE = "no significant difference at this budget"
DISAGREE = "inconclusive: seeds disagree"


def verdict(expect: str, rows: Sequence[Mapping[str, Any]], seeds_expected: int) -> str:
    """The verdict of one claim from its per-seed paired bootstraps (dicts with `delta` and `significant`)."""
    if len(rows) < seeds_expected:
        return f"incomplete ({len(rows)} of {seeds_expected} seeds recorded)"
    up = [bool(r["significant"]) and r["delta"] > 0 for r in rows]
    down = [bool(r["significant"]) and r["delta"] < 0 for r in rows]
    if expect == "match":
        if not any(down):
            return HOLDS + (" (significantly better)" if all(up) else "")
        return FAILS if all(down) else DISAGREE
    wanted, opposite = (up, down) if expect == "better" else (down, up)
    if all(wanted):
        return HOLDS
    if not any(wanted) and any(opposite):
        return FAILS
    if not any(wanted) and not any(opposite):
        return NO_DIFFERENCE
    return DISAGREE


Bootstrap = Callable[[str, int, str], "dict[str, Any] | None"]


def collect_claims(
    suite: Suite, entries: Mapping[str, Mapping[str, Any]], seeds: Sequence[int], bootstrap: Bootstrap
) -> list[dict[str, Any]]:
    """One row per claim: the claim, both sides' quality and size, per-seed Δ and the verdict.
    `entries` is the collected per-entry data; `bootstrap(system, seed, baseline)` the paired bootstrap."""
    return [_claim_row(c, entries, seeds, bootstrap, len(suite.seeds)) for c in suite.claims]


def _claim_row(
    claim: Claim,
    entries: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    bootstrap: Bootstrap,
    seeds_expected: int,
) -> dict[str, Any]:
    system, baseline = entries.get(claim.system), entries.get(claim.baseline)
    rows = [b for seed in seeds if (b := bootstrap(claim.system, seed, claim.baseline)) is not None]
    size = {side: (e["size"] if e else None) for side, e in (("system", system), ("baseline", baseline))}
    return {
        "paper": claim.paper,
        "claim": claim.claim,
        "design": claim.design,
        "system": claim.system,
        "baseline": claim.baseline,
        "expect": claim.expect,
        "quality": {side: (e["quality"] if e else None) for side, e in (("system", system), ("baseline", baseline))},
        "size": size,
        "bootstrap": rows,
        "verdict": verdict(claim.expect, rows, seeds_expected),
    }


__all__ = ["DISAGREE", "FAILS", "HOLDS", "NO_DIFFERENCE", "collect_claims", "verdict"]
