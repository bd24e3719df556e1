"""Speed results: `results/<suite>/speed-<machine>.json`, one file per machine class, never mixed.

The file holds every timed round as measured (sentences/s and peak RSS per entry, setting and precision, and the
served point per entry); the render derives medians and the per-round ratio to the suite's baseline from them,
so a reader can recompute every number shown. Reading is strict: a file of another suite or format, or without
the baseline, stops the render with a one-line error naming the file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import median
from typing import Any

from zoo.errors import ZooError

SPEED_FORMAT = 1
SPEED_FILE = re.compile(r"^speed-(?P<machine>[a-z0-9-]+)\.json$")
PRECISIONS = ("fp32", "int8")


class SpeedResultsError(ZooError):
    """A speed file that cannot be read as this suite's; the message names the file and the fix."""


def machine_slug(machine_class: str) -> str:
    """`cpu:AMD EPYC` → `cpu-amd-epyc`: the file name part of a machine class."""
    return re.sub(r"[^a-z0-9]+", "-", machine_class.lower()).strip("-") or "unknown"


def speed_path(results_dir: Path, machine_class: str) -> Path:
    return results_dir / f"speed-{machine_slug(machine_class)}.json"


def write_speed(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"format": SPEED_FORMAT, **data}, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_speed_files(results_dir: Path, suite_name: str, baseline: str) -> list[dict[str, Any]]:
    """Every speed file of the suite, sorted by name, each checked (SpeedResultsError naming the file)."""
    out = []
    for path in sorted(results_dir.glob("speed-*.json")):
        if not SPEED_FILE.match(path.name):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpeedResultsError(f"{path}: not readable JSON ({exc}); re-run stages=[speed]") from exc
        if data.get("format") != SPEED_FORMAT or data.get("suite") != suite_name:
            raise SpeedResultsError(
                f"{path}: format {data.get('format')!r} of suite {data.get('suite')!r}, expected format "
                f"{SPEED_FORMAT} of suite {suite_name!r}; re-run python -m zoo.report +suite={suite_name} "
                "stages=[speed]"
            )
        if baseline not in data.get("entries", {}):
            raise SpeedResultsError(f"{path}: no measurement of the baseline {baseline!r}; re-run stages=[speed]")
        out.append({**data, "file": path.name})
    return out


def round_ratios(values: list[float], base: list[float]) -> list[float]:
    """Per-round ratios system ÷ baseline (both lists in round order); none unless both have every round."""
    if len(values) != len(base):
        return []
    return [v / b for v, b in zip(values, base, strict=True) if b > 0]


def point_summary(rounds: list[float], base_rounds: list[float] | None) -> dict[str, Any]:
    """Median sentences/s over rounds and the per-round ratios to the baseline's same round."""
    out: dict[str, Any] = {"rounds": rounds, "median": median(rounds) if rounds else None}
    ratios = round_ratios(rounds, base_rounds or [])
    if ratios:
        out |= {"ratios": ratios, "ratio": median(ratios)}
    return out


def speed_verdict(ratios: list[float]) -> str:
    """An efficiency claim ("system is faster than baseline") from per-round ratios: it holds when the system was
    faster in every round, does not hold when slower in every round; too few rounds or disagreeing rounds are
    inconclusive (the rounds are interleaved, so a machine-wide slowdown hits both sides of a ratio)."""
    if len(ratios) < 3:
        return "incomplete (fewer than 3 rounds)"
    if all(r > 1.0 for r in ratios):
        return "holds"
    if all(r < 1.0 for r in ratios):
        return "does not hold"
    return "inconclusive"


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """One speed file → per entry and point (`<setting>/<precision>`, `served`): median sent/s, per-round ratios
    to the baseline, peak RSS (median over rounds), and measured speed-up ÷ FLOP ratio."""
    baseline = data["entries"][data["baseline"]]
    entries: dict[str, Any] = {}
    for entry, rec in data["entries"].items():
        points: dict[str, Any] = {}
        for key, point in rec.get("points", {}).items():
            if point.get("error"):
                points[key] = {"error": point["error"]}
                continue
            base = baseline.get("points", {}).get(key, {})
            summary = point_summary(point["sentences_per_s"], base.get("sentences_per_s"))
            summary["peak_rss_mb"] = median(point["peak_rss_mb"]) if point.get("peak_rss_mb") else None
            points[key] = summary
        served = rec.get("served")
        if served and not served.get("error"):
            base = baseline.get("served") or {}
            points["served"] = point_summary(served["sentences_per_s"], base.get("sentences_per_s"))
        elif served:
            points["served"] = {"error": served["error"]}
        flops = rec["size"]["flops"] / baseline["size"]["flops"]
        entries[entry] = {"points": points, "size": rec["size"], "flop_ratio": flops}
    return {
        "file": data["file"],
        "machine": data["machine"],
        "measured": data.get("measured"),
        "git_sha": data.get("git_sha"),
        "seed": data["seed"],
        "sentences": data["sentences"],
        "threads": data.get("threads"),
        "rounds": data["rounds"],
        "baseline": data["baseline"],
        "settings": data["settings"],
        "served_settings": data.get("served_settings"),
        "entries": entries,
    }


__all__ = [
    "PRECISIONS",
    "SPEED_FORMAT",
    "SpeedResultsError",
    "machine_slug",
    "point_summary",
    "read_speed_files",
    "round_ratios",
    "speed_path",
    "speed_verdict",
    "summarize",
    "write_speed",
]
