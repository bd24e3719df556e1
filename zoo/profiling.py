"""Where a training update's time goes: every profiled op attributed to one category, and the update's matmuls
against the speed torch.mm reaches on exactly their shapes on this machine (issue 63).

Categories come from the op and the `zoo.<phase>` label of `Trainer.update` it ran under: everything under
`zoo.collate` is data and batching, under `zoo.optimizer` the optimizer (clipping, AdamW, the schedule), under
`zoo.aux_loss` GHT's k-means and group constraint; other ops by kind (matmuls, the fused attention kernel, softmax,
layer norm, dropout, embeddings, the rest elementwise). Self times partition the time some op or label covers, so
what the profiled update's wall time leaves over is Python between ops (the profiler's own cost included: the
unprofiled update time is stored beside it).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch

MIN_TIMED_S = 2e-3  # a fast matmul is repeated until one timing spans this long

# (batch, m, k, n): batch independent [m, k] @ [k, n] products (batch 1 = a plain mm)
MatmulShape = tuple[int, int, int, int]

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
PHASE_CATEGORIES = {
    "zoo.collate": "data and batching",
    "zoo.optimizer": "optimizer (clip, AdamW, schedule)",
    "zoo.aux_loss": "GHT k-means and constraint",
}
# op-name prefixes → category, first match wins (ops under a phase of PHASE_CATEGORIES go there instead)
OP_CATEGORIES = (
    (MATMUL_OPS, "matmul"),
    (("aten::_scaled_dot_product", "aten::_flash_attention"), "attention kernel (SDPA)"),
    (("aten::_softmax", "aten::_log_softmax"), "softmax and log-softmax"),
    (("aten::native_layer_norm",), "layer norm"),
    (("aten::native_dropout", "aten::bernoulli"), "dropout"),
    (("aten::embedding", "aten::index_select", "aten::index_add", "aten::index"), "embeddings"),
    (("autograd::", "torch::autograd::"), "autograd engine"),
    (("zoo.",), "Python inside phases"),
)
OTHER = "elementwise, copies, reductions"
UNCOVERED = "Python between ops (and the profiler)"


def _phase(event: Any) -> str:
    """The `zoo.<phase>` label an event ran under ('' if none)."""
    while event is not None:
        if event.name.startswith("zoo."):
            return event.name
        event = event.cpu_parent
    return ""


def category(event: Any) -> str:
    """The category of one profiled event (a torch.autograd.profiler_util.FunctionEvent)."""
    phase = _phase(event)
    if phase in PHASE_CATEGORIES:
        return PHASE_CATEGORIES[phase]
    for prefixes, name in OP_CATEGORIES:
        if event.name.startswith(prefixes):
            return name
    return OTHER


def matmul_shape(event: Any) -> MatmulShape | None:
    """(batch, m, k, n) of a matmul event from its recorded input shapes, or None for another op."""
    if event.name not in MATMUL_OPS:
        return None
    shapes = [s for s in event.input_shapes if s]
    a, b = (shapes[1], shapes[2]) if event.name in ("aten::addmm", "aten::baddbmm") else (shapes[0], shapes[1])
    if len(a) == 3:
        return (a[0], a[1], a[2], b[2])
    return (1, a[0], a[1], b[1])


def matmul_flops(shape: MatmulShape) -> int:
    batch, m, k, n = shape
    return 2 * batch * m * k * n


def best_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """Best wall seconds of one call of `fn` (repeated so that one timing spans MIN_TIMED_S)."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start >= MIN_TIMED_S:
            break
        calls *= 4
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def matmul_seconds(shape: MatmulShape, repeats: int = 5) -> float:
    """Best seconds of one fp32 torch.mm / torch.bmm of `shape` at the current torch threads: the roofline of
    that shape on this machine (a [2000, 256] @ [256, 256] product runs far below a 1024³ one's GFLOP/s)."""
    batch, m, k, n = shape
    if batch == 1:
        a, b = torch.randn(m, k), torch.randn(k, n)
        return best_seconds(lambda: torch.mm(a, b), repeats)
    a3, b3 = torch.randn(batch, m, k), torch.randn(batch, k, n)
    return best_seconds(lambda: torch.bmm(a3, b3), repeats)


def summarize_profile(events: Iterable[Any], wall_s: float, updates: int) -> dict[str, Any]:
    """Milliseconds per update by category, and the matmuls' shapes (counts per update), from one profiled window
    of `updates` updates that took `wall_s`."""
    per_category: Counter[str] = Counter()
    shapes: Counter[MatmulShape] = Counter()
    matmul_us = 0.0
    for event in events:
        self_us = event.self_cpu_time_total
        per_category[category(event)] += self_us
        if (shape := matmul_shape(event)) is not None:
            shapes[shape] += 1
            matmul_us += self_us
    covered_ms = sum(per_category.values()) / 1e3
    ms = {name: us / 1e3 / updates for name, us in per_category.items()}
    ms[UNCOVERED] = max(wall_s * 1e3 - covered_ms, 0.0) / updates
    flops = sum(count * matmul_flops(shape) for shape, count in shapes.items())
    return {
        "updates": updates,
        "wall_ms_per_update": wall_s * 1e3 / updates,
        "ms_per_update": dict(sorted(ms.items(), key=lambda kv: -kv[1])),
        "matmul": {
            "calls_per_update": sum(shapes.values()) / updates,
            "flops_per_update": flops / updates,
            "kernel_ms_per_update": matmul_us / 1e3 / updates,
            "shapes": {_shape_key(s): c / updates for s, c in shapes.most_common()},
        },
    }


def _shape_key(shape: MatmulShape) -> str:
    return "x".join(map(str, shape))


def roofline_ms(shapes: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Milliseconds the matmuls `shapes` (key → calls per update) take at torch's best speed on each shape alone,
    and each shape's seconds (stored, so the roofline can be checked)."""
    seconds = {key: matmul_seconds(tuple(int(x) for x in key.split("x"))) for key in shapes}  # type: ignore[arg-type]
    return sum(shapes[key] * s for key, s in seconds.items()) * 1e3, seconds


def median_and_spread(values: list[float]) -> dict[str, float]:
    """Median with the 10th and 90th percentiles (nearest rank) of per-update seconds."""
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median": statistics.median(ordered), "p10": pick(0.1), "p90": pick(0.9), "n": len(ordered)}
