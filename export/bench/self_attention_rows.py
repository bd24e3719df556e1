"""`python -m export.bench.self_attention_rows --export <dir>`: the decoder's fused self-attention kernel against the
same attention written out, at each number of rows a step decodes — the measurement that places the export's
crossover (export/self_attention_by_rows.py `FUSED_MOST_ROWS`: the kernel up to that many rows).

The export's own decoder graph twice, its crossover constant set so that one copy always takes the kernel and the
other never does (nothing else differs: same weights, same file), both loaded in this one process. Per round and
row count R, each copy decodes R held-out sentences greedily, every one forced to `--steps` tokens — one untimed
call, then the timed ones — the copies' order alternating from round to round; the per-round ratio written/kernel
cancels the drift of a shared machine. Both copies must emit the same tokens (else it stops). Reported per R: each
copy's median milliseconds a step, the median of the per-round ratios (> 1: the kernel is faster) and every ratio.

    python -m export.bench.self_attention_rows --export <dir> [--rows 1,2,4,8,16,32,64,160] [--rounds 7]
        [--steps 30] [--threads 2] [--json <report>]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

import export
from export.runtime.generation import best_tokens, padded, search_batch
from export.self_attention_by_rows import CONDITION
from zoo.machine import cpu_signature

ALWAYS = {"kernel": 2**31 - 1, "written": 0}  # the crossover constant of each copy


def with_crossover(directory: Path, out: Path, most: int) -> Path:
    """A copy of the export at `out` (files linked, the decoder graph rewritten) whose decoder takes the fused kernel
    up to `most` rows. Loaded with check_files=False: its decoder graph no longer matches the manifest's digest."""
    graph_file = json.loads((directory / "manifest.json").read_text())["graphs"]["decoder"]["file"]
    out.mkdir(parents=True)
    for path in directory.iterdir():
        if path.name == graph_file:
            continue
        if path.stat().st_dev == out.stat().st_dev:  # a link where it can be: the weights are large
            os.link(path, out / path.name)
        else:
            shutil.copy(path, out)
    graph = onnx.load(str(directory / graph_file), load_external_data=False)
    constants = [n for n in graph.graph.node if n.op_type == "Constant" and n.output[0] == CONDITION + ".most"]
    if len(constants) != 1:
        raise SystemExit(
            f"error: {directory} has no fused self-attention chosen by rows; export it with this checkout's "
            "`python -m export` (fused_attention=all, the default)"
        )
    value = constants[0].attribute[0]
    value.t.CopyFrom(numpy_helper.from_array(np.array([most], dtype=np.int64), value.t.name))
    onnx.save_model(graph, str(out / graph_file))
    return out


def measure(directory: Path, rows: list[int], rounds: int, steps: int, threads: int) -> dict[str, Any]:
    """The report (module docstring) for one export."""
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        models = {
            name: export.load(with_crossover(directory, Path(tmp) / name, most), threads=threads, check_files=False)
            for name, most in ALWAYS.items()
        }
        texts = json.loads((directory / "heldout.json").read_text())["src"]
        some = models["kernel"]
        ids = some.encode_texts([texts[i % len(texts)] for i in range(max(rows))])
        search = export.Search(beam_size=1, shortlist=0)

        def decode(name: str, r: int) -> list[list[int]]:
            limits = export.runtime.forced_limits([steps] * r, some.max_positions)
            return best_tokens(search_batch(models[name], padded(ids[:r], some.pad_id), search, limits))

        for r in rows:
            if decode("kernel", r) != decode("written", r):
                raise SystemExit(f"error: the kernel and the written-out attention emitted other tokens at {r} rows")
        ms: dict[str, dict[int, list[float]]] = {name: {r: [] for r in rows} for name in models}
        for round_index in range(rounds):
            order = list(models) if round_index % 2 == 0 else list(models)[::-1]
            for r in rows:
                calls = max(1, 16 // r)
                for name in order:
                    decode(name, r)  # untimed: the first call at a new size grows the arena
                    start = time.perf_counter()
                    for _ in range(calls):
                        decode(name, r)
                    ms[name][r].append((time.perf_counter() - start) / calls / steps * 1000)
    per_rows = {}
    for r in rows:
        ratios = [w / k for w, k in zip(ms["written"][r], ms["kernel"][r], strict=True)]
        per_rows[str(r)] = {
            "kernel_ms_per_step": round(statistics.median(ms["kernel"][r]), 3),
            "written_ms_per_step": round(statistics.median(ms["written"][r]), 3),
            "written_over_kernel": round(statistics.median(ratios), 3),
            "per_round": [round(x, 3) for x in ratios],
        }
    decoder = json.loads((directory / "manifest.json").read_text())["graphs"]["decoder"]
    return {
        "export": directory.name,
        "export_kernel_rows": decoder.get("self_attention_kernel_rows"),  # where the export itself crosses over
        "cpu": cpu_signature(),
        "threads": threads,
        "rounds": rounds,
        "steps": steps,
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m export.bench.self_attention_rows " + " ".join(sys.argv[1:]),
        "per_rows": per_rows,
    }


def render(report: dict[str, Any]) -> str:
    """The report as a markdown table, a row per row count."""
    lines = [
        f"{report['cpu']}, {report['threads']} threads, greedy, {report['steps']} forced steps, medians of "
        f"{report['rounds']} interleaved rounds ({report['export']}, which runs the kernel up to "
        f"{report['export_kernel_rows']} rows)",
        "",
        "| rows | kernel ms/step | written-out ms/step | written/kernel | per round |",
        "|---:|---:|---:|---:|---|",
    ]
    for r, row in report["per_rows"].items():
        lines.append(
            f"| {r} | {row['kernel_ms_per_step']:.2f} | {row['written_ms_per_step']:.2f} | "
            f"{row['written_over_kernel']:.2f} | {', '.join(f'{x:.2f}' for x in row['per_round'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m export.bench.self_attention_rows", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--export", type=Path, required=True, help="an export made with fused_attention=all")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64,160", help="row counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30, help="tokens every sentence is forced to")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    try:
        rows = sorted({int(r) for r in args.rows.split(",")})
    except ValueError:
        parser.error(f"--rows takes whole numbers separated by commas, not {args.rows!r}")
    if rows[0] < 1 or args.rounds < 1 or args.steps < 1 or args.threads < 1:
        parser.error("--rows, --rounds, --steps and --threads must be at least 1")
    if not (args.export / "manifest.json").is_file():
        parser.error(
            f"{args.export} is not an export (no manifest.json); make one with python -m export checkpoint=<run>"
        )
    report = measure(args.export.resolve(), rows, args.rounds, args.steps, args.threads)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(render(report))


if __name__ == "__main__":
    main()
