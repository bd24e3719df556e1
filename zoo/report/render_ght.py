"""GHT's sections of REPORT.md and their plots: how compact the groups the loss trained were over updates, per
module; the compaction table of every GHT run; a compaction scan's choice by its suite's rule (issue 62); the
head plans and Voting-to-Stay of GHT-PS runs. Everything is read from the collected records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from zoo.ght.voting import plot_votes
from zoo.plots import save_report_figure as _save
from zoo.report.run_state import COMPACT_SILHOUETTE


def _runs(data: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(entry, seed, run) of every run with compaction checks, in the suite's order."""
    return [
        (entry, seed, run)
        for entry, rec in data["entries"].items()
        for seed, run in rec["seeds"].items()
        if run.get("compaction_curve")
    ]


def _slope(curve: list[dict[str, Any]], key: str) -> float | None:
    """Least-squares slope of the mean `key` over the checks of the last half of the updates, per 1000 updates."""
    last = curve[-1]["step"]
    points = [(c["step"], c["mean"][key]) for c in curve if c["step"] >= last / 2]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 1000 * sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def final_validation(run: dict[str, Any]) -> float | None:
    """The last validation quality of a run (greedy BLEU / ROUGE-L), the scan's quality criterion."""
    points = [p["valid_quality"] for p in run.get("learning_curve") or [] if p.get("valid_quality") is not None]
    return points[-1] if points else None


def collapsed(mean: dict[str, float], rule: dict[str, Any]) -> bool:
    """Every module's heads on two antipodal directions, on average: intra cos near 1, centres opposite."""
    return mean["intra_cos"] >= rule["collapse_intra"] and mean["inter_cos"] <= rule["collapse_inter"]


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def compaction_table(data: dict[str, Any]) -> list[str]:
    runs = _runs(data)
    if not runs:
        return []
    rule = data.get("compaction_rule")
    lines = [
        "## GHT: compaction of the trained groups",
        "",
        "Mean over the constrained modules at the last check (GHT-PS: at the vote), on the fixed probe batch, of "
        "the partition the loss trained (records before issue 62: the probe batch's own k-means, marked `probe`); "
        "slopes are least-squares over the checks of the last half of the updates, per 1000 updates. Curves per "
        "module below.",
        "",
    ]
    header = ["entry", "seed", "partition", "update", "silhouette", "intra cos", "inter cos"]
    header += ["silhouette slope", "intra cos slope", "final valid quality"]
    header += ["collapsed"] if rule else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry, seed, run in runs:
        curve, last = run["compaction_curve"], run["compaction_curve"][-1]["mean"]
        row = [f"`{entry}`", str(seed), run["compactness"]["partition"], str(run["compaction_curve"][-1]["step"])]
        row += [f"{last['silhouette']:.3f}", f"{last['intra_cos']:.3f}", f"{last['inter_cos']:.3f}"]
        row += [_fmt(_slope(curve, "silhouette"), "+.3f"), _fmt(_slope(curve, "intra_cos"), "+.3f")]
        row.append(_fmt(final_validation(run), ".2f"))
        if rule:
            row.append("yes" if collapsed(last, rule) else "no")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += scan_section(data)
    lines.append("![compaction over updates](compaction.png)")
    lines += [f"![compaction {e} seed {s}](compaction-{e}-seed{s}.png)" for e, s, _ in runs]
    return [*lines, ""]


def scan_verdicts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scan of the suite's compaction rule: each setting's outcome (in the scan's order, weakest first) and
    the chosen one — the first that compacts without collapse or a quality loss, once every weaker one has run —
    or None (then `passing`: the weakest passing so far)."""
    rule = data.get("compaction_rule")
    if not rule:
        return []
    seed_of = {e: next(iter(data["entries"][e]["seeds"]), None) for e in data["entries"]}

    def run_of(entry: str) -> dict[str, Any] | None:
        seed = seed_of.get(entry)
        return data["entries"][entry]["seeds"][seed] if seed is not None else None

    out = []
    for scan in rule["scans"]:
        reference = run_of(scan["reference"])
        ref_quality = final_validation(reference) if reference else None
        rows = []
        for entry in scan["entries"]:
            run = run_of(entry)
            if not run or not run.get("compaction_curve"):
                rows.append({"entry": entry, "outcome": "not run yet", "passes": False})
                continue
            last = run["compaction_curve"][-1]["mean"]
            quality = final_validation(run)
            reasons = []
            if last["silhouette"] < rule["silhouette"]:
                reasons.append(f"silhouette {last['silhouette']:.3f} < {rule['silhouette']}")
            if collapsed(last, rule):
                reasons.append(f"collapsed (intra cos {last['intra_cos']:.3f}, inter cos {last['inter_cos']:.3f})")
            if quality is None or ref_quality is None:
                reasons.append("no validation quality to compare")
            elif quality < ref_quality - rule["max_quality_loss"]:
                reasons.append(f"validation {quality:.2f} < ×1's {ref_quality:.2f} − {rule['max_quality_loss']}")
            compacted = last["silhouette"] >= rule["silhouette"] and not collapsed(last, rule)
            rows.append(
                {
                    "entry": entry,
                    "outcome": "; ".join(reasons) or "compacts",
                    "passes": not reasons,
                    "compacted": compacted,
                }
            )
        missing = [r["entry"] for r in rows if r["outcome"] == "not run yet"]
        first = next((r for r in rows if r["passes"] or r["outcome"] == "not run yet"), None)
        # the weakest that passes is chosen only once every weaker setting has run (and failed)
        chosen = first["entry"] if first is not None and first["passes"] else None
        passing = next((r["entry"] for r in rows if r["passes"]), None)
        out.append({"name": scan["name"], "rows": rows, "chosen": chosen, "missing": missing, "passing": passing})
    return out


def scan_section(data: dict[str, Any]) -> list[str]:
    rule = data.get("compaction_rule")
    verdicts = scan_verdicts(data)
    if not verdicts:
        return []
    lines = [
        "### The setting each scan chooses",
        "",
        f"The rule (the suite file): the weakest setting whose trained groups end with a mean silhouette ≥ "
        f"{rule['silhouette']}, without collapse (intra cos ≥ {rule['collapse_intra']} with inter cos ≤ "
        f"{rule['collapse_inter']}) and with a final validation quality at most {rule['max_quality_loss']} below "
        "the scan's ×1 run.",
        "",
    ]
    for scan in verdicts:
        lines += [f"**{scan['name']}**: " + ", ".join(f"`{r['entry']}` {r['outcome']}" for r in scan["rows"]) + "."]
        if scan["chosen"]:
            lines.append(f"Chosen: `{scan['chosen']}`.")
        elif scan["missing"]:
            so_far = f" The weakest that passes so far: `{scan['passing']}`." if scan["passing"] else ""
            lines.append(f"No choice yet: {len(scan['missing'])} setting(s) not run.{so_far}")
        elif compacting := [r["entry"] for r in scan["rows"] if r.get("compacted")]:
            lines.append(
                "No setting passes the rule within the budget: "
                + ", ".join(f"`{e}`" for e in compacting)
                + f" compact{'s' if len(compacting) == 1 else ''} the trained groups (mean silhouette ≥ "
                f"{rule['silhouette']}, no collapse) but lose more validation quality than the rule allows (above)."
            )
        else:
            lines.append("No setting in this scan compacts the trained groups within the budget.")
        lines.append("")
    return lines


def ght_section(data: dict[str, Any]) -> list[str]:
    """Per GHT run: the first and last compactness check, the vote and the kept heads."""
    lines: list[str] = []
    for entry, rec in data["entries"].items():
        for seed, run in rec["seeds"].items():
            if not run.get("head_plan") and not run.get("compactness"):
                continue
            if not lines:
                lines += ["## GHT: head plans and compactness", ""]
            lines.append(f"### `{entry}` seed {seed}")
            comp = run.get("compactness")
            if comp:
                b, a = comp["before"], comp["after"]
                lines += [
                    "",
                    f"Partition: {comp['partition']}.",
                    "",
                    "| probe | update | intra-group cos | inter-group cos | silhouette | Dunn |",
                    "|---|---|---|---|---|---|",
                ]
                first = "before GCT" if b["step"] == 0 else "first probe of GCT"
                for label, p in ((first, b), ("end of GCT", a)):
                    lines.append(
                        f"| {label} | {p['step']} | {p['intra_cos']:.3f} | {p['inter_cos']:.3f} | "
                        f"{p['silhouette']:.3f} | {p['dunn']:.3f} |"
                    )
            voting = run.get("voting")
            if voting and voting.get("step") is not None:
                maps = "/".join(voting.get("vote_maps") or []) or "?"
                seconds = voting.get("voting_seconds")
                trigger = voting.get("trigger") or "trigger not recorded"
                lines += [
                    "",
                    f"Voting-to-Stay at update {voting['step']} ({trigger}): "
                    f"{voting.get('voting_batches')} batches × maps {maps}"
                    + (f" in {seconds / 60:.1f} min" if seconds else "")
                    + f", selection `{voting.get('selection')}`.",
                ]
            plan = run.get("head_plan")
            if plan:
                lines += [
                    "",
                    "Kept heads per module: "
                    + ", ".join(f"`{name.replace('.layers.', '.')}` {kept}" for name, kept in plan.items()),
                ]
            if run.get("votes"):
                lines += ["", f"![votes {entry} seed {seed}](votes-{entry}-seed{seed}.png)"]
            lines.append("")
    return lines


def plot_compaction(data: dict[str, Any], out_dir: Path) -> None:
    """compaction.png (mean silhouette and intra cos of every run over updates) and, per run,
    compaction-<entry>-seed<k>.png (each module's, the mean in black)."""
    runs = _runs(data)
    if not runs:
        return
    keys = (("silhouette", "silhouette"), ("intra_cos", "intra-group cos"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for entry, seed, run in runs:
        curve = run["compaction_curve"]
        for ax, (key, _) in zip(axes, keys, strict=True):
            ax.plot([c["step"] for c in curve], [c["mean"][key] for c in curve], marker=".", label=f"{entry} s{seed}")
    for ax, (_, label) in zip(axes, keys, strict=True):
        ax.set_xlabel("update")
        ax.set_ylabel(f"mean {label} (trained groups)")
        ax.grid(alpha=0.3)
    axes[0].axhline(COMPACT_SILHOUETTE, color="grey", ls="--", lw=1, label=f"compact (≥ {COMPACT_SILHOUETTE})")
    axes[0].legend(fontsize=7, ncol=2)
    _save(fig, out_dir / "compaction.png")
    for entry, seed, run in runs:
        curve = run["compaction_curve"]
        steps = [c["step"] for c in curve]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, (key, label) in zip(axes, keys, strict=True):
            for name in curve[-1]["modules"]:
                values = [c["modules"].get(name, {}).get(key) for c in curve]
                ax.plot(steps, values, lw=1, alpha=0.7, label=name.replace(".layers.", ".").replace("_attn", ""))
            ax.plot(steps, [c["mean"][key] for c in curve], color="black", lw=2, label="mean")
            ax.set_xlabel("update")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].axhline(COMPACT_SILHOUETTE, color="grey", ls="--", lw=1)
        axes[0].set_title(f"{entry} seed {seed}: per module", fontsize=9)
        axes[1].legend(fontsize=6, ncol=2)
        _save(fig, out_dir / f"compaction-{entry}-seed{seed}.png")


def plot_vote_maps(data: dict[str, Any], out_dir: Path) -> None:
    for entry, rec in data["entries"].items():
        for seed, run in rec["seeds"].items():
            if run.get("votes"):
                plot_votes(run["votes"]["votes"], run["votes"]["plan"], str(out_dir / f"votes-{entry}-seed{seed}.png"))


__all__ = [
    "collapsed",
    "compaction_table",
    "final_validation",
    "ght_section",
    "plot_compaction",
    "plot_vote_maps",
    "scan_verdicts",
]
