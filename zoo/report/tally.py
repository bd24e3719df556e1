"""How many claims have a verdict, and which: the counts results/README.md states per table, and its status block
per paper.

Counted from the same numbers the report renders (quality verdicts from `collect_claims`, speed verdicts from the
current-rule speed file), stored in report.json as `verdict_counts`, and written as one line by `counts_text` —
the one home of that line, so a test can hold results/README.md to the rendered reports. `status_table` counts
every suite's quality claims per paper, the verdicts reached by runs that had stopped climbing apart from those
reached while they still climbed (issue 86: a 1.1-epoch snapshot is not an answer); the render stage rewrites it
in results/README.md whenever a report.json changes.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from zoo.report.records import RecordError
from zoo.report.render_speed import judge_speed_claims
from zoo.report.stats import FAILS, HOLDS, INCONCLUSIVE

KINDS = (HOLDS, FAILS, INCONCLUSIVE, "untested")


def _kind(kind: str | None) -> str:
    return kind or "untested"  # too few seeds / rounds, not measured


def verdict_counts(data: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{"quality": {kind: n}, "speed": {kind: n}} over the suite's claims; speed counts only a file of the current
    rule (an old-rule file judges nothing: its claims count as untested)."""
    quality = Counter(_kind(c["verdict"]["kind"]) for c in data.get("claims") or [])
    claims = data.get("speed_claims") or []
    current = next((s for s in data.get("speed") or [] if s.get("judged")), None)
    if current is None:
        speed = Counter({"untested": len(claims)}) if claims else Counter()
    else:
        speed = Counter(_kind(j.kind) for j in judge_speed_claims(current, claims)[1])
    return {name: {k: n[k] for k in KINDS} for name, n in (("quality", quality), ("speed", speed))}


def counts_text(counts: dict[str, dict[str, int]]) -> str:
    """`quality 5 hold, 0 do not hold, 4 inconclusive, 6 untested; speed —`: one table cell."""

    def one(n: dict[str, int]) -> str:
        if not sum(n.values()):
            return "—"
        return f"{n[HOLDS]} hold, {n[FAILS]} do not hold, {n[INCONCLUSIVE]} inconclusive, {n['untested']} untested"

    return f"quality {one(counts['quality'])}; speed {one(counts['speed'])}"


STATUS_BLOCK = "status"  # results/README.md's generated block: <!-- results:status --> … <!-- /results:status -->
OURS = "ours"


def status_counts(reports: dict[str, dict[str, Any]]) -> dict[str, Counter]:
    """Per paper (our own questions apart), over every suite's report.json: its quality claims that hold / do not
    hold with no run still climbing (`settled`), those that hold / do not hold while runs still climbed
    (`climbing`), inconclusive, untested."""
    counts: dict[str, Counter] = {}
    for data in reports.values():
        for claim in data.get("claims") or []:
            kind = _kind(claim["verdict"]["kind"])
            if kind in (HOLDS, FAILS):
                kind += " (climbing)" if (claim.get("state") or {}).get("climbing") else " (settled)"
            counts.setdefault(claim["paper"], Counter())[kind] += 1
    return dict(sorted(counts.items(), key=lambda item: (item[0] == OURS, item[0])))


def status_table(reports: dict[str, dict[str, Any]]) -> str:
    """The markdown of results/README.md's status block (read_reports gives `reports`)."""
    columns = [f"{HOLDS} (settled)", f"{FAILS} (settled)", f"{HOLDS} (climbing)", f"{FAILS} (climbing)"]
    columns += [INCONCLUSIVE, "untested"]
    lines = [
        "| paper | " + " | ".join(columns) + " | suites |",
        "|---|" + "---:|" * len(columns) + "---|",
    ]
    for paper, n in status_counts(reports).items():
        suites = sorted(
            name for name, data in reports.items() if any(c["paper"] == paper for c in data.get("claims") or [])
        )
        shown = "our own questions" if paper == OURS else paper
        cells = [str(n[c]) for c in columns]
        lines.append(f"| {shown} | " + " | ".join(cells) + " | " + ", ".join(f"`{s}`" for s in suites) + " |")
    return "\n".join(lines) + "\n"


def read_reports(results_root: Path) -> dict[str, dict[str, Any]]:
    """Every suite's report.json under `results_root`, by suite directory name; one written before verdicts were
    stored as fields (issue 87) is refused with the command that rewrites it."""
    reports = {p.parent.name: json.loads(p.read_text()) for p in sorted(results_root.glob("*/report.json"))}
    for name, data in reports.items():
        if any(not isinstance(c.get("verdict"), dict) for c in data.get("claims") or []):
            raise RecordError(
                f"{results_root / name / 'report.json'} stores its verdicts as words (an older format); re-render "
                f"every results dir: python -m zoo.devtools.render_all {results_root}"
            )
    return reports


__all__ = ["KINDS", "STATUS_BLOCK", "counts_text", "read_reports", "status_counts", "status_table", "verdict_counts"]
