"""The machine's own limits for a search, measured in the same run as the search (export.bench).

Arithmetic: how long the search's matmuls would take at the best speed this machine's kernels reach on exactly their
shapes — the encoder's over the padded source tokens, then every decoder step's over its rows (one row per sentence
at beam search's first step, beam × batch after it) — against the search's measured time. Both sides count the same
matmuls (a rate over the whole search's FLOPs would credit the encoder's large, fast multiplies to the small decoder
steps), so whatever the matmuls leave out (attention over the caches, softmax, the search's bookkeeping) counts as
time off the roofline. "Best" is the faster of torch.mm and onnxruntime's own MatMul per shape: which is faster
depends on the CPU (torch's MKL runs AVX2 code on AMD CPUs where onnxruntime's MLAS uses AVX-512), and a roofline
below the runtime's own kernels would read above 100%. Shapes are timed one by one: one [1, 512] row through a
[512, 512] weight runs far below a 1024³ multiply's GFLOP/s, so a square-matrix roofline would flatter small batches.

Memory: at batch 1 a step re-reads every decoder weight, so bytes per step over the measured read bandwidth bounds
it from below whatever the arithmetic (the timed shapes above have their weights in cache: at batch 1 this is the
limit that binds). Where the last-level cache holds the decoder's weights (a Xeon's 300 MB: 83 MB of fp32 weights
stream faster than main memory reads), that bound is not one; so the step's matmuls are also timed alone, back to
back in one session, each weight its own (`step_stream_seconds`): the least time a step's weights take to go through
this machine's kernels, whatever the cache — the step's own time against it says what is left for everything else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from export.runtime.search_loop import beam_first_rows
from zoo.model import Transformer
from zoo.profiling import best_seconds, matmul_seconds

Shape = tuple[int, int, int]  # (m, k, n): [m, k] @ [k, n]


def _is_cross_kv(name: str) -> bool:
    return name.endswith(("cross_attn.k_proj", "cross_attn.v_proj"))


def step_matmuls(model: Transformer, rows: int) -> list[Shape]:
    """(m, k, n) of every matmul one decoder step runs on `rows` rows (beam × batch): each decoder Linear except the
    cross-attention keys and values (the encoder pass computes them once per source), then the output projection."""
    linears = [m for n, m in model.decoder.named_modules() if isinstance(m, nn.Linear) and not _is_cross_kv(n)]
    logits = (rows, model.cfg.d_model, model.cfg.vocab_size)  # [rows, V]
    return [(rows, m.in_features, m.out_features) for m in linears] + [logits]


def encoder_matmuls(model: Transformer, tokens: int) -> list[Shape]:
    """(m, k, n) of every matmul the encoder pass runs on `tokens` source positions (batch × padded length): each
    encoder Linear, then every decoder layer's cross-attention keys and values over the encoder's output."""
    linears = [m for m in model.encoder.modules() if isinstance(m, nn.Linear)]
    linears += [m for n, m in model.decoder.named_modules() if isinstance(m, nn.Linear) and _is_cross_kv(n)]
    return [(tokens, m.in_features, m.out_features) for m in linears]


def search_matmuls(model: Transformer, batches: Iterable[np.ndarray], max_len: int, beam_size: int) -> Counter[Shape]:
    """Every matmul of decoding each padded batch [B, S] to its length limit `max_len` (eos banned before it): the
    encoder over B × S positions, then `max_len` − 1 decoder steps — the first on the rows beam search starts from,
    the rest on beam × B rows; the last position's eos is forced without a step (export/runtime/search_loop.py)."""
    first = 1 if beam_size == 1 else beam_first_rows(beam_size, model.cfg.vocab_size)
    shapes: Counter[Shape] = Counter()
    for src in batches:
        b, s = src.shape
        shapes.update(encoder_matmuls(model, b * s))
        if max_len > 1:
            shapes.update(step_matmuls(model, first * b))
        for _ in range(max_len - 2):
            shapes.update(step_matmuls(model, beam_size * b))
    return shapes


def decoder_steps(batches: Iterable[np.ndarray], max_len: int) -> int:
    """Decoder steps a sentence-by-sentence search runs on `batches` to `max_len`: `max_len` − 1 per batch."""
    return sum(1 for _ in batches) * max(0, max_len - 1)


def matmul_flops(shapes: Counter[Shape]) -> float:
    """2·m·k·n summed over `shapes`, each as often as it occurs."""
    return sum(count * 2.0 * m * k * n for (m, k, n), count in shapes.items())


def torch_mm_seconds(shape: Shape, threads: int, repeats: int = 5) -> float:
    """Best wall seconds of one fp32 torch.mm of `shape` at `threads` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return matmul_seconds((1, *shape), repeats)
    finally:
        torch.set_num_threads(previous)


def _session(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, ...]],
    outputs: dict[str, tuple[int, ...]],
    weights: list[np.ndarray],
    threads: int,
    spinning: bool = False,
):
    """A CPU session of `nodes` over fp32 `inputs` and `outputs` (name → shape), weights as initializers w0, w1, …"""
    graph = helper.make_graph(
        nodes,
        "roofline",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name, shape in outputs.items()],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    if spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _bound_run_seconds(session, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], repeats: int) -> float:
    """Best seconds of one run with inputs and outputs bound to preallocated arrays (no copy out)."""
    binding = session.io_binding()
    for name, x in inputs.items():
        binding.bind_cpu_input(name, x)
    for name, y in outputs.items():
        binding.bind_output(name, "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    return best_seconds(lambda: session.run_with_iobinding(binding), repeats)


def ort_call_seconds(threads: int, repeats: int = 5) -> float:
    """Best seconds of a bound onnxruntime run that does nothing (Identity of one float): the per-call cost a
    one-node MatMul session pays and a decoder step's MatMuls, all in one run, do not."""
    session = _session([helper.make_node("Identity", ["x"], ["y"])], {"x": (1,)}, {"y": (1,)}, [], threads)
    return _bound_run_seconds(session, {"x": np.zeros(1, np.float32)}, {"y": np.zeros(1, np.float32)}, repeats)


def ort_matmul_seconds(shape: Shape, threads: int, repeats: int = 5) -> float:
    """Best wall seconds of onnxruntime's fp32 MatMul of `shape` (the weight an initializer, as in an export) at
    `threads` threads, with input and output bound in place; the per-call cost is not subtracted here."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    session = _session(
        [helper.make_node("MatMul", ["x", "w0"], ["y"])],
        {"x": (m, k)},
        {"y": (m, n)},
        [rng.standard_normal((k, n), np.float32)],
        threads,
    )
    x, y = rng.standard_normal((m, k), np.float32), np.empty((m, n), np.float32)
    return _bound_run_seconds(session, {"x": x}, {"y": y}, repeats)


def read_bandwidth(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """GB/s (1e9 bytes) of reading a `megabytes` fp32 array once (torch.sum at `threads` threads), the best of
    `repeats`: far larger than the caches, so it is main memory's read bandwidth as one step would see it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        array = torch.ones(megabytes * 2**20 // 4)
        return array.numel() * 4 / best_seconds(lambda: array.sum(), repeats) / 1e9
    finally:
        torch.set_num_threads(previous)


def step_stream_seconds(shapes: list[Shape], threads: int, repeats: int = 5) -> float:
    """Best seconds of running the matmuls `shapes` (one decoder step's, `step_matmuls(model, 1)`) back to back in
    one onnxruntime session — each weight a distinct initializer, as in an export, so that they stream through the
    caches as a real step's do — with inputs and outputs bound in place and the threads spinning (the fastest a
    step's matmuls run here: a lower bound of its time, not counting the one empty call of `ort_call_seconds`)."""
    rng = np.random.default_rng(0)
    widths = sorted({k for _, k, _ in shapes})
    nodes = [helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"y{i}"]) for i, (_, k, _) in enumerate(shapes)]
    inputs = {f"x{k}": (1, k) for k in widths}
    outputs = {f"y{i}": (m, n) for i, (m, _, n) in enumerate(shapes)}
    weights = [rng.standard_normal((k, n), np.float32) for _, k, n in shapes]
    session = _session(nodes, inputs, outputs, weights, threads, spinning=True)
    return _bound_run_seconds(
        session,
        {name: rng.standard_normal(shape, np.float32) for name, shape in inputs.items()},
        {name: np.empty(shape, np.float32) for name, shape in outputs.items()},
        repeats,
    )


def step_weight_bytes(model: Transformer, bytes_per_weight: float = 4.0) -> int:
    """Weight bytes one decoder step reads (the matmuls of `step_matmuls`, biases and norms left out): at batch 1
    the step's memory traffic, caches being far smaller. `bytes_per_weight` 1 for an INT8 export's MatMuls."""
    return int(sum(k * n for _, k, n in step_matmuls(model, 1)) * bytes_per_weight)


@dataclass
class MachineLimits:
    """This machine's limits at `threads` threads, measured once per benchmark run; each matmul shape timed once
    per kernel, onnxruntime's less the cost of an empty call."""

    threads: int
    bandwidth_gbps: float  # read_bandwidth
    ort_call_s: float  # ort_call_seconds
    kernels: dict[Shape, dict[str, float]] = field(default_factory=dict)  # shape → {kernel: seconds}
    streams: dict[tuple[Shape, ...], float] = field(default_factory=dict)  # a step's matmuls → step_stream_seconds

    @classmethod
    def measure(cls, threads: int) -> MachineLimits:
        return cls(threads, read_bandwidth(threads), ort_call_seconds(threads))

    def seconds(self, shape: Shape) -> float:
        """The faster kernel's seconds for one matmul of `shape` (timed on first use)."""
        if shape not in self.kernels:
            ort_s = ort_matmul_seconds(shape, self.threads) - self.ort_call_s
            self.kernels[shape] = {"torch": torch_mm_seconds(shape, self.threads), "onnxruntime": max(ort_s, 1e-9)}
        return min(self.kernels[shape].values())

    def matmul_seconds(self, shapes: Counter[Shape]) -> float:
        """Seconds the matmuls `shapes` take at the best kernel's speed on each shape."""
        return sum(count * self.seconds(shape) for shape, count in shapes.items())

    def step_stream_seconds(self, model: Transformer) -> float:
        """`step_stream_seconds` of `model`'s batch-1 decoder step (timed on first use per architecture)."""
        shapes = tuple(step_matmuls(model, 1))
        if shapes not in self.streams:
            self.streams[shapes] = step_stream_seconds(list(shapes), self.threads)
        return self.streams[shapes]

    def gflops(self, shape: Shape) -> float:
        """The best kernel's GFLOP/s on one shape."""
        return matmul_flops(Counter([shape])) / self.seconds(shape) / 1e9

    def as_json(self) -> dict[str, object]:
        """What a report stores: the bandwidth, the call cost, and every shape's seconds per kernel."""
        return {
            "threads": self.threads,
            "read_bandwidth_gbps": self.bandwidth_gbps,
            "ort_call_s": self.ort_call_s,
            "kernels_s": {"x".join(map(str, shape)): times for shape, times in sorted(self.kernels.items())},
            "step_stream_s": [
                {"weight_bytes": 4 * sum(k * n for _, k, n in shapes), "seconds": seconds}
                for shapes, seconds in self.streams.items()
            ],
        }
