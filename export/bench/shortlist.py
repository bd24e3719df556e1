"""A vocabulary shortlist's cost and gain: BLEU/chrF with and without it (paired bootstrap), the candidate-set
sizes, how many of the full search's tokens it holds, and sentences/s at the four standard points.

    python -m export.bench.shortlist --export exports/transformer-deen --src test.de --ref test.en
        [--rounds 3] [--sentences-b1 48] [--sentences-b32 256] [--quality-sentences N] [--json report.json]
    python -m export.bench.shortlist --render results/runtime/<report>.json   # results/runtime/README.md's block

The export must carry a shortlist (`python -m export … shortlist.build=true`). Quality: the whole `--src` translated
with the export's own search (beam 5 unless it says otherwise), shortlist=0 against shortlist=1, sacreBLEU's paired
bootstrap on BLEU, chrF beside it. Speed: every sentence decoded to its reference's token length (the same work with
and without the shortlist, and a model's output length that random-init weights would not give), a fresh process
per measurement (peak RSS = its VmHWM), the two modes and the points interleaved, medians of the rounds and the
median per-round ratio shortlist / full.
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

import numpy as np

import export
from export.bench import table as bench_table
from export.bench.rss_probe import vm_hwm
from export.runtime import ExportedModel, generation
from export.runtime.generation import padded
from export.runtime.search import forced_limits, length_batches
from zoo.metrics import corpus_chrf, paired_bootstrap

POINTS = {"greedy_b1": (1, 1), "greedy_b32": (1, 32), "beam5_b1": (5, 1), "beam5_b32": (5, 32)}
MODES = {"full": 0, "shortlist": 1}
BLOCK = "bench:shortlist"  # in results/runtime/README.md (bench_table.README)


def _lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def _work(model: ExportedModel, args: argparse.Namespace, batch: int) -> tuple[list[list[int]], list[int]]:
    """The sources a point decodes (one warm-up batch first) and each one's output length: its reference's."""
    count = args.sentences_b1 if batch == 1 else args.sentences_b32
    sources = model.encode_texts(_lines(args.src)[: count + batch])
    lengths = [len(t) for t in model.encode_targets(_lines(args.ref)[: count + batch])]
    return sources, lengths


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One mode at one point: decode, time, report."""
    beam, batch = POINTS[args.point]
    model = export.load(args.export)
    sources, lengths = _work(model, args, batch)
    search = model.search_settings(beam_size=beam, shortlist=MODES[args.mode])

    def decode(part: slice) -> None:
        limits = forced_limits(lengths[part], model.max_positions)
        generation.run(model, generation.prepare(model, sources[part], search, limits=limits), search, None, batch)

    decode(slice(0, batch))  # sessions and allocator warm-up, untimed
    start = time.perf_counter()
    decode(slice(batch, None))
    seconds = time.perf_counter() - start
    return {
        "sentences": len(sources) - batch,
        "seconds": round(seconds, 3),
        "sentences_per_s": round((len(sources) - batch) / seconds, 2),
        "peak_rss_mb": round(vm_hwm() / 2**20, 1),
    }


def _measure(args: argparse.Namespace, mode: str, point: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "export.bench.shortlist", "--child", "--export", args.export]
    cmd += ["--src", args.src, "--ref", args.ref, "--mode", mode, "--point", point]
    cmd += ["--sentences-b1", str(args.sentences_b1), "--sentences-b32", str(args.sentences_b32)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:])} failed: {proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def candidate_sizes(model: ExportedModel, sources: list[list[int]], batch: int) -> dict[str, float]:
    """Token ids a step scores with the shortlist, over the length-sorted batches `translate` would make."""
    sizes = []
    for idx in length_batches([len(s) for s in sources], model.max_tokens, batch):
        src = padded([sources[i] for i in idx], model.pad_id)
        rows = model.candidates(src, model.search_settings(shortlist=1))
        assert rows is not None
        sizes.append(len(rows))
    return {"median": float(statistics.median(sizes)), "mean": round(float(np.mean(sizes)), 1), "max": max(sizes)}


def coverage(model: ExportedModel, sources: list[list[int]], outputs: list[list[int]]) -> float:
    """The share of the full search's output tokens that each sentence's own shortlist (batch 1) holds."""
    held = total = 0
    for src, out in zip(sources, outputs, strict=True):
        rows = model.candidates(padded([src], model.pad_id), model.search_settings(shortlist=1))
        assert rows is not None
        held += int(np.isin(out, rows).sum())
        total += len(out)
    return round(held / max(total, 1), 4)


def quality(model: ExportedModel, args: argparse.Namespace) -> dict[str, Any]:
    """Both modes' translations of the quality sentences with the export's search; BLEU test and chrF."""
    sources, refs = _lines(args.src), _lines(args.ref)
    if args.quality_sentences:
        sources, refs = sources[: args.quality_sentences], refs[: args.quality_sentences]
    full = model.translate(sources, shortlist=0, num_hypotheses=1)
    short = model.translate(sources, shortlist=1, num_hypotheses=1)
    full_text, short_text = [h[0].text for h in full], [h[0].text for h in short]
    test = paired_bootstrap(full_text, short_text, refs)
    return {
        "sentences": len(sources),
        "beam_size": model.search.beam_size,
        "bleu": {"full": round(test["baseline"]["bleu"], 2), "shortlist": round(test["system"]["bleu"], 2)},
        "p_value": round(test["p_value"], 4),
        "chrf": {"full": round(corpus_chrf(full_text, refs), 2), "shortlist": round(corpus_chrf(short_text, refs), 2)},
        "changed": sum(a != b for a, b in zip(full_text, short_text, strict=True)),
        "coverage": coverage(model, model.encode_texts(sources), [h[0].tokens for h in full]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = export.load(args.export)
    if model.shortlist is None:
        raise SystemExit(f"{args.export} has no shortlist; export it with `python -m export … shortlist.build=true`")
    report_quality = quality(model, args) if not args.no_quality else None
    print(f"quality: {report_quality}", flush=True)
    encoded = model.encode_texts(_lines(args.src))
    sizes = {"batch1": candidate_sizes(model, encoded, 1), "batch32": candidate_sizes(model, encoded, 32)}
    plan = [(mode, point) for point in POINTS for mode in MODES]
    taken = bench_table.interleaved_rounds(plan, lambda key: _measure(args, *key), args.rounds)
    points: dict[str, Any] = {}
    for point in POINTS:
        full, short = taken["full", point], taken["shortlist", point]
        ratios = [s["sentences_per_s"] / f["sentences_per_s"] for s, f in zip(short, full, strict=True)]
        points[point] = {
            mode: {
                "sentences_per_s": [t["sentences_per_s"] for t in taken[mode, point]],
                "median_sentences_per_s": statistics.median(t["sentences_per_s"] for t in taken[mode, point]),
                "peak_rss_mb": max(t["peak_rss_mb"] for t in taken[mode, point]),
            }
            for mode in MODES
        }
        points[point]["ratio"] = round(statistics.median(ratios), 3)
    manifest = model.manifest
    cfg = manifest["model_config"]
    return {
        "export": args.export,
        "model": {
            "name": manifest["name"],
            "params": manifest["size"]["after"]["params"],
            "layers": [cfg["encoder_layers"], cfg["decoder_layers"]],
            "d_model": cfg["d_model"],
            "vocab": manifest["vocab"]["size"],
            "quantized": manifest["quantized"],
        },
        "shortlist": manifest["shortlist"],
        "machine": bench_table.machine(),
        "onnxruntime": metadata.version("onnxruntime"),
        "rounds": args.rounds,
        "sentences": {"batch1": args.sentences_b1, "batch32": args.sentences_b32},
        "quality": report_quality,
        "candidates": sizes,
        "points": points,
    }


def render(reports: list[tuple[dict[str, Any], str]]) -> str:
    """Stored reports as README markdown: per export its shortlist, quality cost and speed table."""
    parts = []
    for report, source in reports:
        m, mo, s = report["machine"], report["model"], report["shortlist"]
        kind = "INT8" if mo["quantized"] else "fp32"
        parts.append(
            f"**`{mo['name']}`** ({kind}, {mo['params'] / 1e6:.1f}M params: {mo['layers'][0]}+{mo['layers'][1]} "
            f"layers, d_model {mo['d_model']}, vocabulary {mo['vocab']:,}); shortlist counted on {s['built_from']} "
            f"({s['pairs']:,} pairs): {s['per_source_token']} targets per source token, {s['frequent']} frequent. "
            f"{bench_table.cpu_name(m)}, {m['cores']} cores; "
            f"rendered by `python -m export.bench.shortlist --render {source}`.\n\n"
            + _quality_line(report["quality"])
            + _sizes_line(report["candidates"], mo["vocab"])
            + speed_table(report)
            + "\n"
        )
    return "\n".join(parts)


def _quality_line(q: dict[str, Any] | None) -> str:
    if q is None:
        return "Quality not measured: random-init weights (speed and candidate sizes are what they are for).\n\n"
    return (
        f"Test BLEU {q['bleu']['full']} → {q['bleu']['shortlist']} with the shortlist (paired bootstrap p = "
        f"{q['p_value']}), chrF {q['chrf']['full']} → {q['chrf']['shortlist']}, beam {q['beam_size']}, "
        f"{q['sentences']} sentences, {q['changed']} outputs changed; each sentence's shortlist holds "
        f"{q['coverage']:.1%} of the full search's output tokens.\n\n"
    )


def _sizes_line(sizes: dict[str, dict[str, float]], vocab: int) -> str:
    c1, c32 = sizes["batch1"], sizes["batch32"]
    return (
        f"Token ids a step scores with the shortlist, of {vocab:,}: median {c1['median']:.0f} (max {c1['max']}) per "
        f"sentence at batch 1, {c32['median']:.0f} (max {c32['max']}) per batch of 32.\n\n"
    )


def speed_table(report: dict[str, Any]) -> str:
    head = "| point | full sent/s · peak MB | shortlist sent/s · peak MB | × (per-round median) |"
    rows = [head, "|---|---|---|---|"]
    for point in POINTS:
        p = report["points"][point]
        cells = [f"{p[m]['median_sentences_per_s']:.1f} · {p[m]['peak_rss_mb']:.0f}" for m in MODES]
        rows.append(f"| {point} | " + " | ".join(cells) + f" | ×{p['ratio']:.2f} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export.bench.shortlist", description=__doc__.split("\n")[0])
    parser.add_argument("--export", help="export directory (built with shortlist.build=true)")
    parser.add_argument("--src", help="source sentences, one per line")
    parser.add_argument("--ref", help="their references (quality, and each sentence's decoded length)")
    parser.add_argument("--render", nargs="+", metavar="REPORT", help="rewrite results/runtime/README.md's block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences-b1", type=int, default=48, help="sentences timed at batch 1")
    parser.add_argument("--sentences-b32", type=int, default=256, help="sentences timed at batch 32")
    parser.add_argument("--quality-sentences", type=int, help="translate only the first N for quality (default all)")
    parser.add_argument("--no-quality", action="store_true", help="skip quality (random-init weights)")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--point", choices=list(POINTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    if args.render:
        reports = list(zip(bench_table.read_reports(parser, args.render), args.render, strict=True))
        bench_table.write_block(render(reports), BLOCK, ", ".join(args.render))
        return 0
    if not (args.export and args.src and args.ref):
        parser.error("--export, --src and --ref are needed to measure (or give --render REPORT …)")
    bench_table.check_export(parser, args.export, src=args.src, ref=args.ref)
    report = run(args)
    print(speed_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
