"""The speed part of a suite's report: one table per machine class (sent/s, × baseline per round, peak memory,
speed-up ÷ FLOP ratio), the papers' efficiency claims with verdicts from the per-round ratios, the README's speed
column, and the figure the product is about — quality against sent/s with the Pareto front marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from zoo.flops import format_count
from zoo.report.speed_results import PRECISIONS, round_ratios, speed_verdict

LABELS = {"fp32": "ORT fp32", "int8": "ORT INT8", "served": "served"}


def _ratio_text(point: dict[str, Any]) -> str:
    ratios = point.get("ratios") or []
    if not ratios:
        return ""
    lo, hi = min(ratios), max(ratios)
    span = f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"
    return f" (×{point['ratio']:.2f}; rounds {span})"


def speed_cell(point: dict[str, Any] | None, notes: list[str], where: str) -> str:
    """`123.4 (×1.10; rounds 1.05–1.14)`: median sent/s and the per-round ratios to the baseline."""
    if not point:
        return "—"
    if point.get("error"):
        notes.append(f"{where}: {point['error']}")
        return "error"
    return f"{point['median']:.1f}{_ratio_text(point)}"


def _columns(speed: dict[str, Any]) -> list[tuple[str, str]]:
    """(point key, header) for every setting × precision, then served when measured."""
    cols = [(f"{s['name']}/{p}", f"{s['name']} {LABELS[p]} sent/s") for s in speed["settings"] for p in PRECISIONS]
    if any("served" in e["points"] for e in speed["entries"].values()):
        cols.append(("served", "served sent/s"))
    return cols


def _peak(points: dict[str, Any], precision: str) -> str:
    peaks = [p["peak_rss_mb"] for k, p in points.items() if k.endswith(f"/{precision}") and p.get("peak_rss_mb")]
    return f"{max(peaks):.0f}" if peaks else "—"


def _per_flop(rec: dict[str, Any], key: str) -> str:
    """Measured speed-up ÷ FLOP saving (1.00: every FLOP saved became time saved)."""
    point = rec["points"].get(key) or {}
    if not point.get("ratio") or rec["flop_ratio"] >= 1.0 - 1e-9:
        return "—"
    return f"{point['ratio'] * rec['flop_ratio']:.2f}"


def settings_text(speed: dict[str, Any]) -> str:
    return "; ".join(
        f"`{s['name']}` = beam {s['beam_size']}, batch {s['batch']}, limit {s['max_len_a']}·src + {s['max_len_b']} "
        "tokens incl. eos"
        for s in speed["settings"]
    )


def speed_section(
    speeds: list[dict[str, Any]], baseline: str, claims: list[dict[str, Any]], enabled: bool = True
) -> list[str]:
    """`## Speed` of REPORT.md: for each machine class its table and the efficiency claims."""
    if not speeds and not enabled:
        return [
            "## Speed",
            "",
            "Not measured for this suite (`speed.enabled: false` in its conf/suite file, which says why).",
            "",
        ]
    if not speeds:
        return [
            "## Speed",
            "",
            "Not measured yet: `python -m zoo.report +suite=<suite> stages=[speed]` rebuilds every record's model "
            "and times it (no checkpoint needed).",
            "",
        ]
    lines = ["## Speed", ""]
    for speed in speeds:
        notes: list[str] = []
        m = speed["machine"]
        lines += [
            f"### `{m['class']}` (`{speed['file']}`)",
            "",
            f"Measured {speed['measured']} at `{speed['git_sha']}` on {m['cpu_model']} ({m['cores']} cores, "
            f"onnxruntime {m.get('onnxruntime')}); {speed['threads'] or 'default'} ORT thread(s); the first "
            f"{speed['sentences']} test sources; {speed['rounds']} interleaved rounds (every entry once per round, "
            "order rotated), medians, and × the baseline `" + baseline + "` as the median of the per-round ratios "
            "with their range. Work: every sentence decoded to exactly as many tokens as the seed-"
            f"{speed['seed']} record's hypothesis has, by a model rebuilt from the record's config and head plan "
            "(heads physically removed) with random weights — speed depends on the shapes and the amount of work, "
            f"not the weights. Settings: {settings_text(speed)}.",
            "",
        ]
        if speed.get("served_settings"):
            s = speed["served_settings"]
            lines += [
                f"Served: one real tritonserver, every entry's fp32 export, {s.get('protocol', 'grpc')} at "
                f"concurrency {s.get('concurrency')} (one sentence per request, dynamic batching on), "
                f"{s.get('instance_count')} instance(s) × {s.get('threads')} thread(s), {s.get('duration_s')} s per "
                "point and round; requests carry their forced length.",
                "",
            ]
        cols = _columns(speed)
        first = cols[0][0]
        header = ["entry", "params excl. emb", "FLOPs × base", *(h for _, h in cols)]
        header += ["peak MB fp32 (largest setting)", "peak MB INT8", f"speed-up ÷ FLOP saving ({first})"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for entry, rec in speed["entries"].items():
            row = [f"`{entry}`", format_count(rec["size"]["params_excl_emb"]), f"{rec['flop_ratio']:.2f}"]
            row += [speed_cell(rec["points"].get(k), notes, f"`{entry}` {k}") for k, _ in cols]
            row += [_peak(rec["points"], "fp32"), _peak(rec["points"], "int8"), _per_flop(rec, first)]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        if notes:
            lines += ["Measurement errors:", "", *(f"- {n}" for n in notes), ""]
        lines += efficiency_claims(speed, claims)
    return lines


def efficiency_claims(speed: dict[str, Any], claims: list[dict[str, Any]]) -> list[str]:
    """The papers' efficiency claims on this machine: the per-round ratios behind each verdict."""
    if not claims:
        return []
    lines = [
        "The papers' efficiency claims on this machine — **holds**: faster than the baseline in every round; "
        "**does not hold**: slower in every round; **inconclusive**: rounds disagree.",
        "",
        "| paper | claim | system vs baseline | point | per-round ratios | verdict | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        point = ((speed["entries"].get(c["system"]) or {}).get("points") or {}).get(c["point"]) or {}
        base = ((speed["entries"].get(c["baseline"]) or {}).get("points") or {}).get(c["point"]) or {}
        ratios = round_ratios(point.get("rounds") or [], base.get("rounds") or [])
        verdict = speed_verdict(ratios)
        src = c["source"]
        lines.append(
            f"| {c['paper']} | {c['claim']} | `{c['system']}` vs `{c['baseline']}` | {c['point']} | "
            f"{', '.join(f'{r:.2f}' for r in ratios) or '—'} | **{verdict}** | {src['paper']}, {src['where']}: "
            f"“{src['quote']}” |"
        )
    return [*lines, ""]


def readme_speed_column(speeds: list[dict[str, Any]]) -> tuple[str, dict[str, str]] | None:
    """The README table's speed column: the first speed file's first fp32 point, per entry."""
    if not speeds:
        return None
    speed = speeds[0]
    key = f"{speed['settings'][0]['name']}/fp32"
    cells = {entry: speed_cell(rec["points"].get(key), [], entry) for entry, rec in speed["entries"].items()}
    return f"{key.replace('/', ' ')} sent/s ({speed['machine']['class']})", cells


def _pareto(points: list[tuple[str, float, float]]) -> set[str]:
    """Entries no other entry beats on both speed and quality."""
    return {
        name for name, x, y in points if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for _, x2, y2 in points)
    }


def plot_quality_vs_speed(data: dict[str, Any], speed: dict[str, Any], out: Path, label: str) -> Path | None:
    """Quality (mean ± std over seeds) against sent/s (served where measured, else the first fp32 point), one
    point per entry, the Pareto front joined."""
    key = "served" if any("served" in e["points"] for e in speed["entries"].values()) else None
    key = key or f"{speed['settings'][0]['name']}/fp32"
    points = []
    for entry, rec in data["entries"].items():
        q = rec["quality"].get(data["headline"])
        p = (speed["entries"].get(entry) or {}).get("points", {}).get(key) or {}
        if q and p.get("median"):
            points.append((entry, p["median"], q["mean"], q["std"]))
    if not points:
        return None
    front = _pareto([(n, x, y) for n, x, y, _ in points])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, x, y, std in points:
        on = name in front
        ax.errorbar([x], [y], yerr=[std], fmt="o", capsize=3, color="C3" if on else "C0")
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    hull = sorted((x, y) for n, x, y, _ in points if n in front)
    ax.plot([x for x, _ in hull], [y for _, y in hull], "--", color="C3", label="Pareto front")
    ax.set_xlabel(f"sentences/s ({key}; {speed['machine']['class']})")
    ax.set_ylabel(f"test {label} (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


__all__ = [
    "efficiency_claims",
    "plot_quality_vs_speed",
    "readme_speed_column",
    "settings_text",
    "speed_cell",
    "speed_section",
]
