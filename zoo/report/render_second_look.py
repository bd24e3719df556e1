"""REPORT.md's paragraph on a suite's declared second look (zoo/report/second_look.py): the design in words, its
simulated false-positive rates beside what adding the seeds without a design would give, and the runs the
pending claims wait for, with the command that trains them."""

from __future__ import annotations

from typing import Any

SCENARIO_WORDS = {
    "seeds": "seeds dominate",
    "comparable": "seeds and test set alike",
    "sentences": "test set dominates",
}


def second_look_section(data: dict[str, Any], compact: bool = False) -> list[str]:
    """The paragraph (and table) under the rule text; nothing for a suite without a second look."""
    info = data.get("second_look")
    if not info:
        return []
    design = info["design"]
    r, seeds = design["first_share"], ", ".join(map(str, design["seeds"]))
    plural = "s" * (len(design["seeds"]) > 1)
    text = (
        f"**Second look** (declared in `conf/suite/{data['suite']}.yaml` before any run of seed{plural} {seeds}): "
        "a claim tested at the first seeds (look 1) that is neither decided there nor above p₁ = "
        f"{design['continue_below']:g} is tested again with seeds {seeds} added (look 2). Its p is p* = min(p₁/{r:g}, "
        f"p₂/{1 - r:g}): every Holm step level split between the two looks, so a family's false-positive rate stays "
        "at α whatever the looks' correlation (zoo/report/second_look.py); the verdict says at which look it was "
        f"reached. {_waiting(info, data['suite'])}"
    )
    if compact:
        return [text, ""]
    return [text, "", *_simulation(info.get("simulation"), data["suite"])]


def _waiting(info: dict[str, Any], suite: str) -> str:
    if not info["pending"]:
        return "No claim waits for look 2."
    runs = info["runs"]
    if not runs:
        return f"{info['pending']} claim{'s wait' if info['pending'] > 1 else ' waits'} for look 2 with every run in."
    entries = list(dict.fromkeys(e for e, _ in runs))
    seeds = sorted({s for _, s in runs})
    listed = "; ".join(f"`{e}` {', '.join(str(s) for n, s in runs if n == e)}" for e in entries)
    command = (
        f'`python -m zoo.report +suite={suite} "suite.entries=[{",".join(entries)}]" '
        f"\"suite.seeds=[{','.join(map(str, seeds))}]\" 'stages=[train]'`"
    )
    return (
        f"{info['pending']} claim{'s wait' if info['pending'] > 1 else ' waits'} for look 2; their runs still to train "
        f"(entry and seeds): {listed} — {command}."
    )


def _simulation(sim: dict[str, Any] | None, suite: str) -> list[str]:
    if sim is None:
        return [
            f"Its false-positive rate is not simulated yet: `python -m zoo.report +suite={suite} 'stages=[simulate]'`.",
            "",
        ]
    n = next(iter(sim["scenarios"].values()))["simulations"]
    lines = [
        f"Simulated under no effect ({sim['first_seeds']} + {len(sim['design']['seeds'])} seeds, a `better` claim "
        f"alone, {n} simulations per scenario of {sim['sentences']} test sentences, {sim['bootstrap']} resamples per "
        f"test; `second_look.json`, standard error at α: {sim['se_at_alpha']:.4f}) — the share of simulations with a "
        f"definite verdict, which the rule is to keep at or below α = {sim['alpha']:g}:",
        "",
        "| scenario (sd: seed / shared per sentence / own per sentence) | look 1 alone | the two looks as declared "
        "| look 2's seeds added and tested at α, undeclared |",
        "|---|---:|---:|---:|",
    ]
    for name, s in sim["scenarios"].items():
        label = f"{SCENARIO_WORDS.get(name, name)} ({s['seed_sd']:g} / {s['shared_sd']:g} / {s['noise_sd']:g})"
        lines.append(f"| {label} | {s['look1_alone']:.1%} | {s['designed']:.1%} | {s['naive']:.1%} |")
    return [*lines, ""]


__all__ = ["second_look_section"]
