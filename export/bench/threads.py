"""Throughput mode against one search: sentences/s and peak memory of `export.load(dir, inter_threads=N,
intra_threads=M)` for several (N, M), at the four standard points (greedy and beam 5, batch 1 and 32).

    python -m export.bench.threads --export exports/transformer-deen --src test.de [--configs 1x2,2x1]
        [--rounds 3] [--fixed-len 30] [--sentences-b1 48] [--sentences-b32 256] [--json report.json]
    python -m export.bench.threads --render results/runtime/<report>.json   # results/runtime/README.md's block

Every measurement runs in a fresh process (so its peak resident set, VmHWM, is that configuration's alone), decoding
the first sentences of `--src` through `translate_encoded_nbest` — the path that hands batches to the copies — each
to exactly `--fixed-len` tokens, so every configuration does the same work. Configurations and points are
interleaved, rounds repeated; the report gives medians and, per point, the median of each round's ratio to the
first configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import export
from export.bench import table as bench_table
from export.bench.rss_probe import vm_hwm
from export.runtime import generation
from export.runtime.search import forced_limits

POINTS = {"greedy_b1": (1, 1), "greedy_b32": (1, 32), "beam5_b1": (5, 1), "beam5_b32": (5, 32)}
BLOCK = "bench:threads"  # in results/runtime/README.md (bench_table.README)


def _config(text: str) -> tuple[int, int]:
    inter, _, intra = text.partition("x")
    try:
        return int(inter), int(intra)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give INTERxINTRA, e.g. 2x1") from None


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration at one point: decode, time, report."""
    inter, intra = args.config
    beam, batch = POINTS[args.point]
    model = export.load(args.export, inter_threads=inter, intra_threads=intra)
    texts = Path(args.src).read_text(encoding="utf-8").splitlines()
    count = args.sentences_b1 if batch == 1 else args.sentences_b32
    encoded = model.encode_texts(texts[: count + batch])
    warm, timed = encoded[:batch], encoded[batch:]
    search = model.search_settings(beam_size=beam)

    def decode(part: list[list[int]]) -> None:
        limits = forced_limits([args.fixed_len] * len(part), model.max_positions)
        generation.run(model, generation.prepare(model, part, search, limits=limits), search, None, batch)

    decode(warm)  # sessions and allocator warm-up, untimed
    start = time.perf_counter()
    decode(timed)
    seconds = time.perf_counter() - start
    return {
        "sentences": len(timed),
        "seconds": round(seconds, 3),
        "sentences_per_s": round(len(timed) / seconds, 2),
        "peak_rss_mb": round(vm_hwm() / 2**20, 1),
    }


def _measure(args: argparse.Namespace, config: tuple[int, int], point: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "export.bench.threads", "--child", "--export", args.export, "--src", args.src]
    cmd += ["--config", f"{config[0]}x{config[1]}", "--point", point, "--fixed-len", str(args.fixed_len)]
    cmd += ["--sentences-b1", str(args.sentences_b1), "--sentences-b32", str(args.sentences_b32)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:])} failed: {proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    configs = [tuple(c) for c in args.configs]
    plan = [(c, p) for c in configs for p in POINTS]
    taken = bench_table.interleaved_rounds(plan, lambda key: _measure(args, *key), args.rounds)
    base = configs[0]
    points: dict[str, Any] = {}
    for point in POINTS:
        for config in configs:
            runs = taken[config, point]
            ratios = [
                a["sentences_per_s"] / b["sentences_per_s"] for a, b in zip(runs, taken[base, point], strict=True)
            ]
            points[f"{point}/{config[0]}x{config[1]}"] = {
                "sentences_per_s": [t["sentences_per_s"] for t in runs],
                "median_sentences_per_s": statistics.median(t["sentences_per_s"] for t in runs),
                "ratio_to_first": round(statistics.median(ratios), 3),
                "peak_rss_mb": max(t["peak_rss_mb"] for t in runs),
            }
    manifest = json.loads((Path(args.export) / "manifest.json").read_text(encoding="utf-8"))
    cfg = manifest["model_config"]
    return {
        "export": args.export,
        "model": {
            "name": manifest["name"],
            "params": manifest["size"]["after"]["params"],
            "layers": [cfg["encoder_layers"], cfg["decoder_layers"]],
            "d_model": cfg["d_model"],
            "vocab": manifest["vocab"]["size"],
        },
        "machine": bench_table.machine(),
        "onnxruntime": metadata.version("onnxruntime"),
        "configs": [f"{c[0]}x{c[1]}" for c in configs],
        "rounds": args.rounds,
        "fixed_len": args.fixed_len,
        "sentences": {"batch1": args.sentences_b1, "batch32": args.sentences_b32},
        "points": points,
    }


def render(report: dict[str, Any], source: str) -> str:
    """The stored report as README markdown: where and how it was measured, then the table."""
    m, mo = report["machine"], report["model"]
    return (
        f"Rendered by `python -m export.bench.threads --render {source}`: {bench_table.cpu_name(m)}, "
        f"{m['cores']} cores; "
        f"`{mo['name']}` ({mo['params'] / 1e6:.1f}M params: {mo['layers'][0]}+{mo['layers'][1]} layers, d_model "
        f"{mo['d_model']}, vocabulary {mo['vocab']:,}); every sentence decoded to {report['fixed_len']} tokens "
        f"({report['sentences']['batch1']} sentences at batch 1, {report['sentences']['batch32']} at batch 32), "
        f"a fresh process per measurement, medians of {report['rounds']} interleaved rounds; × = median per-round "
        f"ratio to {report['configs'][0]} (inter × intra threads); peak MB = the process's VmHWM.\n\n"
        + table(report)
        + "\n"
    )


def table(report: dict[str, Any]) -> str:
    configs = report["configs"]
    head = "| point | " + " | ".join(f"{c} sent/s (× {configs[0]}) · peak MB" for c in configs) + " |"
    rows = [head, "|---|" + "---|" * len(configs)]
    for point in POINTS:
        cells = []
        for c in configs:
            p = report["points"][f"{point}/{c}"]
            cells.append(f"{p['median_sentences_per_s']:.1f} (×{p['ratio_to_first']:.2f}) · {p['peak_rss_mb']:.0f}")
        rows.append(f"| {point} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export.bench.threads", description=__doc__.split("\n")[0])
    parser.add_argument("--export", help="export directory")
    parser.add_argument("--src", help="source sentences, one per line")
    parser.add_argument("--render", metavar="REPORT", help="rewrite results/runtime/README.md's block from a report")
    parser.add_argument("--configs", type=lambda s: [_config(c) for c in s.split(",")], default=[(1, 2), (2, 1)])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fixed-len", type=int, default=30, help="output tokens of every sentence")
    parser.add_argument("--sentences-b1", type=int, default=48, help="sentences timed at batch 1")
    parser.add_argument("--sentences-b32", type=int, default=256, help="sentences timed at batch 32")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", type=_config, help=argparse.SUPPRESS)
    parser.add_argument("--point", choices=list(POINTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    if args.render:
        block = render(bench_table.read_reports(parser, [args.render])[0], args.render)
        bench_table.write_block(block, BLOCK, args.render)
        return 0
    if not args.export or not args.src:
        parser.error("--export and --src are needed to measure (or give --render REPORT)")
    bench_table.check_export(parser, args.export, src=args.src)
    report = run(args)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
