"""One point of `python -m export.bench`: the sentences and padded batches, the engines timed interleaved on them,
and the point's record (medians, ratios, hypothesis agreement, FLOPs against the machine's limits) and its line.

Why apart from the run (speed.py): a point is the unit every step measures — the grid, the headline, the paper's
setting, pruned against unpruned — so the steps read as which points they take, and this as how one is taken.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.bench.memory import peak_rss_rise
from export.bench.roofline import MachineLimits, decoder_steps, matmul_flops, search_matmuls, step_weight_bytes
from export.bench.rss_probe import decode_batch
from export.bench.table import paired_ratio
from export.graph import ExportError
from export.runtime import ExportedModel, Search
from export.runtime.generation import best_tokens, padded
from zoo.data import build_splits
from zoo.decoding.generate import generate
from zoo.flops import model_flops
from zoo.model import Transformer


# ---------------------------------------------------------------------------------------------- work
def load_sentences(
    payload: dict[str, Any] | None, path: str | None, n: int, runtime: ExportedModel
) -> tuple[list[str], list[str] | None]:
    """Source sentences (and references when known): a file, else the checkpoint's test split,
    else its held-out sentences repeated (the export's own held-out sample without a checkpoint)."""
    if path:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        return (lines * (n // max(len(lines), 1) + 1))[:n], None
    if payload is None:
        if "heldout" not in runtime.manifest:
            raise ExportError(f"{runtime.directory} has no held-out sample: give --src (or --checkpoint)")
        held = json.loads((runtime.directory / runtime.manifest["heldout"]).read_text(encoding="utf-8"))["src"]
        return (held * (n // len(held) + 1))[:n], None
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
    return [padded(ids[i : i + batch], runtime.pad_id) for i in range(0, len(ids), batch)]


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


# ---------------------------------------------------------------------------------------------- timing
def search_for(engine: Any, search: Search) -> Any:
    """`search` as the Search class of the runtime module that defined `engine` (a baseline runtime has its
    own class; fields it does not know are left out)."""
    cls = sys.modules[type(engine).__module__].Search
    if cls is Search:
        return search
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in asdict(search).items() if k in known})


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


def searches(spec: str, fixed_len: int | None) -> Search:
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
    pairs: Sequence[tuple[str, str]] = (),
    limits: MachineLimits | None = None,
) -> dict[str, Any]:
    """Time engines {name: ("torch", model) | ("ort", runtime)} on the same batches and search; `pairs`
    [(engine, its baseline), …] get a speed ratio and a hypothesis agreement each (default: the second
    engine against the first). `ratio` is the first pair's. With analytic FLOPs and `limits`, each fp32 engine's
    GFLOP/s is set against the step's own matmul roofline, and at batch 1 its weight traffic against the
    measured read bandwidth (roofline.py)."""
    tensors = [torch.from_numpy(b) for b in batches]
    results: dict[str, list[list[int]]] = {}
    # wall seconds of every batch's own call, every round (warm-up excluded below): at batch 1, the latency of a
    # sentence as a caller decoding one at a time sees it
    calls: dict[str, list[float]] = {name: [] for name in engines}

    def timed(name: str, decode: Callable[[Any], list[list[int]]], inputs: list[Any]) -> list[list[int]]:
        out = []
        for src in inputs:
            start = time.perf_counter()
            out += decode(src)
            calls[name].append(time.perf_counter() - start)
        return out

    def runner(name: str, kind: str, engine: Any) -> Callable[[], None]:
        if kind == "torch":

            def run() -> None:
                results[name] = timed(name, lambda src: best_tokens(generate(engine, src, search)), tensors)

        else:
            own = search_for(engine, search)

            def run() -> None:
                results[name] = timed(name, lambda src: decode_batch(engine, src, own), batches)

        return run

    fns = {name: runner(name, kind, engine) for name, (kind, engine) in engines.items()}
    times = interleaved(fns, repeats)
    sentences = sum(len(b) for b in batches)
    point: dict[str, Any] = {
        "label": label,
        "sentences": sentences,
        "batch": len(batches[0]),
        "search": asdict(search),
        "rounds": repeats,
        "engines": {},
    }
    for name in engines:
        med = statistics.median(times[name])
        entry = {
            "median_s": med,
            "sentences_per_s": sentences / med,
            "times_s": times[name],
            "peak_rss_rise_mb": None,
        }
        if len(batches[0]) == 1:  # every call one sentence: its latency percentiles over every timed round
            entry["latency_s"] = latency_percentiles(calls[name][len(batches) :])  # the first round was warm-up
        rise = peak_rss_rise(fns[name])
        if rise is not None:
            entry["peak_rss_rise_mb"] = rise / 1e6
        if flops_models and out_len and name in flops_models:
            flops = work_flops(flops_models[name], batches, out_len, search.beam_size, pad)
            entry.update(gflops=flops / 1e9, gflops_per_s=flops / med / 1e9)
            if limits is not None:
                width = 1.0 if name.startswith("int8") else 4.0  # bytes per MatMul weight
                entry.update(_against_limits(flops_models[name], limits, batches, search, out_len, med, width))
        point["engines"][name] = entry
    names = list(engines)
    if not pairs and len(names) >= 2:
        pairs = [(names[1], names[0])]
    point["pairs"] = [
        {
            "engine": new,
            "baseline": base,
            "ratio": point["engines"][new]["sentences_per_s"] / point["engines"][base]["sentences_per_s"],
            "paired_ratio": paired_ratio(times[base], times[new]),
            "identical": sum(a == b for a, b in zip(results[base], results[new], strict=True)),
        }
        for new, base in pairs
    ]
    if point["pairs"]:
        point["ratio"] = point["pairs"][0]["ratio"]
    return point


def latency_percentiles(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p90 (and the count) of per-sentence wall times: numpy's linear interpolation between order statistics."""
    values = np.asarray(seconds, dtype=float)
    return {"p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)), "n": int(values.size)}


def _against_limits(
    model: Transformer,
    limits: MachineLimits,
    batches: list[np.ndarray],
    search: Search,
    out_len: int,
    seconds: float,
    bytes_per_weight: float,
) -> dict[str, Any]:
    """A fixed-length point against the machine's limits (roofline.py). Arithmetic, for fp32 engines: the time the
    search's own matmuls (encoder, then every step at its rows) take at the best kernel's speed on their shapes, over
    the measured time — the same work on both sides, so everything else the search does counts against it. Memory,
    at batch 1: the weight bytes every step reads over the measured read bandwidth, and (fp32) the time the steps'
    matmuls alone take back to back (`step_stream_seconds`) over the measured time; the encoder's time is in
    `seconds` too, so both shares are lower bounds of the decoder's own."""
    out: dict[str, Any] = {}
    if bytes_per_weight == 4:  # INT8 MatMuls have no fp32 roofline
        shapes = search_matmuls(model, batches, out_len, search.beam_size)
        flops, ideal = matmul_flops(shapes), limits.matmul_seconds(shapes)
        out.update(
            matmul_gflop=flops / 1e9,
            matmul_gflops_per_s=flops / seconds / 1e9,
            roofline_gflops=flops / ideal / 1e9,
            roofline_seconds=ideal,
            efficiency=ideal / seconds,
        )
    if len(batches[0]) == 1:
        steps = decoder_steps(batches, out_len)
        weights = step_weight_bytes(model, bytes_per_weight)
        gbps = weights * steps / seconds / 1e9
        out.update(step_weight_bytes=weights, weight_gb_per_s=gbps, bandwidth_fraction=gbps / limits.bandwidth_gbps)
        if bytes_per_weight == 4:  # the fp32 step's matmuls alone, back to back (INT8 kernels are not timed so)
            stream = limits.step_stream_seconds(model)
            out.update(stream_gb_per_s=weights / stream / 1e9, stream_fraction=stream * steps / seconds)
    return out


def pair(point: dict[str, Any], engine: str, baseline: str) -> dict[str, Any] | None:
    """The point's comparison of `engine` against `baseline`, if it made one."""
    return next((p for p in point["pairs"] if (p["engine"], p["baseline"]) == (engine, baseline)), None)


def pairs_text(p: dict[str, Any]) -> str:
    same = p.get("same_model", True)
    return ", ".join(
        f"{q['engine']}/{q['baseline']} {q['ratio']:.2f}x"
        + f" (paired {q['paired_ratio']:.2f}x)"
        + (f" (same hyps {q['identical']}/{p['sentences']})" if same else "")
        for q in p["pairs"]
    )


def point_line(p: dict[str, Any], roofline: float | None) -> str:
    parts = []
    for n, e in p["engines"].items():
        s = f"{n} {e['sentences_per_s']:8.1f} sent/s"
        if "gflops_per_s" in e:
            s += f" ({e['gflops_per_s']:.2f} GFLOP/s"
            s += f" = {100 * e['gflops_per_s'] / roofline:.1f}% of mm" if roofline else ""
            if "efficiency" in e:
                s += f"; matmuls {e['matmul_gflops_per_s']:.2f} GFLOP/s = {100 * e['efficiency']:.0f}% of their"
                s += f" roofline {e['roofline_gflops']:.1f}"
            if "bandwidth_fraction" in e:
                s += f"; weights {e['weight_gb_per_s']:.1f} GB/s = {100 * e['bandwidth_fraction']:.0f}% of memory"
            if "stream_fraction" in e:
                s += f", {100 * e['stream_fraction']:.0f}% of its matmuls alone ({e['stream_gb_per_s']:.1f} GB/s)"
            s += ")"
        if "latency_s" in e:
            s += f" p50 {1e3 * e['latency_s']['p50']:.1f} / p90 {1e3 * e['latency_s']['p90']:.1f} ms"
        if e["peak_rss_rise_mb"] is not None:
            s += f" peak +{e['peak_rss_rise_mb']:.0f}MB"
        parts.append(s)
    ratios = f"  {pairs_text(p)}" if p["pairs"] else ""
    return f"  {p['label']:<37} " + " | ".join(parts) + ratios


# ---------------------------------------------------------------------------------------------- the steps' results
@dataclass
class Inputs:
    """What every point is measured on (the load step)."""

    payload: dict[str, Any] | None  # the checkpoint (None with --no-torch and no --checkpoint)
    runtime: ExportedModel  # --export
    int8: ExportedModel | None  # --int8-export
    model: Transformer | None  # the torch model the export holds
    texts: list[str]
    refs: list[str] | None  # references of `texts`, when known
    roofline: float | None  # fp32 matmul GFLOP/s at SQUARE (with --roofline)
    limits: MachineLimits | None  # per-shape matmul timings and the read bandwidth (with --roofline)


@dataclass
class Sweep:
    """The engines timed side by side, the pairs compared, and the points measured so far (the engines step)."""

    engines: dict[str, tuple[str, Any]]
    pairs: list[tuple[str, str]]
    flops_models: dict[str, Transformer] | None
    limits: MachineLimits | None
    pad: int
    baseline_file: Path | None  # --baseline-runtime, resolved
    baseline_exports: dict[str, Path]  # kind → the export the baseline runtime reads
    points: list[dict[str, Any]] = field(default_factory=list)  # the report's "points"

    def measure(
        self, label: str, batches: list[np.ndarray], search: Search, repeats: int, fixed: int | None
    ) -> dict[str, Any]:
        """One point on every engine, kept in `points`; analytic FLOPs only where the work is fixed."""
        flops = self.flops_models if fixed else None
        p = bench_point(label, self.engines, batches, search, repeats, flops, fixed, self.pad, self.pairs, self.limits)
        self.points.append(p)
        return p
