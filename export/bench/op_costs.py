"""What one small kernel of a batch-1 decoder step costs in onnxruntime on this machine: a chain of bias Adds (the
step's tiniest kernels), a LayerNormalization, a MultiHeadAttention step with a past and one against a cross cache,
and LogSoftmax + TopK over the vocabulary — each timed alone in its own session, less an empty run's cost.

Why: issue 65 asked for fewer kernels per step on the view that dispatch dominates at batch 1. These numbers say how
much a kernel count is worth here (results/runtime/fused_attention.md): if a bias Add costs half a microsecond, 40
fewer of them save 20 µs of a 2 ms step.

    python -m export.bench.op_costs [--threads 2] [--spinning] [--d-model 512] [--heads 8] [--past 15]
        [--vocab 10000] [--chain 100] [--json <report>]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def _session(nodes: list, inputs: list, initializers: list, threads: int, spinning: bool) -> ort.InferenceSession:
    outputs = [helper.make_tensor_value_info(name, F32, None) for name in nodes[-1].output[:1]]
    graph = helper.make_graph(nodes, "op_costs", inputs, outputs, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the ops as written, unfused
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_seconds(session: ort.InferenceSession, feeds: dict[str, np.ndarray], runs: int) -> float:
    """Median seconds of one run, after a tenth as many untimed."""
    for _ in range(max(runs // 10, 1)):
        session.run(None, feeds)
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Microseconds per kernel of each kind (the empty run's cost subtracted), and that cost."""
    rng = np.random.default_rng(0)
    d, heads, past, runs = args.d_model, args.heads, args.past, args.runs
    x = rng.standard_normal((1, 1, d), np.float32)
    value = helper.make_tensor_value_info
    empty = run_seconds(
        _session(
            [helper.make_node("Identity", ["x"], ["y"])], [value("x", F32, [1, 1, d])], [], args.threads, args.spinning
        ),
        {"x": x},
        runs,
    )

    def cost(nodes: list, inputs: list, initializers: list, feeds: dict, kernels: int = 1) -> float:
        session = _session(nodes, inputs, initializers, args.threads, args.spinning)
        return 1e6 * (run_seconds(session, feeds, runs) - empty) / kernels

    def chained(make: Any, n: int) -> list:
        """n nodes, each reading the previous one's output ("x" first) and writing `a<i>`."""
        return [make(f"a{i - 1}" if i else "x", f"a{i}") for i in range(n)]

    n = args.chain
    bias = numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "b")
    gamma, beta = (numpy_helper.from_array(np.ones(d, np.float32), name) for name in ("g", "be"))
    dh = d // heads
    cache = rng.standard_normal((1, heads, past, dh), np.float32)
    kv = {"k": rng.standard_normal((1, 1, d), np.float32), "v": rng.standard_normal((1, 1, d), np.float32)}
    hidden = [value("x", F32, [1, 1, d])]
    caches = [value(name, F32, [1, heads, past, dh]) for name in ("pk", "pv")]
    new_kv = [value(name, F32, [1, 1, d]) for name in ("k", "v")]

    def self_step(prev: str, out: str) -> Any:  # the query is the previous step's output; the grown caches unread
        return helper.make_node(
            "MultiHeadAttention",
            [prev, "k", "v", "", "", "", "pk", "pv"],
            [out, f"{out}_pk", f"{out}_pv"],
            domain="com.microsoft",
            num_heads=heads,
        )

    def cross_step(prev: str, out: str) -> Any:
        return helper.make_node(
            "MultiHeadAttention", [prev, "pk", "pv"], [out], domain="com.microsoft", num_heads=heads
        )

    logits = rng.standard_normal((1, args.vocab), np.float32)
    return {
        "threads": args.threads,
        "spinning": args.spinning,
        "empty_run_us": 1e6 * empty,
        "bias_add_us": cost(
            chained(lambda a, o: helper.make_node("Add", [a, "b"], [o]), n), hidden, [bias], {"x": x}, n
        ),
        "layer_norm_us": cost(
            chained(lambda a, o: helper.make_node("LayerNormalization", [a, "g", "be"], [o], axis=-1), n),
            hidden,
            [gamma, beta],
            {"x": x},
            n,
        ),
        "self_attention_step_us": cost(
            chained(self_step, n), [*hidden, *new_kv, *caches], [], {"x": x, **kv, "pk": cache, "pv": cache}, n
        ),
        "cross_attention_step_us": cost(
            chained(cross_step, n), [*hidden, *caches], [], {"x": x, "pk": cache, "pv": cache}, n
        ),
        "log_softmax_us": cost(
            chained(lambda a, o: helper.make_node("LogSoftmax", [a], [o], axis=-1), n),
            [value("x", F32, [1, args.vocab])],
            [],
            {"x": logits},
            n,
        ),
        "shapes": {"d_model": d, "heads": heads, "past": past, "vocab": args.vocab, "chain": args.chain},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench.op_costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spinning", action="store_true", help="let idle threads spin-wait (runtime spinning)")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--past", type=int, default=15, help="cached positions the attention steps read")
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--chain", type=int, default=100, help="kernels of a kind chained in one run (cost averaged)")
    ap.add_argument("--runs", type=int, default=2000, help="timed runs per session (median)")
    ap.add_argument("--json", help="write the costs here")
    args = ap.parse_args(argv)
    report = measure(args)
    for key, us in report.items():
        if key.endswith("_us"):
            unit = "µs a run" if key == "empty_run_us" else "µs per kernel"
            print(f"{key.removesuffix('_us').replace('_', ' '):28s} {us:8.2f} {unit}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
