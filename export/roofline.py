"""The machine's own limits for a decoding step, measured in the same run as the step (export.bench).

Arithmetic: what the step's matmuls would take at the speed torch/MKL reaches on exactly those shapes (one [1, 512]
row through a [512, 512] weight runs far below a 1024³ multiply's GFLOP/s, so a square-matrix roofline flatters
small batches). Memory: at batch 1 a step re-reads every decoder weight, so bytes per step over the measured read
bandwidth bounds it from below whatever the arithmetic. A point's efficiency is its achieved rate over the limit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.model import Transformer

MIN_TIMED_S = 2e-3  # a tiny matmul is repeated until one timing spans this long


def step_matmuls(model: Transformer, rows: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of every matmul one decoder step runs on `rows` rows (beam × batch): each decoder Linear except the
    cross-attention keys and values (the encoder pass computes them once per source), then the output projection."""
    shapes = []
    for name, module in model.decoder.named_modules():
        if isinstance(module, nn.Linear) and not name.endswith(("cross_attn.k_proj", "cross_attn.v_proj")):
            out_features, in_features = module.weight.shape
            shapes.append((rows, in_features, out_features))
    shapes.append((rows, model.cfg.d_model, model.cfg.vocab_size))  # logits [rows, V]
    return shapes


def _best_seconds(fn, repeats: int) -> float:
    fn()
    calls = 1
    while True:  # calls per timing, so that one timing is long enough to read
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


def shape_roofline(shapes: Sequence[tuple[int, int, int]], threads: int, repeats: int = 5) -> float:
    """GFLOP/s of torch.mm (fp32, `threads` threads) over these shapes together: Σ 2·m·k·n ÷ Σ best time, each
    distinct shape timed once and counted as often as it occurs."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = seconds = 0.0
        for (m, k, n), count in Counter(shapes).items():
            a, b = torch.randn(m, k), torch.randn(k, n)
            seconds += count * _best_seconds(lambda a=a, b=b: torch.mm(a, b), repeats)
            flops += count * 2.0 * m * k * n
        return flops / seconds / 1e9
    finally:
        torch.set_num_threads(previous)


def read_bandwidth(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """GB/s (1e9 bytes) of reading a `megabytes` fp32 array once (torch.sum at `threads` threads), the best of
    `repeats`: far larger than the caches, so it is main memory's read bandwidth as one step would see it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        array = torch.ones(megabytes * 2**20 // 4)
        return array.numel() * 4 / _best_seconds(lambda: array.sum(), repeats) / 1e9
    finally:
        torch.set_num_threads(previous)


def step_weight_bytes(model: Transformer, bytes_per_weight: float = 4.0) -> int:
    """Weight bytes one decoder step reads (the matmuls of `step_matmuls`, biases and norms left out): at batch 1
    the step's memory traffic, caches being far smaller. `bytes_per_weight` 1 for an INT8 export's MatMuls."""
    return int(sum(k * n for _, k, n in step_matmuls(model, 1)) * bytes_per_weight)


@dataclass
class StepLimits:
    """This machine's limits at `threads` threads, measured once per benchmark run; shape rooflines cached by rows."""

    threads: int
    bandwidth_gbps: float  # read_bandwidth
    rooflines: dict[int, float] = field(default_factory=dict)  # rows → shape_roofline of a step with them

    @classmethod
    def measure(cls, threads: int) -> StepLimits:
        return cls(threads, read_bandwidth(threads))

    def roofline(self, model: Transformer, rows: int) -> float:
        if rows not in self.rooflines:
            self.rooflines[rows] = shape_roofline(step_matmuls(model, rows), self.threads)
        return self.rooflines[rows]
