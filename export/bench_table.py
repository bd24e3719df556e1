"""The runtime's memory and speed table, rendered from a stored `python -m export.bench --baseline-runtime … --json`
report.

    python -m export.bench_table results/runtime/<report>.json            # print the table
    python -m export.bench_table results/runtime/<report>.json --readme   # rewrite results/runtime/README.md's block

Why: a published number is the render of a stored measurement, never typed (zoo/DESIGN.md §3b'). The block between
`<!-- bench:runtime -->` and `<!-- /bench:runtime -->` in results/runtime/README.md (beside the reports it is
rendered from) is this module's output for the report it names, and tests/test_results.py checks that it still is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "results" / "runtime" / "README.md"
BLOCK = "bench:runtime"
KINDS = (("fp32", "ort", "ort-baseline"), ("INT8", "int8", "int8-baseline"))
TARGETS_MB = {"fp32": 450, "int8": 330}  # issue 23: peak RSS of a fresh process at the headline point
TARGET_RATIO = 1.25


def machine() -> dict[str, Any]:
    """The CPU a report was measured on (ratios and RSS move with it: an AVX2 EPYC and an AVX-512 Xeon gave the
    same change 1.19× and 1.23×), from /proc/cpuinfo where there is one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count()}


def interleaved_rounds(
    plan: Sequence[Hashable], measure: Callable[[Any], dict[str, Any]], rounds: int
) -> dict[Any, list[dict[str, Any]]]:
    """Every key of `plan` measured once per round, each round starting one key further along the plan (so no
    key always runs first or right after the same one); the measurements per key, in round order."""
    taken: dict[Any, list[dict[str, Any]]] = {key: [] for key in plan}
    for r in range(rounds):
        shift = r % len(plan)
        for key in [*plan[shift:], *plan[:shift]]:
            taken[key].append(measure(key))
            print(f"round {r + 1}: {key} {taken[key][-1]}", flush=True)
    return taken


def paired_ratio(baseline_times: Sequence[float], times: Sequence[float]) -> float:
    """The median over rounds of baseline time / engine time, each round's two runs side by side. On a VM
    whose speed drifts by ±10% within minutes, a round's two runs share its speed where the two medians need
    not: the ratio of medians (`ratio`) is the headline number, this one says how far drift moved it."""
    return statistics.median(b / t for b, t in zip(baseline_times, times, strict=True))


def _ratio(point: dict[str, Any], engine: str) -> str:
    pair = next((p for p in point["pairs"] if p["engine"] == engine), None)
    if pair is None:
        return "—"
    engines = point["engines"]
    paired = paired_ratio(engines[pair["baseline"]]["times_s"], engines[engine]["times_s"])
    return f"{pair['ratio']:.2f}× (paired {paired:.2f}×; {pair['identical']}/{point['sentences']} same)"


def _memory(report: dict[str, Any], kind: str) -> str:
    entry = report.get("memory", {}).get(kind)
    if not entry:
        return "—"
    engines = entry["engines"]
    new, old = engines["ort"], engines.get("ort-baseline")
    text = f"{new['peak_mb']:.0f} MB" if old is None else f"{old['peak_mb']:.0f} → {new['peak_mb']:.0f} MB"
    return text + f" (after loading {new['after_load_mb']:.0f})"


def render(report: dict[str, Any], source: str) -> str:
    """Markdown: the machine and settings, then per point the new/baseline speed ratio of the fp32 and INT8
    runtimes (with how many hypotheses were the same), then the fresh-process peak RSS."""
    machine = report.get("machine", {})
    baseline = report.get("baseline_runtime") or {}
    head = report["headline"]["label"]
    lines = [
        f"Rendered by `python -m export.bench_table {source}` from that report: "
        f"{machine.get('cpu', 'CPU not recorded')}, {machine.get('cores', '?')} cores, {report['threads']} threads, "
        f"medians of {report['repeats']} interleaved rounds (the headline {report['headline']['rounds']}); "
        f"baseline: the runtime with sha256 {baseline.get('sha256', '?')[:12]} on its own export.",
        "",
        "| new / baseline runtime | fp32 | INT8 |",
        "|---|---|---|",
    ]
    for point in report["points"]:
        label = point["label"].removeprefix("headline: ")
        if label == head.removeprefix("headline: "):
            label = f"**{label} × {report['fixed_len']} tokens** (target ≥ {TARGET_RATIO})"
        lines.append(f"| {label} | {_ratio(point, 'ort')} | {_ratio(point, 'int8')} |")
    memory = report.get("memory", {})
    if memory:
        lines.append(
            f"| peak RSS, fresh process, beam {memory['beam']} × batch {memory['batch']} × {memory['fixed_len']} "
            f"tokens (target {TARGETS_MB['fp32']} / {TARGETS_MB['int8']} MB) | {_memory(report, 'fp32')} | "
            f"{_memory(report, 'int8')} |"
        )
    return "\n".join(lines) + "\n"


def write_block(block: str, name: str, sources: str) -> None:
    """Put a rendered `block` between README's `name` markers, and say so."""
    text = README.read_text(encoding="utf-8")
    README.write_text(replace_block(text, block, name), encoding="utf-8")
    print(f"{README}: {name} block rendered from {sources}")


def _pattern(name: str) -> re.Pattern[str]:
    name = re.escape(name)
    return re.compile(rf"(^<!-- {name} -->\n)(.*?)(^<!-- /{name} -->$)", re.DOTALL | re.MULTILINE)


def read_block(text: str, name: str = BLOCK) -> str:
    match = _pattern(name).search(text)
    if match is None:
        raise ValueError(f"the text has no block <!-- {name} --> … <!-- /{name} -->: add the two marker lines")
    return match.group(2)


def replace_block(text: str, block: str, name: str = BLOCK) -> str:
    read_block(text, name)
    return _pattern(name).sub(lambda m: m.group(1) + block + m.group(3), text, count=1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="an export.bench --json report made with --baseline-runtime")
    ap.add_argument(
        "--readme", action="store_true", help="rewrite results/runtime/README.md's bench:runtime block with the table"
    )
    args = ap.parse_args(argv)
    path = Path(args.report)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        table = render(report, args.report)
    except (OSError, ValueError, KeyError) as exc:
        sys.exit(f"cannot render {path}: {exc!r}; give a report written by `python -m export.bench ... --json`")
    if not args.readme:
        print(table, end="")
        return
    text = README.read_text(encoding="utf-8")
    try:
        README.write_text(replace_block(text, table), encoding="utf-8")
    except ValueError as exc:
        sys.exit(str(exc))
    print(f"{README}: {BLOCK} block rendered from {path}")


if __name__ == "__main__":
    main()
