"""Spinning settings side by side in fresh processes: which of the runtime's `spinning` choices decodes one batch
faster, measured as pairs of processes, one per setting, their order alternating.

Why processes: a setting is a property of the thread pools of a process's sessions, and two pools spinning in one
process compete for its cores, so one process per setting; why pairs: on a shared virtual machine the speed drifts
by ±10% within minutes, and a pair's two processes see the same drift, so the median of per-pair ratios holds where
one long run per setting would not. Each process also times its encoder runs apart: the encoder runs once per
batch, right after the previous batch's decoder steps, so whether the decoder's threads are still spinning shows there
(results/runtime/fused_attention.md).

    python -m export.bench.spin_pairs --export <dir> --settings false,decoder [--pairs 8] [--calls 20] [--beam 1]
        [--batch 1] [--threads 2] [--fixed-len 30] [--json <report>]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from export.runtime import Search, forced_limits, load
from export.runtime.backend import SPINNING_TEXT, spinning_from_text


def measure(export: str, spinning: str, calls: int, beam: int, batch: int, threads: int, fixed_len: int) -> dict:
    """One process's timing: `calls` generate calls of `batch` held-out sentences decoded to `fixed_len` tokens,
    after 3 untimed ones; per call the wall seconds and the encoder's share."""
    model = load(export, threads=threads, spinning=spinning_from_text(spinning))
    texts = json.loads((Path(export) / "heldout.json").read_text())["src"]
    src = model.pad(model.encode_texts([texts[i % len(texts)] for i in range(batch)]))
    search, limits = Search(beam_size=beam), forced_limits([fixed_len] * batch, model.max_positions)
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
        model.generate(src, search, limits)
    encoder_s[0], seconds = 0.0, []
    for _ in range(calls):
        start = time.perf_counter()
        model.generate(src, search, limits)
        seconds.append(time.perf_counter() - start)
    return {"spinning": spinning, "call_s": statistics.median(seconds), "encoder_s": encoder_s[0] / calls}


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
    return {"args": {k: v for k, v in vars(args).items() if k not in ("passed", "json")}, "rounds": rounds, **summary}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench.spin_pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True, help="export dir (python -m export …)")
    ap.add_argument("--settings", default="false,decoder", type=lambda s: s.split(","), help="spinning choices")
    ap.add_argument("--pairs", type=int, default=8, help="rounds of one process per setting")
    ap.add_argument("--calls", type=int, default=20, help="timed generate calls per process")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixed-len", type=int, default=30, help="output tokens per sentence (eos banned before)")
    ap.add_argument("--json", help="write the rounds and the summary here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [s for s in ([args.child] if args.child else args.settings) if s not in SPINNING_TEXT]
    if unknown:
        ap.error(f"--settings {unknown}: choose from {list(SPINNING_TEXT)}")
    if args.child:
        result = measure(args.export, args.child, args.calls, args.beam, args.batch, args.threads, args.fixed_len)
        print(json.dumps(result))
        return
    args.passed = [
        *("--export", args.export, "--calls", str(args.calls), "--beam", str(args.beam)),
        *("--batch", str(args.batch), "--threads", str(args.threads), "--fixed-len", str(args.fixed_len)),
    ]
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
