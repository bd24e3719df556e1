"""Kernels per decoder step: how many operator kernels onnxruntime runs for one step of an export's decoder, and
which kinds they are — the count issue 65 asks to bring from 359 to ≤ 150 at fp32.

    python -m export.bench.kernels --export exports/transformer-deen [--steps 12] [--beam 1] [--batch 1] [--threads 2]

Why from a profile rather than the graph file: onnxruntime's own optimizer fuses nodes when the session is made, so
only its profiler (one `*_kernel_time` event per kernel run, inside each `model_run`) says what a step executes.
The search decodes the export's first `--batch` held-out sentences (repeated where it holds fewer) with their length
forced to `--steps` tokens (every step a decoder run); the count is the median over those runs, with the kernels of
each operator type and their share of the kernel time — at many rows, where a step's time goes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from export.bench import table as bench_table
from export.runtime import ExportedModel, ExportRuntimeError, OrtBackend, Search, forced_limits, read_manifest
from export.runtime.generation import padded, search_batch
from zoo.errors import one_line_errors

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})  # kernels whose time is their subgraph's kernels


def kernels_per_step(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """An onnxruntime profile (its JSON events) → kernels per run (median over the runs) and, over all runs, kernel
    runs and time per operator type. A kernel is a `Node` event named `<node>_kernel_time`. A control-flow kernel's
    time (an If's) holds its branch's kernels, which the profile times on their own: it is left out of the total
    every share is taken of, so its share is what its branch took."""
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    kernels = [e for e in trace if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    per_run = [sum(1 for k in kernels if r["ts"] <= k["ts"] <= r["ts"] + r["dur"]) for r in runs]
    by_op: Counter[str] = Counter(k.get("args", {}).get("op_name", "?") for k in kernels)
    time_by_op: Counter[str] = Counter()
    for k in kernels:
        time_by_op[k.get("args", {}).get("op_name", "?")] += int(k.get("dur", 0))
    total = sum(t for op, t in time_by_op.items() if op not in CONTROL_FLOW) or 1
    return {
        "runs": len(runs),
        "kernels_per_run": statistics.median(per_run) if per_run else 0,
        "per_run": per_run,
        "by_op": {
            op: {"kernels_per_run": n / max(len(runs), 1), "time_share": time_by_op[op] / total}
            for op, n in by_op.most_common()
        },
    }


def profile(export: str, steps: int, beam: int, threads: int, batch: int = 1) -> dict[str, Any]:
    """Decode `batch` held-out sentences for exactly `steps` tokens with the profiler on; the decoder's kernel
    counts."""
    directory = Path(export)
    manifest = read_manifest(directory)
    with tempfile.TemporaryDirectory() as tmp:
        backend = OrtBackend(directory, manifest, threads, profile_prefix=str(Path(tmp) / "profile"))
        model = ExportedModel(directory, manifest, backend)
        texts = json.loads((directory / "heldout.json").read_text())["src"]
        src = padded(model.encode_texts([texts[i % len(texts)] for i in range(batch)]), model.pad_id)
        search_batch(model, src, Search(beam_size=beam), forced_limits([steps] * batch, model.max_positions))
        trace = json.loads(Path(backend.decoder.end_profiling()).read_text())
        backend.encoder.end_profiling()
    return {
        "export": export,
        "steps": steps,
        "beam": beam,
        "batch": batch,
        "threads": threads,
        **kernels_per_step(trace),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench.kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True, help="export dir (python -m export …)")
    ap.add_argument("--steps", type=int, default=12, help="decoder steps profiled (the output length forced)")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1, help="sentences decoded together")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args(argv)
    bench_table.check_export(ap, args.export)
    if min(args.steps, args.beam, args.batch, args.threads) < 1:
        ap.error("--steps, --beam, --batch and --threads must be at least 1")
    with one_line_errors(ExportRuntimeError):
        report = profile(args.export, args.steps, args.beam, args.threads, args.batch)
    print(f"{args.export}: {report['kernels_per_run']:.0f} kernels per decoder step (median of {report['runs']} runs)")
    for op, entry in list(report["by_op"].items())[:12]:
        print(f"  {op:28s} {entry['kernels_per_run']:6.1f} per step  {100 * entry['time_share']:5.1f}% of kernel time")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
