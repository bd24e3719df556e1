"""Speed results: `results/<suite>/speed-<machine>.json`, one file per machine class, never mixed.

The file holds every timed round as measured (sentences/s and peak RSS per entry, setting and precision, and the
served point per entry); the render derives medians and the per-round ratios to the suite's baseline from them,
so a reader can recompute every number shown. Reading is strict: a file of another suite or an unknown format,
or without the baseline, stops the render with a one-line error naming the file.

Format 2 (issue 60): every entry decodes the baseline's forced lengths (each point stores the digest of the
lengths it decoded), rounds default to 5, the baseline is timed twice (`<baseline>@control`, an A/A control), the
machine names its CPU family, and `controls` lists the negative controls. Format 1 — each entry decoded its own
record's lengths, 3 rounds, CPU family unrecorded — is still read and shown, but judged by no verdict
(`summarize` marks it `judged: False`): its ratios mix speed with output length.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from statistics import median
from typing import Any

from zoo.errors import ZooError

SPEED_FORMAT = 2
OLD_FORMATS = (1,)  # read and shown, never judged (module docstring)
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


def _check(path: Path, data: dict[str, Any], suite_name: str, baseline: str) -> None:
    """SpeedResultsError naming the file when it is not a readable speed file of this suite."""
    fmt = data.get("format")
    if fmt not in (SPEED_FORMAT, *OLD_FORMATS) or data.get("suite") != suite_name:
        raise SpeedResultsError(
            f"{path}: format {fmt!r} of suite {data.get('suite')!r}, expected format {SPEED_FORMAT} (or "
            f"{', '.join(map(str, OLD_FORMATS))}) of suite {suite_name!r}; re-run python -m zoo.report "
            f"+suite={suite_name} stages=[speed]"
        )
    if baseline not in data.get("entries", {}):
        raise SpeedResultsError(f"{path}: no measurement of the baseline {baseline!r}; re-run stages=[speed]")
    if fmt == SPEED_FORMAT and "cpu_signature" not in data.get("machine", {}):
        raise SpeedResultsError(f"{path}: format {fmt} without machine.cpu_signature; re-run stages=[speed]")


def read_speed_files(results_dir: Path, suite_name: str, baseline: str) -> list[dict[str, Any]]:
    """Every speed file of the suite, each checked (SpeedResultsError naming the file): files of the current
    format first (the README column and the figure take the first), then by name."""
    out = []
    for path in sorted(results_dir.glob("speed-*.json")):
        if not SPEED_FILE.match(path.name):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpeedResultsError(f"{path}: not readable JSON ({exc}); re-run stages=[speed]") from exc
        _check(path, data, suite_name, baseline)
        out.append({**data, "file": path.name})
    return sorted(out, key=lambda d: (d["format"] != SPEED_FORMAT, d["file"]))


def geo_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def point_summary(
    rounds: list[float], base_rounds: list[float] | None, tokens_per_sentence: float | None = None
) -> dict[str, Any]:
    """Median sentences/s over rounds (and tokens/s when the output tokens are known), the per-round ratios to
    the baseline's same round and their geometric mean."""
    out: dict[str, Any] = {"rounds": rounds, "median": median(rounds) if rounds else None}
    if rounds and tokens_per_sentence:
        out["tokens_per_s"] = out["median"] * tokens_per_sentence
    base = base_rounds or []
    if rounds and len(rounds) == len(base) and min(*rounds, *base) > 0:
        ratios = [v / b for v, b in zip(rounds, base, strict=True)]
        out |= {"ratios": ratios, "ratio": geo_mean(ratios)}
    return out


def _points(rec: dict[str, Any], baseline: dict[str, Any], sentences: int) -> dict[str, Any]:
    """Per point (`<setting>/<precision>`, `served`) of one entry: its summary, or its error."""
    points: dict[str, Any] = {}
    for key, point in rec.get("points", {}).items():
        if point.get("error"):
            points[key] = {"error": point["error"]}
            continue
        base = baseline.get("points", {}).get(key, {})
        per_sentence = point["output_tokens"] / sentences if point.get("output_tokens") else None
        summary = point_summary(point["sentences_per_s"], base.get("sentences_per_s"), per_sentence)
        summary["peak_rss_mb"] = median(point["peak_rss_mb"]) if point.get("peak_rss_mb") else None
        summary["output_tokens"] = point.get("output_tokens")
        summary["cache_kb"] = point.get("cache_kb")  # files before it lack the key
        points[key] = summary
    served = rec.get("served")
    if served and not served.get("error"):
        base = baseline.get("served") or {}
        points["served"] = point_summary(served["sentences_per_s"], base.get("sentences_per_s"))
    elif served:
        points["served"] = {"error": served["error"]}
    return points


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """One speed file → per entry and point: median sent/s (and tokens/s), per-round ratios to the baseline and
    their geometric mean, peak RSS (median over rounds), and the FLOP ratio; `judged` says whether the file's
    measurements may carry verdicts (format 2) or are shown only (format 1)."""
    baseline = data["entries"][data["baseline"]]
    entries: dict[str, Any] = {}
    for entry, rec in data["entries"].items():
        entries[entry] = {
            "points": _points(rec, baseline, data["sentences"]),
            "size": rec["size"],
            "flop_ratio": rec["size"]["flops"] / baseline["size"]["flops"],
            "control_of": rec.get("control_of"),
        }
    return {
        "file": data["file"],
        "suite": data["suite"],
        "format": data["format"],
        "judged": data["format"] == SPEED_FORMAT,
        "machine": data["machine"],
        "measured": data.get("measured"),
        "git_sha": data.get("git_sha"),
        "seed": data["seed"],
        "sentences": data["sentences"],
        "threads": data.get("threads"),
        "rounds": data["rounds"],
        "baseline": data["baseline"],
        "workload": data.get("workload"),
        "settings": data["settings"],
        "served_settings": data.get("served_settings"),
        "controls": data.get("controls") or [],
        "entries": entries,
    }


def workload_mismatches(points: Mapping[str, Mapping[str, Mapping[str, Any]]], baseline: str) -> list[str]:
    """`entry point` for every measured point whose decoded lengths (their digest) differ from the baseline's
    at the same point: a ratio between them would mix speed with output length."""
    base = points.get(baseline) or {}
    bad = []
    for entry, by_key in points.items():
        for key, point in by_key.items():
            ref = base.get(key) or {}
            if "error" in point or "error" in ref or not ref:  # nothing to compare (the error is shown)
                continue
            if point.get("lengths_sha256") != ref.get("lengths_sha256"):
                bad.append(f"{entry} {key}")
    return bad


__all__ = [
    "OLD_FORMATS",
    "PRECISIONS",
    "SPEED_FORMAT",
    "SpeedResultsError",
    "geo_mean",
    "machine_slug",
    "point_summary",
    "read_speed_files",
    "speed_path",
    "summarize",
    "workload_mismatches",
    "write_speed",
]
