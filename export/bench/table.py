"""The runtime's tables, rendered from a stored `python -m export.bench … --json` report: memory and speed against a
baseline runtime (a report made with `--baseline-runtime`), or with `--limits` efficiency against the machine's own
limits (a report made with `--roofline`).

    python -m export.bench.table results/runtime/<report>.json [--limits]            # print the table
    python -m export.bench.table results/runtime/<report>.json [--limits] --readme   # rewrite README.md's block

Why: a published number is the render of a stored measurement, never typed (zoo/DESIGN.md §3b'). The block between
`<!-- bench:runtime -->` and `<!-- /bench:runtime -->` (`bench:limits` for `--limits`) in results/runtime/README.md
(beside the reports it is rendered from) is this module's output for the report it names, and tests/test_results.py
checks that it still is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from export.runtime import ExportRuntimeError, read_manifest
from zoo.machine import cpu_model, cpu_signature

README = Path(__file__).resolve().parents[2] / "results" / "runtime" / "README.md"
BLOCK = "bench:runtime"
LIMITS_BLOCK = "bench:limits"
KINDS = (("fp32", "ort", "ort-baseline"), ("INT8", "int8", "int8-baseline"))
TARGETS_MB = {"fp32": 450, "int8": 330}  # issue 23: peak RSS of a fresh process at the headline point
TARGET_RATIO = 1.25


def machine() -> dict[str, Any]:
    """The CPU a report was measured on (ratios and RSS move with it: an AVX2 EPYC and an AVX-512 Xeon gave the
    same change 1.19× and 1.23×): its name and its family, model and ISA (zoo.machine), and its cores."""
    return {"cpu": cpu_model(), "signature": cpu_signature(), "cores": os.cpu_count()}


def cpu_name(machine: dict[str, Any]) -> str:
    """The CPU as a table names it: its name, and its family, model and ISA where the report recorded them."""
    name = machine.get("cpu", "CPU not recorded")
    return f"{name} ({machine['signature']})" if machine.get("signature") else name


def read_reports(parser: argparse.ArgumentParser, paths: Sequence[str]) -> list[dict[str, Any]]:
    """Stored bench reports (JSON files), or the command's usage error naming the file that is missing or not
    JSON — not a traceback."""
    reports = []
    for path in paths:
        try:
            reports.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else f"not JSON ({exc})"
            parser.error(f"{path}: {reason}; give a report the command wrote with --json")
    return reports


def check_export(parser: argparse.ArgumentParser, directory: str, **files: str | None) -> None:
    """The usage error with the runtime's reason when `directory` is not a loadable export, or when one of `files`
    (flag name → path, e.g. src=…) is not a file — before anything is measured or any child process started."""
    try:
        read_manifest(directory, check_files=False)  # its files' checksums: when the runtime loads it
    except ExportRuntimeError as exc:
        parser.error(f"--export {directory}: {exc}")
    for flag, path in files.items():
        if path is not None and not Path(path).is_file():
            parser.error(f"--{flag} {path}: no such file")


def stored_reports_mode(
    args: argparse.Namespace, parser: argparse.ArgumentParser, render: Callable[[list[dict[str, Any]]], str]
) -> bool:
    """A bench command's `--table REPORT …` mode: print `render` of the stored reports and say so (True); without
    it the command measures, so --export is required and must be an export — argparse errors naming the fix."""
    if args.table:
        try:
            print(render(read_reports(parser, args.table)))
        except (KeyError, TypeError, IndexError) as exc:
            parser.error(f"--table {' '.join(args.table)}: not this command's reports (no {exc}); give ones it wrote")
        return True
    if not args.export:
        parser.error("--export is required (or --table to render stored reports)")
    check_export(parser, args.export)
    return False


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
        f"Rendered by `python -m export.bench.table {source}` from that report: "
        f"{cpu_name(machine)}, {machine.get('cores', '?')} cores, {report['threads']} threads, "
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


def render_state(report: dict[str, Any], source: str) -> str:
    """Markdown: per point the host-owned decoding state (engine ort) against the device-resident one (ort-device),
    sentences/s and their ratio with the hypotheses' agreement — what backend.py's DEFAULT_STATE was chosen by."""
    machine = report.get("machine", {})
    lines = [
        f"Rendered by `python -m export.bench.table {source} --state` from that report: {cpu_name(machine)}, "
        f"{machine.get('cores', '?')} cores, {report['threads']} threads, medians of {report['repeats']} interleaved "
        f"rounds (the headline {report['headline']['rounds']}); fixed points produce {report['fixed_len']} tokens.",
        "",
        "| point | state=host sent/s | state=device sent/s | device / host |",
        "|---|---|---|---|",
    ]
    for point in report["points"]:
        engines = point["engines"]
        lines.append(
            f"| {point['label'].removeprefix('headline: ')} | {engines['ort']['sentences_per_s']:.1f} | "
            f"{engines['ort-device']['sentences_per_s']:.1f} | {_ratio(point, 'ort-device')} |"
        )
    return "\n".join(lines) + "\n"


def render_latency(report: dict[str, Any], source: str) -> str:
    """Markdown: per batch-1 point and engine the per-sentence latency a caller decoding one sentence at a time sees,
    p50 / p90 over every timed round (points.latency_percentiles), beside sentences/s."""
    machine = report.get("machine", {})
    lines = [
        f"Rendered by `python -m export.bench.table {source} --latency` from that report: {cpu_name(machine)}, "
        f"{machine.get('cores', '?')} cores, {report['threads']} threads, {report['repeats']} interleaved rounds; "
        "latency = wall time of one sentence's `generate` call.",
        "",
        "| point | engine | sent/s | p50 ms | p90 ms | sentences timed |",
        "|---|---|---|---|---|---|",
    ]
    for point in report["points"]:
        for name, engine in point["engines"].items():
            latency = engine.get("latency_s")
            if latency is None:
                continue
            lines.append(
                f"| {point['label'].removeprefix('headline: ')} | {name} | {engine['sentences_per_s']:.1f} | "
                f"{1e3 * latency['p50']:.1f} | {1e3 * latency['p90']:.1f} | {latency['n']} |"
            )
    if len(lines) == 4:
        raise ValueError("no batch-1 point with per-sentence latencies (reports made before they were recorded)")
    return "\n".join(lines) + "\n"


def _limits_cells(engine: dict[str, Any] | None) -> tuple[str, str]:
    """A point's arithmetic cell (matmul GFLOP/s achieved / their roofline = share) and memory cell (batch 1:
    weight GB/s = share of the read bandwidth; fp32 also the rate of the step's matmuls alone, and the share of the
    measured time they would take)."""
    if engine is None:
        return "—", "—"
    arithmetic = "—"
    if "efficiency" in engine:
        share = f"**{100 * engine['efficiency']:.0f}%**"
        arithmetic = f"{engine['matmul_gflops_per_s']:.0f} / {engine['roofline_gflops']:.0f} = {share}"
    memory = "—"
    if "bandwidth_fraction" in engine:
        memory = f"{engine['weight_gb_per_s']:.1f} GB/s = **{100 * engine['bandwidth_fraction']:.0f}%**"
    if "stream_fraction" in engine:
        memory += f"; matmuls alone {engine['stream_gb_per_s']:.1f} GB/s: **{100 * engine['stream_fraction']:.0f}%**"
    return arithmetic, memory


def _kernel_summary(limits: dict[str, Any]) -> str:
    kernels = limits.get("kernels_s", {})
    faster = sum(1 for t in kernels.values() if t["onnxruntime"] < t["torch"])
    return f"onnxruntime's MatMul was the faster kernel on {faster} of {len(kernels)} shapes"


def _stream_summary(limits: dict[str, Any]) -> str:
    """The batch-1 step's matmuls alone (roofline.py `step_stream_seconds`), where the report timed them."""
    streams = limits.get("step_stream_s", [])
    return "".join(
        f"; one batch-1 step's matmuls alone, back to back: {1e3 * s['seconds']:.2f} ms for "
        f"{s['weight_bytes'] / 1e6:.0f} MB of weights ({s['weight_bytes'] / s['seconds'] / 1e9:.1f} GB/s)"
        for s in streams
    )


def render_limits(report: dict[str, Any], source: str) -> str:
    """Markdown: where and how it was measured, then per fixed-length point the fp32 and INT8 sentences/s, the
    fp32 search's matmuls against their roofline, and at batch 1 the weights read against the memory bandwidth."""
    machine, model, limits = report.get("machine", {}), report["model"], report["limits"]
    weights = report.get("memory", {}).get("fp32", {}).get("weights", {})
    params = f"{weights['unique_params'] / 1e6:.1f}M params, " if weights.get("unique_params") else ""
    lines = [
        f"Rendered by `python -m export.bench.table {source} --limits` from that report: "
        f"{cpu_name(machine)}, {machine.get('cores', '?')} cores, {report['threads']} threads; "
        f"{params}{model['encoder_layers']}+{model['decoder_layers']} layers, d_model {model['d_model']}, FFN "
        f"{model['ffn_dim']}, vocabulary {model['vocab_size']:,}; every sentence decoded to its length limit "
        f"{report['fixed_len']} (eos banned before), medians of {report['repeats']} interleaved rounds. Limits "
        f"measured in the same run: the matmul roofline is the faster of torch.mm and onnxruntime's MatMul on each "
        f"of the search's own shapes ({_kernel_summary(limits)}; 1024³: "
        f"{report['matmul_roofline_gflops']:.0f} GFLOP/s); read bandwidth {limits['read_bandwidth_gbps']:.1f} GB/s"
        f"{_stream_summary(limits)}.",
        "",
        "| fixed-length point | fp32 sent/s | fp32 matmul GFLOP/s / roofline | fp32 weights at batch 1 "
        "| INT8 sent/s (× fp32) | INT8 weights at batch 1 |",
        "|---|---|---|---|---|---|",
    ]
    for point in report["points"]:
        if point.get("mode") != "fixed" or point["label"].startswith("headline"):
            continue
        fp32, int8 = point["engines"].get("ort"), point["engines"].get("int8")
        arithmetic, memory = _limits_cells(fp32)
        _, int8_memory = _limits_cells(int8)
        speed = f"{fp32['sentences_per_s']:.1f}" if fp32 else "—"
        int8_speed = "—"
        if int8 is not None and fp32 is not None:
            int8_speed = f"{int8['sentences_per_s']:.1f} (×{int8['sentences_per_s'] / fp32['sentences_per_s']:.2f})"
        label = point["label"].removeprefix("fixed ")
        lines.append(f"| {label} | {speed} | {arithmetic} | {memory} | {int8_speed} | {int8_memory} |")
    memory = report.get("memory", {})
    if memory.get("fp32"):
        rss = " · ".join(
            f"{kind} {memory[kind]['engines']['ort']['peak_mb']:.0f} MB"
            for kind in ("fp32", "int8")
            if memory.get(kind)
        )
        lines += [
            "",
            f"Peak RSS of a fresh torch-free process, beam {memory['beam']} × batch {memory['batch']} × "
            f"{memory['fixed_len']} tokens: {rss}.",
        ]
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
    ap = argparse.ArgumentParser(prog="python -m export.bench.table", description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="an export.bench --json report made with --baseline-runtime (or --roofline)")
    ap.add_argument("--limits", action="store_true", help="the machine-limits table of a --roofline report")
    ap.add_argument(
        "--state", action="store_true", help="the host vs device decoding-state table of a --device-state report"
    )
    ap.add_argument("--latency", action="store_true", help="per-sentence p50 / p90 latency of the batch-1 points")
    ap.add_argument("--readme", action="store_true", help="rewrite results/runtime/README.md's block with the table")
    args = ap.parse_args(argv)
    path = Path(args.report)
    renderer, block = (render_limits, LIMITS_BLOCK) if args.limits else (render, BLOCK)
    if args.state:
        renderer = render_state
    if args.latency:
        renderer = render_latency
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        table = renderer(report, args.report)
    except (OSError, ValueError, KeyError) as exc:
        made = "--roofline" if args.limits else "--baseline-runtime"
        sys.exit(f"cannot render {path}: {exc!r}; give a report written by `python -m export.bench {made} … --json`")
    if not args.readme:
        print(table, end="")
        return
    try:
        write_block(table, block, args.report)
    except ValueError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    main()
