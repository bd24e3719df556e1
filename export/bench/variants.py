"""The export's variants in `python -m export.bench`: pruned against unpruned speed beside the analytic FLOP
ratio (--pruned-export), and fp32 against INT8 BLEU on the test split (--int8-export).

Why apart from the run (speed.py): these compare two exports of one checkpoint rather than two engines on one
export, each a step of its own after the speed grid.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from export.bench.points import Inputs, bench_point, point_line, work_flops
from export.pruning import prune
from export.runtime import Search, load
from zoo.checkpoint import model_from_checkpoint
from zoo.metrics import paired_bootstrap


# ---------------------------------------------------------------------------------------------- pruning
def pruned_vs_unpruned(args: argparse.Namespace, inputs: Inputs, batches: list[np.ndarray]) -> dict[str, Any]:
    """Pruned vs unpruned speed (torch and ORT) on `batches` (the last point's), beside the analytic FLOP ratio of
    the same work: whether removing heads pays what its FLOPs promise."""
    pruned_rt = load(args.pruned_export, threads=args.threads, spinning=args.ort_spinning)
    plan = pruned_rt.manifest["head_plan"]
    assert inputs.payload is not None and inputs.model is not None  # main() requires --checkpoint
    pruned_model = prune(model_from_checkpoint(inputs.payload), plan)[0]
    gated = inputs.model  # the unpruned model: --export, with every head computed (remove_heads=false)
    fixed = Search(beam_size=5, max_len_a=0.0, max_len_b=10, min_len=10)
    pad = inputs.runtime.pad_id
    flops = {
        "unpruned": work_flops(gated, batches, 10, 5, pad),
        "pruned": work_flops(pruned_model, batches, 10, 5, pad),
    }
    prune_report = {
        "plan": plan,
        "analytic_flops_ratio": flops["pruned"] / flops["unpruned"],
        "manifest_flops_ratio": pruned_rt.manifest["size"]["flops_ratio"],
    }
    kinds = [("ort", ("ort", inputs.runtime), ("ort", pruned_rt))]
    if not args.no_torch:
        kinds.insert(0, ("torch", ("torch", gated), ("torch", pruned_model)))
    for kind, a, b in kinds:
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
            point_line(p, inputs.roofline) + f"  time ratio {1 / p['ratio']:.2f} vs analytic FLOP ratio "
            f"{prune_report['analytic_flops_ratio']:.2f}",
            flush=True,
        )
    return prune_report


# ---------------------------------------------------------------------------------------------- int8
def int8_bleu(args: argparse.Namespace, inputs: Inputs, report: dict[str, Any]) -> None:
    """BLEU of fp32 vs INT8 ORT on the test split (paired bootstrap) as report["int8"], where the two exports
    share a head plan and references are known; otherwise says why it was not measured."""
    runtime, int8, texts, refs = inputs.runtime, inputs.int8, inputs.texts, inputs.refs
    assert int8 is not None
    if int8.manifest.get("head_plan") != runtime.manifest.get("head_plan"):
        print("  int8: --int8-export has another head plan than --export; its BLEU cost is not comparable")
        return
    if refs is None:
        print("  int8: no references (test split unavailable): BLEU cost not measured")
        return
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
