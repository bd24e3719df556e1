"""A budget probe's decision (issue 64), applied to the baseline's learning curve and rendered with its numbers.

A probe suite trains its baseline once, far past the budgets it weighs, with a schedule that does not depend on the
run's length (inverse-sqrt), so the run's checkpoint at update u is what a u-update run would train: one curve gives
every budget's validation quality and share of distinct validation outputs. The rule (the suite's `probe:`,
`suite.BudgetProbe`) is fixed before the run; this module only applies it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from zoo.report.suite import BudgetProbe


def point_at(curve: Sequence[Mapping[str, Any]], budget: int) -> Mapping[str, Any] | None:
    """The last validation point at or before update `budget` (None if the curve has none)."""
    before = [p for p in curve if p.get("valid_quality") is not None and p["step"] <= budget]
    return max(before, key=lambda p: p["step"]) if before else None


def probe_choice(probe: BudgetProbe, baseline: Mapping[str, Any]) -> dict[str, Any]:
    """The rule applied to the baseline's first seed: per budget its validation point, the gain to the next budget's
    and whether it qualifies; the chosen budget (None while the run has not reached the last one)."""
    seed = min(baseline["seeds"])
    curve = baseline["seeds"][seed].get("learning_curve") or []
    last_step = max((p["step"] for p in curve), default=0)
    rows: list[dict[str, Any]] = []
    for budget in probe.budgets:
        point = point_at(curve, budget) if last_step >= budget else None
        row: dict[str, Any] = {"budget": budget, "reached": point is not None}
        if point is not None:
            row.update(step=point["step"], quality=point["valid_quality"], distinct=point.get("valid_distinct"))
        rows.append(row)
    for row, following in itertools.pairwise(rows):
        if row["reached"] and following["reached"]:
            row["gain_to_next"] = following["quality"] - row["quality"]
            distinct = row["distinct"] is not None and row["distinct"] >= probe.min_distinct
            row["qualifies"] = row["gain_to_next"] < probe.min_gain and distinct
    chosen, fallback_gain = None, None
    if rows[-1]["reached"]:
        chosen = next((r["budget"] for r in rows[:-1] if r.get("qualifies")), probe.budgets[-1])
        if chosen == probe.budgets[-1]:  # what the last budget's last quarter still gained
            start = point_at(curve, probe.budgets[-1] * 3 // 4)
            fallback_gain = rows[-1]["quality"] - start["valid_quality"] if start else None
    return {
        "seed": seed,
        "rule": {"budgets": list(probe.budgets), "min_gain": probe.min_gain, "min_distinct": probe.min_distinct},
        "rows": rows,
        "chosen": chosen,
        "last_quarter_gain": fallback_gain,
        "updates": last_step,
    }


def probe_section(data: Mapping[str, Any]) -> list[str]:
    """Markdown: the rule, a row per budget, the decision (nothing for a suite that is no probe)."""
    probe = data.get("probe")
    if not probe:
        return []
    rule = probe["rule"]
    metric = "BLEU" if data["task"] == "translation" else "ROUGE-L"
    lines = [
        "## Budget probe",
        "",
        f"Rule, fixed before the run (the suite's `probe:`): the smallest of {', '.join(map(str, rule['budgets']))} "
        f"updates at which the next budget's validation {metric} (greedy) is less than {rule['min_gain']:g} higher "
        f"and at least {rule['min_distinct']:.0%} of the validation outputs are distinct; if none qualifies, the last. "
        f"A budget's point is the last validation at or before it. `{data['baseline']}` seed {probe['seed']}, "
        f"{probe['updates']} updates recorded.",
        "",
        f"| budget | validation point | validation {metric} | distinct outputs | next budget gains | qualifies |",
        "|---|---|---|---|---|---|",
    ]
    for row in probe["rows"]:
        if not row["reached"]:
            lines.append(f"| {row['budget']} | not reached | — | — | — | — |")
            continue
        distinct = f"{row['distinct']:.0%}" if row["distinct"] is not None else "—"
        gain = f"{row['gain_to_next']:+.2f}" if "gain_to_next" in row else "—"
        qualifies = {True: "yes", False: "no"}.get(row.get("qualifies"), "—")
        lines.append(
            f"| {row['budget']} | update {row['step']} | {row['quality']:.2f} | {distinct} | {gain} | {qualifies} |"
        )
    lines.append("")
    if probe["chosen"] is None:
        lines.append(f"No decision yet: the run has not reached {rule['budgets'][-1]} updates.")
    elif probe["last_quarter_gain"] is not None:
        lines.append(
            f"**Chosen: {probe['chosen']} updates** — no smaller budget qualifies; its last quarter still gained "
            f"{probe['last_quarter_gain']:+.2f} validation {metric}."
        )
    else:
        lines.append(f"**Chosen: {probe['chosen']} updates.**")
    return [*lines, ""]


__all__ = ["point_at", "probe_choice", "probe_section"]
