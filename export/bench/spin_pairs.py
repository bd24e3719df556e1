"""Spinning settings side by side in fresh processes: which of the runtime's `spinning` choices decodes one batch
faster, measured as pairs of processes, one per setting, their order alternating — and, with `--baseline-runtime`,
another version of the runtime in the same rounds (settings `baseline:<spinning>`), for settings an in-process A/B
cannot hold ("shared" is one pool for the whole process).

Why processes: a setting is a property of the thread pools of a process's sessions, and two pools spinning in one
process compete for its cores, so one process per setting; why pairs: on a shared virtual machine the speed drifts
by ±10% within minutes, and a pair's two processes see the same drift, so the median of per-pair ratios holds where
one long run per setting would not. Each process also times its encoder runs apart: the encoder runs once per
batch, right after the previous batch's decoder steps, so whether the decoder's threads are still spinning shows there
(results/runtime/fused_attention.md).

    python -m export.bench.spin_pairs --export <dir> --settings false,decoder [--pairs 8] [--calls 20] [--beam 1]
        [--batch 1] [--threads 2] [--fixed-len 30] [--json <report>]
        [--baseline-runtime <checkout> --baseline-export <dir> --settings shared,baseline:false,…]
    python -m export.bench.spin_pairs --table <report> [<report> …]     # the reports as one markdown table
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from export import runtime as runtime_package
from export.bench import rss_probe
from export.bench import table as bench_table
from export.bench.rss_probe import decode_batch
from export.runtime.backend import SPINNING_TEXT, spinning_from_text
from export.runtime.generation import padded

BASELINE = "baseline:"  # a setting's prefix: the baseline runtime, with the spinning choice that follows


def measure(
    runtime: ModuleType, export: str, spinning: str, calls: int, beam: int, batch: int, threads: int, fixed_len: int
) -> dict:
    """One process's timing with `runtime` (export.runtime or another version of it): `calls` generate calls of
    `batch` held-out sentences decoded to `fixed_len` tokens, after 3 untimed ones; per call the wall seconds and the
    encoder's share."""
    model = runtime.load(export, threads=threads, spinning=spinning_from_text(spinning))
    texts = json.loads((Path(export) / "heldout.json").read_text())["src"]
    src = padded(model.encode_texts([texts[i % len(texts)] for i in range(batch)]), model.pad_id)
    search = runtime.Search(beam_size=beam)
    limits = runtime.forced_limits([fixed_len] * batch, model.max_positions)
    encoder_s = [0.0]
    encode = model.backend.encode

    def timed_encode(outputs: list[str], tokens: Any) -> Any:
        start = time.perf_counter()
        try:
            return encode(outputs, tokens)
        finally:
            encoder_s[0] += time.perf_counter() - start

    model.backend.encode = timed_encode  # type: ignore[method-assign]
    for _ in range(3):
        decode_batch(model, src, search, limits)
    encoder_s[0], seconds = 0.0, []
    for _ in range(calls):
        start = time.perf_counter()
        decode_batch(model, src, search, limits)
        seconds.append(time.perf_counter() - start)
    return {"spinning": spinning, "call_s": statistics.median(seconds), "encoder_s": encoder_s[0] / calls}


def child(args: argparse.Namespace) -> dict:
    """A child's measurement: this runtime, or the baseline runtime on its export for a `baseline:` setting."""
    if not args.child.startswith(BASELINE):
        return measure(runtime_package, args.export, args.child, *_work(args))
    runtime = rss_probe.load_runtime_file(args.baseline_runtime, "spin_pairs_baseline_runtime")
    export = args.baseline_export or args.export
    return {**measure(runtime, export, args.child[len(BASELINE) :], *_work(args)), "spinning": args.child}


def _work(args: argparse.Namespace) -> tuple[int, int, int, int, int]:
    return args.calls, args.beam, args.batch, args.threads, args.fixed_len


def check_baseline(args: argparse.Namespace) -> str | None:
    """Why the baseline settings cannot run as given (None if they can): a `baseline:` setting needs
    --baseline-runtime, and both exports must encode one checkpoint, else the ratios compare two models. Resolves
    --baseline-runtime to the runtime itself (a checkout names its export/runtime/)."""
    if not any(s.startswith(BASELINE) for s in args.settings):
        return "--baseline-runtime is given but no setting is baseline:<spinning>" if args.baseline_runtime else None
    if not args.baseline_runtime:
        return "baseline:<spinning> settings need --baseline-runtime (a checkout of the older commit)"
    from export.bench.speed import resolve_runtime  # imports torch: the parent only, never a timed child

    args.baseline_runtime = str(resolve_runtime(args.baseline_runtime))
    sha = [
        json.loads((Path(e) / "manifest.json").read_text()).get("checkpoint", {}).get("sha256")
        for e in (args.export, args.baseline_export or args.export)
    ]
    if sha[0] != sha[1]:
        return f"--export and --baseline-export are exports of different checkpoints ({sha[0]} vs {sha[1]})"
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """`args.pairs` rounds of one child process per setting, the order reversed every other round."""
    settings: list[str] = args.settings
    rounds: list[dict[str, dict]] = []
    for r in range(args.pairs):
        order = settings if r % 2 == 0 else settings[::-1]
        row = {}
        for setting in order:
            child = [sys.executable, "-m", "export.bench.spin_pairs", "--child", setting, *args.passed]
            out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
            row[setting] = json.loads(out.strip().splitlines()[-1])
        rounds.append(row)
        cells = [f"{s} {1e3 * row[s]['call_s']:.1f} ms (encoder {1e3 * row[s]['encoder_s']:.1f})" for s in settings]
        print(" | ".join(cells), flush=True)
    first = settings[0]
    summary = {
        s: {
            "call_ms": 1e3 * statistics.median(row[s]["call_s"] for row in rounds),
            "encoder_ms": 1e3 * statistics.median(row[s]["encoder_s"] for row in rounds),
            f"speed_vs_{first}": statistics.median(row[first]["call_s"] / row[s]["call_s"] for row in rounds),
            f"faster_than_{first}_in": sum(row[s]["call_s"] < row[first]["call_s"] for row in rounds),
        }
        for s in settings
    }
    for s, v in summary.items():
        print(
            f"{s}: median {v['call_ms']:.1f} ms a call (encoder {v['encoder_ms']:.1f}); ×{v[f'speed_vs_{first}']:.3f} "
            f"of {first} (median of per-pair ratios), faster in {v[f'faster_than_{first}_in']} of {len(rounds)} pairs"
        )
    kept = {k: v for k, v in vars(args).items() if k not in ("passed", "json", "table")}
    if args.baseline_runtime:  # which runtime it was, after its checkout is gone
        from export.bench.speed import runtime_sha256

        kept["baseline_runtime_sha256"] = runtime_sha256(Path(args.baseline_runtime))
    return {"args": kept, "machine": bench_table.machine(), "rounds": rounds, **summary}


def point_name(args: dict[str, Any]) -> str:
    """A report's workload as a table row names it: "greedy batch 1 (8 pairs × 20 calls)"."""
    search = "greedy" if args["beam"] == 1 else f"beam {args['beam']}"
    return f"{search} batch {args['batch']} ({args['pairs']} pairs × {args['calls']} calls)"


def table(reports: list[dict[str, Any]]) -> str:
    """Stored reports as one markdown table: a row per report, a column per setting — the first setting's median
    call and encoder times, the others' speed against it (median of per-pair ratios) and in how many pairs faster."""
    settings = list(dict.fromkeys(s for r in reports for s in r["args"]["settings"]))
    machines = sorted({bench_table.cpu_name(r.get("machine", {})) for r in reports})
    lines = [
        f"Rendered by `python -m export.bench.spin_pairs --table` from {len(reports)} reports; "
        f"{'; '.join(machines)}; {reports[0]['args']['threads']} threads, every sentence decoded to "
        f"{reports[0]['args']['fixed_len']} tokens. × = speed against the row's first setting.",
        "",
        "| point | " + " | ".join(settings) + " |",
        "|---|" + "---|" * len(settings),
    ]
    for r in reports:
        first, pairs = r["args"]["settings"][0], len(r["rounds"])
        cells = []
        for s in settings:
            if s not in r:
                cells.append("—")
            elif s == first:
                cells.append(f"{r[s]['call_ms']:.1f} ms (encoder {r[s]['encoder_ms']:.1f})")
            else:
                cells.append(
                    f"×{r[s][f'speed_vs_{first}']:.3f}, faster in {r[s][f'faster_than_{first}_in']} of {pairs} "
                    f"(encoder {r[s]['encoder_ms']:.1f})"
                )
        lines.append(f"| {point_name(r['args'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench.spin_pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", help="export dir (python -m export …)")
    ap.add_argument("--table", nargs="+", metavar="REPORT", help="render stored reports as a markdown table")
    ap.add_argument("--settings", default="false,decoder", type=lambda s: s.split(","), help="spinning choices")
    ap.add_argument("--pairs", type=int, default=8, help="rounds of one process per setting")
    ap.add_argument("--calls", type=int, default=20, help="timed generate calls per process")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixed-len", type=int, default=30, help="output tokens per sentence (eos banned before)")
    ap.add_argument("--baseline-runtime", help="another version's runtime (a checkout, as export.bench takes it)")
    ap.add_argument("--baseline-export", help="the export the baseline runtime reads (default: --export)")
    ap.add_argument("--json", help="write the rounds and the summary here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if bench_table.stored_reports_mode(args, ap, table):
        return
    given = [args.child] if args.child else args.settings
    unknown = [s for s in given if s.removeprefix(BASELINE) not in SPINNING_TEXT]
    if unknown:
        ap.error(f"--settings {unknown}: choose from {list(SPINNING_TEXT)}, each also as {BASELINE}<choice>")
    if args.child:
        print(json.dumps(child(args)))
        return
    problem = check_baseline(args)
    if problem:
        ap.error(problem)
    args.passed = [
        *("--export", args.export, "--calls", str(args.calls), "--beam", str(args.beam)),
        *("--batch", str(args.batch), "--threads", str(args.threads), "--fixed-len", str(args.fixed_len)),
        *(("--baseline-runtime", args.baseline_runtime) if args.baseline_runtime else ()),
        *(("--baseline-export", args.baseline_export) if args.baseline_export else ()),
    ]
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
