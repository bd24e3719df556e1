"""Decoding speed of the ORT runtime against our own PyTorch generator on the same checkpoint.

    python -m export.bench --checkpoint runs/transformer-deen/<ts> --export exports/transformer-deen \
        [--pruned-export exports/transformer-deen-pruned] [--int8-export exports/transformer-deen-int8] \
        [--threads 1] [--repeats 5] [--batches 1,32,256] [--searches greedy,beam5] [--fixed-len 20] \
        [--json bench.json]

Why this shape (DESIGN.md §3c): the baseline is our best torch path — `zoo.generate` with the
incremental cache, the same beam size, batch and thread count — and the two engines run
interleaved (torch, ORT, ORT, torch, …) on identical pre-tokenised, length-sorted batches, so
drift hits both; we report medians and ratios. Both engines get the same token ids and must return
the same hypotheses (the agreement is reported next to every number).

Points: greedy and beam 5 × batch 1/32/256 in the natural mode (each sentence stops at eos) and a
fixed-length mode (eos banned until `--fixed-len`, then forced: equal work for both engines, and the
only mode where analytic FLOPs describe the work exactly), plus the GHT paper's speed setting (beam
5, batch 256, at most 10 output tokens). With `--pruned-export`, pruned vs unpruned speed (torch and
ORT) next to the analytic FLOP ratio of the same work. Achieved GFLOP/s are set against a measured
fp32 matmul roofline (torch.mm at the same thread count). Peak memory is the rise of the process's
peak RSS (VmHWM, reset through /proc/self/clear_refs) over its RSS before one run of the point.
With `--int8-export`, BLEU of fp32 vs INT8 ORT on the test split (paired bootstrap).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.graph import ExportError
from export.pruning import prune
from export.runtime import ExportedModel, ExportRuntimeError, Search, load
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.data import build_splits
from zoo.errors import one_line_errors
from zoo.flops import model_flops
from zoo.generate import SearchConfig, generate
from zoo.metrics import paired_bootstrap
from zoo.model import Transformer

TARGETS = {("greedy", 1): 1.5, ("beam5", 32): 1.2}  # ORT / torch sentences-per-second, natural mode


# ---------------------------------------------------------------------------------------------- memory
def _status(field: str) -> int:
    """A /proc/self/status value in bytes (0 where /proc is unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_rise(fn: Callable[[], Any]) -> int | None:
    """Bytes the peak RSS rose above the current RSS while `fn` ran (None if it cannot be reset)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return None
    base = _status("VmRSS")
    fn()
    return max(0, _status("VmHWM") - base)


# ---------------------------------------------------------------------------------------------- work
def load_sentences(payload: dict[str, Any], path: str | None, n: int) -> tuple[list[str], list[str] | None]:
    """Source sentences (and references when known): a file, else the checkpoint's test split,
    else its held-out sentences repeated."""
    if path:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        return (lines * (n // max(len(lines), 1) + 1))[:n], None
    try:
        test = build_splits(payload["data_config"]).test
        if test:
            reps = n // len(test) + 1  # a small test set is repeated to fill the largest batch
            return [e.src for e in test] * reps, [e.tgt for e in test] * reps
    except Exception as exc:  # corpus not available here: fall back to the held-out sample
        print(f"(test split unavailable: {exc}; using the checkpoint's held-out sentences)")
    held = payload["heldout"]["src"]
    return (held * (n // len(held) + 1))[:n], None


def make_batches(runtime: ExportedModel, texts: list[str], batch: int, count: int) -> list[np.ndarray]:
    """`count` sentences, sorted by length (as evaluation buckets them), in padded batches of `batch`."""
    ids = runtime.encode_texts(texts[:count])
    ids.sort(key=len)
    return [runtime.pad(ids[i : i + batch]) for i in range(0, len(ids), batch)]


def work_flops(model: Transformer, batches: list[np.ndarray], out_len: int, beam: int, pad: int) -> int:
    """Analytic FLOPs (zoo.flops conventions) of decoding every sentence to exactly `out_len`
    tokens with `beam` rows: encoder once, decoder and vocabulary projection per beam row. Padding
    and the incremental path's half-triangle self-attention are not modelled."""
    total = 0
    for src in batches:
        for n in (src != pad).sum(1).tolist():
            f = model_flops(model, src_len=max(1, n), tgt_len=out_len)
            total += f["encoder"] + beam * (f["decoder"] + f["output_proj"])
    return total


def matmul_roofline(threads: int, size: int = 1024, repeats: int = 5) -> float:
    """Measured fp32 GFLOP/s of torch.mm on [size, size] @ [size, size] at `threads` threads."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times) / 1e9


# ---------------------------------------------------------------------------------------------- timing
def interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Run every fn `repeats` times, alternating the order each round; wall seconds per call."""
    names = list(fns)
    for name in names:  # warm-up (allocators, ORT's first-run planning)
        fns[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def _searches(spec: str, fixed_len: int | None) -> Search:
    beam = 1 if spec == "greedy" else int(spec.removeprefix("beam"))
    if fixed_len:
        return Search(beam_size=beam, max_len_a=0.0, max_len_b=fixed_len, min_len=fixed_len)
    return Search(beam_size=beam)


def bench_point(
    label: str,
    engines: dict[str, tuple[str, Any]],
    batches: list[np.ndarray],
    search: Search,
    repeats: int,
    flops_models: dict[str, Transformer] | None = None,
    out_len: int | None = None,
    pad: int = 0,
) -> dict[str, Any]:
    """Time engines {name: ("torch", model) | ("ort", runtime)} on the same batches and search."""
    torch_search = SearchConfig(**asdict(search))
    tensors = [torch.from_numpy(b) for b in batches]
    results: dict[str, list[list[int]]] = {}

    def runner(name: str, kind: str, engine: Any) -> Callable[[], None]:
        def run() -> None:
            if kind == "torch":
                results[name] = [h for src in tensors for h in generate(engine, src, torch_search)]
            else:
                results[name] = [h for src in batches for h in engine.generate(src, search)]

        return run

    fns = {name: runner(name, kind, engine) for name, (kind, engine) in engines.items()}
    times = interleaved(fns, repeats)
    sentences = sum(len(b) for b in batches)
    point: dict[str, Any] = {
        "label": label,
        "sentences": sentences,
        "batch": len(batches[0]),
        "search": asdict(search),
        "engines": {},
    }
    first = next(iter(results.values()))
    for name in engines:
        med = statistics.median(times[name])
        entry = {
            "median_s": med,
            "sentences_per_s": sentences / med,
            "times_s": times[name],
            "identical_to_first": sum(a == b for a, b in zip(first, results[name], strict=True)),
            "peak_rss_rise_mb": None,
        }
        rise = peak_rss_rise(fns[name])
        if rise is not None:
            entry["peak_rss_rise_mb"] = rise / 1e6
        if flops_models and out_len and name in flops_models:
            flops = work_flops(flops_models[name], batches, out_len, search.beam_size, pad)
            entry.update(gflops=flops / 1e9, gflops_per_s=flops / med / 1e9)
        point["engines"][name] = entry
    names = list(engines)
    if len(names) >= 2:
        a, b = point["engines"][names[0]], point["engines"][names[1]]
        point["ratio"] = b["sentences_per_s"] / a["sentences_per_s"]  # second engine over first
    return point


def _line(p: dict[str, Any], roofline: float) -> str:
    names = list(p["engines"])
    parts = []
    for n in names:
        e = p["engines"][n]
        s = f"{n} {e['sentences_per_s']:8.1f} sent/s"
        if "gflops_per_s" in e:
            s += f" ({e['gflops_per_s']:.2f} GFLOP/s = {100 * e['gflops_per_s'] / roofline:.1f}% of mm)"
        if e["peak_rss_rise_mb"] is not None:
            s += f" peak +{e['peak_rss_rise_mb']:.0f}MB"
        parts.append(s)
    ratio = f"  ratio {p['ratio']:.2f}x" if "ratio" in p else ""
    same = p["engines"][names[-1]]["identical_to_first"]
    agree = f"  (same hyps {same}/{p['sentences']})" if p.get("same_model", True) else ""
    return f"  {p['label']:<37} " + " | ".join(parts) + ratio + agree


# ---------------------------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:
    previous_threads = torch.get_num_threads()
    try:
        return _run(args)
    finally:
        # called in-process (tests, notebooks): leave torch's thread count as found, or later training in
        # the same process stops being bit-identical to a subprocess run with the same seed
        torch.set_num_threads(previous_threads)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    payload = load_checkpoint(args.checkpoint)
    runtime = load(args.export, threads=args.threads, spinning=args.ort_spinning)
    if args.pruned_export and runtime.manifest.get("heads_removed") and runtime.manifest.get("head_plan"):
        raise ExportError(
            "--export must be the unpruned model (exported with remove_heads=false) when --pruned-export is given"
        )
    # torch runs the very model the export holds: heads removed if the export removed them, else gated
    model = prune(
        model_from_checkpoint(payload),
        runtime.manifest.get("head_plan") or {},
        remove=bool(runtime.manifest.get("heads_removed", True)),
    )[0]
    texts, refs = load_sentences(payload, args.src, max(args.paper_batch, args.batch1_sentences, 64, *args.batches))
    roofline = matmul_roofline(args.threads)
    report: dict[str, Any] = {
        "checkpoint": payload["path"],
        "export": str(args.export),
        "threads": args.threads,
        "ort_spinning": args.ort_spinning,
        "repeats": args.repeats,
        "matmul_roofline_gflops": roofline,
        "model": runtime.manifest["model_config"],
        "points": [],
    }
    print(
        f"{runtime.name}: threads {args.threads}, fp32 matmul roofline {roofline:.1f} GFLOP/s "
        f"(torch.mm 1024³), medians of {args.repeats} interleaved runs"
    )
    engines = {"torch": ("torch", model), "ort": ("ort", runtime)}
    pad = runtime.pad_id
    per_batch = {1: args.batch1_sentences, 32: 64, 256: 256}
    for mode in args.modes:
        for spec in args.searches:
            for batch in args.batches:
                fixed = args.fixed_len if mode == "fixed" else None
                search = _searches(spec, fixed)
                batches = make_batches(runtime, texts, batch, per_batch.get(batch, batch))
                p = bench_point(
                    f"{mode} {spec} batch {batch}",
                    engines,
                    batches,
                    search,
                    args.repeats,
                    {"torch": model, "ort": model} if fixed else None,
                    fixed,
                    pad,
                )
                p["mode"] = mode
                target = TARGETS.get((spec, batch)) if mode == "natural" else None
                if target:
                    p["target"], p["meets_target"] = target, p["ratio"] >= target
                report["points"].append(p)
                print(
                    _line(p, roofline)
                    + (f"  target ≥{target}x: {'met' if p['meets_target'] else 'MISSED'}" if target else ""),
                    flush=True,
                )
    paper = Search(beam_size=5, max_len_a=0.0, max_len_b=10)
    batches = make_batches(runtime, texts, args.paper_batch, args.paper_batch)
    p = bench_point(f"paper: beam 5, batch {args.paper_batch}, max len 10", engines, batches, paper, args.repeats)
    report["points"].append(p)
    print(_line(p, roofline), flush=True)

    if args.pruned_export:
        pruned_rt = load(args.pruned_export, threads=args.threads, spinning=args.ort_spinning)
        plan = pruned_rt.manifest["head_plan"]
        pruned_model = prune(model_from_checkpoint(payload), plan)[0]
        gated = model  # the unpruned model: --export, with every head computed (remove_heads=false)
        fixed = Search(beam_size=5, max_len_a=0.0, max_len_b=10, min_len=10)
        flops = {
            "unpruned": work_flops(gated, batches, 10, 5, pad),
            "pruned": work_flops(pruned_model, batches, 10, 5, pad),
        }
        prune_report = {
            "plan": plan,
            "analytic_flops_ratio": flops["pruned"] / flops["unpruned"],
            "manifest_flops_ratio": pruned_rt.manifest["size"]["flops_ratio"],
        }
        for kind, a, b in (
            ("torch", ("torch", gated), ("torch", pruned_model)),
            ("ort", ("ort", runtime), ("ort", pruned_rt)),
        ):
            p = bench_point(
                f"{kind} unpruned vs pruned (fixed 10)",
                {f"{kind}": a, f"{kind}-pruned": b},
                batches,
                fixed,
                args.repeats,
            )
            p["same_model"] = False
            prune_report[kind] = {"speedup": p["ratio"], "time_ratio": 1 / p["ratio"], "point": p}
            print(
                _line(p, roofline) + f"  time ratio {1 / p['ratio']:.2f} vs analytic FLOP ratio "
                f"{prune_report['analytic_flops_ratio']:.2f}",
                flush=True,
            )
        report["pruning"] = prune_report

    if args.int8_export:
        int8 = load(args.int8_export, threads=args.threads, spinning=args.ort_spinning)
        if int8.manifest.get("head_plan") != runtime.manifest.get("head_plan"):
            print("  int8: --int8-export has another head plan than --export; its BLEU cost is not comparable")
        elif refs is None:
            print("  int8: no references (test split unavailable): BLEU cost not measured")
        else:
            n = min(args.bleu_sentences or len(texts), len(set(texts)))  # one pass over the test split
            start = time.perf_counter()
            fp32_out = runtime.translate(texts[:n], beam_size=5)
            fp32_s = time.perf_counter() - start
            start = time.perf_counter()
            int8_out = int8.translate(texts[:n], beam_size=5)
            int8_s = time.perf_counter() - start
            test = paired_bootstrap(fp32_out, int8_out, refs[:n])
            report["int8"] = {
                "sentences": n,
                "bleu_fp32": test["baseline"]["bleu"],
                "bleu_int8": test["system"]["bleu"],
                "p_value": test["p_value"],
                "significant": test["significant"],
                "fp32_s": fp32_s,
                "int8_s": int8_s,
                "identical_outputs": sum(a == b for a, b in zip(fp32_out, int8_out, strict=True)),
            }
            r = report["int8"]
            print(
                f"  int8 on {n} test sentences (beam 5): BLEU {r['bleu_fp32']:.2f} → {r['bleu_int8']:.2f} "
                f"(paired bootstrap p={r['p_value']:.3f}{', significant' if r['significant'] else ''}); "
                f"{n / fp32_s:.1f} → {n / int8_s:.1f} sent/s; {r['identical_outputs']}/{n} outputs identical"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="run dir or .pt the export was made from")
    ap.add_argument("--export", required=True, help="export dir (python -m export …)")
    ap.add_argument("--pruned-export", help="an export of the same checkpoint with a head plan")
    ap.add_argument("--int8-export", help="an export of the same checkpoint with quantize=true (BLEU cost)")
    ap.add_argument("--src", help="source sentences file (default: the checkpoint's test split)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ort-spinning", action="store_true", help="let ORT's idle threads spin-wait")
    ap.add_argument("--modes", default="natural,fixed", type=lambda s: s.split(","))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", default="1,32,256", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--searches", default="greedy,beam5", type=lambda s: s.split(","))
    ap.add_argument("--fixed-len", type=int, default=20, help="output tokens in the fixed-length mode")
    ap.add_argument("--batch1-sentences", type=int, default=16, help="sentences decoded one by one per run")
    ap.add_argument("--paper-batch", type=int, default=256, help="batch of the paper's speed setting (beam 5, len 10)")
    ap.add_argument("--bleu-sentences", type=int, default=None, help="test sentences for the int8 BLEU check")
    ap.add_argument("--json", help="write the full report here")
    with one_line_errors(ExportRuntimeError):
        run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
