"""The speed part of a suite's report: one table per machine class (sent/s, × baseline, peak memory, speed-up ÷
FLOP ratio), the negative controls (how wide timing the same work twice reads), the papers' efficiency claims with
verdicts by the rule of speed_rule.py, the README's speed column, and the figure the product is about — quality against
sent/s with the Pareto front marked. A file of an old format (speed_results.py) is shown as measured and judged by
nothing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from zoo.flops import format_count
from zoo.report.claims import OURS_FAMILY
from zoo.report.speed_results import PRECISIONS
from zoo.report.speed_rule import (
    CONTROL_FAILED,
    MARGIN,
    RULE_TEXT,
    RatioTest,
    SpeedJudgement,
    judge_claims,
    judge_control,
    ratio_test,
)

LABELS = {"fp32": "ORT fp32", "int8": "ORT INT8", "served": "served"}
OLD_RULE = (
    "**Measured under the old rule** (format {fmt}): each entry decoded its *own* record's output lengths, so its "
    "sent/s mixes speed with how many tokens it wrote (tokens/s shown beside it); {rounds} rounds; the CPU family "
    "was not recorded. Shown as measured, with **no efficiency verdicts** — re-run `python -m zoo.report "
    "+suite={suite} stages=[speed]` to measure under the current rule."
)
NOT_JUDGED = "not judged: measured under the old rule; re-run stages=[speed]"


def speed_cell(point: dict[str, Any] | None, notes: list[str], where: str, judged: bool = True) -> str:
    """`123.4 (×1.10)`: median sent/s and the geometric mean of the per-round ratios to the baseline (same work);
    for an old-format file `123.4 · 2345 tok/s`, with no ratio (each entry decoded its own lengths)."""
    if not point:
        return "—"
    if point.get("error"):
        notes.append(f"{where}: {point['error']}")
        return "error"
    if not judged:
        tokens = f" · {point['tokens_per_s']:.0f} tok/s" if point.get("tokens_per_s") else ""
        return f"{point['median']:.1f}{tokens}"
    return f"{point['median']:.1f}" + (f" (×{point['ratio']:.2f})" if point.get("ratio") else "")


def _columns(speed: dict[str, Any]) -> list[tuple[str, str]]:
    """(point key, header) for every setting × precision, then served when measured."""
    unit = "sent/s" if speed["judged"] else "sent/s · tok/s"
    cols = [(f"{s['name']}/{p}", f"{s['name']} {LABELS[p]} {unit}") for s in speed["settings"] for p in PRECISIONS]
    if any("served" in e["points"] for e in speed["entries"].values()):
        cols.append(("served", "served sent/s"))
    return cols


def _peak(points: dict[str, Any], precision: str) -> str:
    peaks = [p["peak_rss_mb"] for k, p in points.items() if k.endswith(f"/{precision}") and p.get("peak_rss_mb")]
    return f"{max(peaks):.0f}" if peaks else "—"


def _cache(point: dict[str, Any] | None) -> str:
    """One hypothesis's decoder caches at the end of its sentence, the mean over the workload (beam 1's; a beam of
    k holds k of them)."""
    return f"{point['cache_kb']:.1f}" if point and point.get("cache_kb") else "—"


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


def _tokens_text(speed: dict[str, Any]) -> str:
    """The output tokens every entry decoded per setting (the baseline's): tokens/s = sent/s × tokens/sentence."""
    base = speed["entries"][speed["baseline"]]["points"]
    parts = []
    for s in speed["settings"]:
        tokens = (base.get(f"{s['name']}/fp32") or {}).get("output_tokens")
        if tokens:
            parts.append(f"`{s['name']}` {tokens:,} ({tokens / speed['sentences']:.1f} per sentence)")
    if not parts:
        return ""
    return (
        "Output tokens (incl. eos) every entry decoded: "
        + "; ".join(parts)
        + " — so tokens/s = sent/s × tokens per sentence, and the ratios are per-token ratios."
    )


def _intro(speed: dict[str, Any], baseline: str) -> list[str]:
    m = speed["machine"]
    signature = f", {m['cpu_signature']}" if m.get("cpu_signature") else ""
    lines = [
        f"### `{m['class']}` (`{speed['file']}`)",
        "",
        f"Measured {speed['measured']} at `{speed['git_sha']}` on {m['cpu_model']}{signature} ({m['cores']} cores, "
        f"onnxruntime {m.get('onnxruntime')}); {speed['threads'] or 'default'} ORT thread(s); the first "
        f"{speed['sentences']} test sources; {speed['rounds']} interleaved rounds (every entry once per round, order "
        f"rotated); medians, and × the baseline `{baseline}` as the geometric mean of the per-round ratios. Work: "
        f"{speed.get('workload') or 'as recorded'} — speed depends on the shapes and the amount of work, not the "
        f"weights. Settings: {settings_text(speed)}.",
        "",
    ]
    if not speed["judged"]:
        lines += [OLD_RULE.format(fmt=speed["format"], rounds=speed["rounds"], suite=speed["suite"]), ""]
    elif _tokens_text(speed):
        lines += [_tokens_text(speed), ""]
    if speed.get("served_settings"):
        s = speed["served_settings"]
        lines += [
            f"Served: one real tritonserver, every entry's fp32 export, {s.get('protocol', 'grpc')} at "
            f"concurrency {s.get('concurrency')} (one sentence per request, dynamic batching on), "
            f"{s.get('instance_count')} instance(s) × {s.get('threads')} thread(s), {s.get('duration_s')} s per "
            "point and round; requests carry their forced length.",
            "",
        ]
    return lines


def _table(speed: dict[str, Any]) -> list[str]:
    """The entries' table (the A/A control has its own, below); measurement errors listed after it."""
    notes: list[str] = []
    cols = _columns(speed)
    first = cols[0][0]
    header = ["entry", "params excl. emb", "FLOPs × base", *(h for _, h in cols)]
    header += ["peak MB fp32 (largest setting)", "peak MB INT8"]
    caches = any(p.get("cache_kb") for rec in speed["entries"].values() for p in rec["points"].values())
    header += ["decoder cache KB per sentence"] if caches else []  # files before it have none
    header += [f"speed-up ÷ FLOP saving ({first})"] if speed["judged"] else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry, rec in speed["entries"].items():
        if rec.get("control_of"):
            continue
        row = [f"`{entry}`", format_count(rec["size"]["params_excl_emb"]), f"{rec['flop_ratio']:.2f}"]
        row += [speed_cell(rec["points"].get(k), notes, f"`{entry}` {k}", speed["judged"]) for k, _ in cols]
        row += [_peak(rec["points"], "fp32"), _peak(rec["points"], "int8")]
        row += [_cache(rec["points"].get(first))] if caches else []
        row += [_per_flop(rec, first)] if speed["judged"] else []
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if notes:
        lines += ["Measurement errors:", "", *(f"- {n}" for n in notes), ""]
    return lines


def speed_section(
    speeds: list[dict[str, Any]],
    baseline: str,
    claims: list[dict[str, Any]],
    enabled: bool = True,
) -> list[str]:
    """`## Speed` of REPORT.md: for each machine class its table, negative controls and the efficiency claims."""
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
        lines += _intro(speed, baseline) + _table(speed)
        checks = control_checks(speed) if speed["judged"] else []
        lines += negative_controls(checks)
        lines += efficiency_claims(speed, claims, any(check[3] == CONTROL_FAILED for check in checks))
    return lines


# ---------------------------------------------------------------------------------------------- rule tables
def _rounds(speed: dict[str, Any], entry: str, point: str) -> list[float]:
    return (((speed["entries"].get(entry) or {}).get("points") or {}).get(point) or {}).get("rounds") or []


def pair_test(speed: dict[str, Any], system: str, baseline: str, point: str) -> RatioTest | None:
    """The rule's test of `system` against `baseline` at one point of this file (None: not both measured)."""
    return ratio_test(_rounds(speed, system, point), _rounds(speed, baseline, point))


def _ratios_text(test: RatioTest | None) -> str:
    return ", ".join(f"{r:.2f}" for r in test.ratios) if test else "—"


def _interval_text(test: RatioTest | None) -> str:
    """`×1.09 [1.02, 1.17]`: the geometric-mean ratio and its 95 % interval."""
    if test is None:
        return "—"
    if test.n < 2:
        return f"×{test.geo_mean:.2f}"
    lo, hi = test.interval()
    return f"×{test.geo_mean:.2f} [{lo:.2f}, {hi:.2f}]"


def _p_text(p: float | None) -> str:
    return "—" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def judge_speed_claims(
    speed: dict[str, Any], claims: Sequence[dict[str, Any]]
) -> tuple[list[RatioTest | None], list[SpeedJudgement]]:
    """Each claim's test at its point of this file and the rule's verdicts, Holm per source paper (our questions:
    one more family)."""
    tests = [pair_test(speed, c["system"], c["baseline"], c["point"]) for c in claims]
    return tests, judge_claims(tests, [(c["source"] or {}).get("paper", OURS_FAMILY) for c in claims])


def control_checks(speed: dict[str, Any]) -> list[tuple[dict[str, Any], str, RatioTest | None, str, str]]:
    """(control, point, test, status, words) for every negative control of the file at every point it names
    (default: every point its system was measured at)."""
    out = []
    for c in speed.get("controls") or []:
        measured = ((speed["entries"].get(c["system"]) or {}).get("points")) or {}
        for key in c.get("points") or [k for k, _ in _columns(speed) if k in measured]:
            test = pair_test(speed, c["system"], c["baseline"], key)
            out.append((c, key, test, *judge_control(test)))
    return out


def negative_controls(checks: list[tuple[dict[str, Any], str, RatioTest | None, str, str]]) -> list[str]:
    """The negative controls' table, from `control_checks`."""
    if not checks:
        return []
    rows = [
        f"| `{c['system']}` vs `{c['baseline']}` | {c['why']} | {key} | {_ratios_text(test)} | "
        f"{_interval_text(test)} | **{status}**{f' ({words})' if words else ''} |"
        for c, key, test, status, words in checks
    ]
    return [
        "Negative controls — two timings of the same work (the same export twice, or models of identical shapes "
        f"whose weights differ). Expected: the 95 % interval of the ratio within ×{1 / MARGIN:.2f}–×{MARGIN:.2f}, "
        f"the speed rule's margin. A control the rule would call faster or slower (**{CONTROL_FAILED}**) is a "
        "failure of the measurement, not a property of a model: then no speed claim of this file should be "
        "believed, whatever its verdict says. Wider than the margin without failing: timing the same work twice "
        f"reads wider than ±{(MARGIN - 1) * 100:.0f} % on this machine, and claims near the margin stay inconclusive.",
        "",
        "| control | why the work is the same | point | per-round ratios | ratio [95 % interval] | status |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _verdict_text(j: SpeedJudgement) -> str:
    return f"**{j.verdict}**" + (f" ({j.detail})" if j.detail else "")


def efficiency_claims(
    speed: dict[str, Any], claims: Sequence[dict[str, Any]], control_failed: bool = False
) -> list[str]:
    """The papers' efficiency claims on this machine: per-round ratios, the interval, p and Holm p, verdict (for a
    file of an old format: the claims, judged by nothing)."""
    if not claims:
        return []
    tests, judgements = judge_speed_claims(speed, claims)
    if speed["judged"]:
        intro = [f"The papers' efficiency claims on this machine. {RULE_TEXT}", ""]
    else:
        judgements = [SpeedJudgement(NOT_JUDGED) for _ in claims]
        tests = [None for _ in claims]  # their ratios mix speed with output length: not shown as evidence
        intro = ["The papers' efficiency claims: not judged from this file (measured under the old rule).", ""]
    if control_failed:
        intro += ["**A negative control failed on this machine (above): these verdicts are not trustworthy.**", ""]
    lines = [
        *intro,
        "| paper | claim | system vs baseline | point | per-round ratios | ratio [95 % interval] | p | Holm p | "
        "verdict | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, test, j in zip(claims, tests, judgements, strict=True):
        src = c["source"]
        cited = f"{src['paper']}, {src['where']}: “{src['quote']}”" if src else "our question"
        verdict = _verdict_text(j) if speed["judged"] else NOT_JUDGED
        lines.append(
            f"| {c['paper']} | {c['claim']} | `{c['system']}` vs `{c['baseline']}` | {c['point']} | "
            f"{_ratios_text(test)} | {_interval_text(test)} | {_p_text(j.p)} | {_p_text(j.p_holm)} | {verdict} | "
            f"{cited} |"
        )
    return [*lines, ""]


def widest_file(speeds: list[dict[str, Any]]) -> dict[str, Any]:
    """The speed file that times the most entries (ties: the current rule's) — what the README column and the
    quality-vs-speed figure show, as a re-measurement may time only the entries a claim needs."""

    def timed(s: dict[str, Any]) -> int:
        return sum(not rec.get("control_of") for rec in s["entries"].values())

    return max(speeds, key=lambda s: (timed(s), s["judged"]))


def readme_speed_column(speeds: list[dict[str, Any]]) -> tuple[str, dict[str, str]] | None:
    """The README table's speed column: the first fp32 point of `widest_file`, per entry; its header says when
    that file was measured under the old rule."""
    if not speeds:
        return None
    speed = widest_file(speeds)
    key = f"{speed['settings'][0]['name']}/fp32"
    cells = {
        entry: speed_cell(rec["points"].get(key), [], entry, speed["judged"])
        for entry, rec in speed["entries"].items()
        if not rec.get("control_of")
    }
    old = "" if speed["judged"] else "; old rule: each entry its own output lengths"
    return f"{key.replace('/', ' ')} sent/s ({speed['machine']['class']}{old})", cells


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
    "control_checks",
    "efficiency_claims",
    "judge_speed_claims",
    "negative_controls",
    "pair_test",
    "plot_quality_vs_speed",
    "readme_speed_column",
    "settings_text",
    "speed_cell",
    "speed_section",
    "widest_file",
]
