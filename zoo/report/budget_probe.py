"""A budget probe's decision (issue 64), applied to the baseline's learning curve and rendered with its numbers.

A probe suite trains its baseline once, far past the budgets it weighs, with a schedule that does not depend on the
run's length (inverse-sqrt), so the run's checkpoint at update u is what a u-update run would train: one curve gives
every budget's validation quality and share of distinct validation outputs. The rule (the suite's `probe:`,
`suite.BudgetProbe`) is fixed before the run; this module only applies it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zoo.plots import save_report_figure
from zoo.report.suite import BudgetProbe

PLOT_FILE = "probe.png"


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
        last = probe["rows"][-1]["distinct"]
        if last is not None and last < rule["min_distinct"]:  # the fallback is not held to the distinct share
            lines[-1] += (
                f" But only {last:.0%} of its validation outputs are distinct (a budget that qualifies needs "
                f"{rule['min_distinct']:.0%}): the baseline gives near-constant outputs at every budget probed, so "
                'claims judged at this budget would read "degenerate outputs" — the recipe, not the budget, '
                "is what to change."
            )
    else:
        lines.append(f"**Chosen: {probe['chosen']} updates.**")
    return [*lines, "", f"![budget probe]({PLOT_FILE})", ""]


def plot_probe(data: Mapping[str, Any], out_dir: Path) -> None:
    """The baseline's validation quality and share of distinct outputs over updates, the budgets marked (the chosen
    one solid): `PLOT_FILE` in `out_dir`, nothing for a suite that is no probe."""
    probe = data.get("probe")
    if not probe:
        return
    import matplotlib.pyplot as plt  # here: matplotlib is slow to import and only plotting needs it

    curve = data["entries"][data["baseline"]]["seeds"][probe["seed"]].get("learning_curve") or []
    points = [p for p in curve if p.get("valid_quality") is not None]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([p["step"] for p in points], [p["valid_quality"] for p in points], marker=".", color="C0")
    ax.set_xlabel("update")
    ax.set_ylabel(f"validation {'BLEU' if data['task'] == 'translation' else 'ROUGE-L'} (greedy)", color="C0")
    share = ax.twinx()
    shown = [p for p in points if p.get("valid_distinct") is not None]
    share.plot([p["step"] for p in shown], [100 * p["valid_distinct"] for p in shown], marker=".", color="C1")
    share.axhline(100 * probe["rule"]["min_distinct"], color="C1", linestyle=":", linewidth=1)
    share.set_ylabel("distinct validation outputs (%)", color="C1")
    share.set_ylim(0, 100)
    for budget in probe["rule"]["budgets"]:
        chosen = budget == probe["chosen"]
        ax.axvline(budget, color="black", linestyle="-" if chosen else "--", linewidth=1.5 if chosen else 0.8)
    ax.set_title(f"budget probe: {data['baseline']} seed {probe['seed']}; chosen {probe['chosen'] or '—'}")
    ax.grid(alpha=0.3)
    save_report_figure(fig, out_dir / PLOT_FILE)


__all__ = ["PLOT_FILE", "plot_probe", "point_at", "probe_choice", "probe_section"]
