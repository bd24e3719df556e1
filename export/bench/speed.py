"""Decoding speed of the ORT runtime against our own PyTorch generator — or against another version of
the runtime — on the same export.

    python -m export.bench --checkpoint runs/transformer-deen/<ts> --export exports/transformer-deen \
        [--pruned-export exports/transformer-deen-pruned] [--int8-export exports/transformer-deen-int8] \
        [--baseline-runtime /tmp/old/export/runtime [--baseline-export …] [--baseline-int8-export …]] \
        [--no-torch] [--roofline] \
        [--threads 1] [--repeats 5] [--batches 1,32,256] [--searches greedy,beam5] [--fixed-len 30] \
        [--json bench.json]

    # the runtime of commit X against the working tree's, torch left out (no checkpoint needed):
    git worktree add /tmp/old X
    python -m export.bench --export exports/transformer-deen --baseline-runtime /tmp/old --no-torch

Why this shape (zoo/DESIGN.md §3c): the baseline is our best torch path — `zoo.generate` with the
incremental cache, the same beam size, batch and thread count — and the engines run interleaved
(torch, ORT, ORT, torch, …) on identical pre-tokenised, length-sorted batches, so drift hits all of
them; we report medians and ratios. Every engine gets the same token ids and must return the same
hypotheses as the one it is compared with (the agreement is reported next to every ratio).

`--baseline-runtime` (the runtime package export/runtime/, an older commit's single export/runtime.py, or a
checkout holding either) adds that version of the runtime as engine `ort-baseline` on the same export (and
`int8-baseline` next to `int8` with `--int8-export`), so a runtime change is measured against its parent in one
interleaved run: ratio ort/ort-baseline per point. That works because the runtime imports nothing from the
project: any commit's copy loads under its own module name. When the export format changed between the two
(the runtime format in manifest.json), the baseline runs on exports its own commit made of the same
checkpoint: `--baseline-export` / `--baseline-int8-export` (the checkpoint's sha256 must match).
`--no-torch` drops the torch engine (its long runs and then the need for `--checkpoint`: sentences come
from `--src` or the export's held-out sample).

Points: greedy and beam 5 × batch 1/32/256 in the natural mode (each sentence stops at eos) and a
fixed-length mode (eos banned until `--fixed-len`, then forced: equal work for every engine, and the
only mode where analytic FLOPs describe the work exactly), plus the GHT paper's speed setting (beam
5, batch 256, at most 10 output tokens). The headline is fixed-length beam 5 × batch 32 (30 tokens
by default), always measured with at least 3 interleaved rounds and summarised last. With
`--pruned-export`, pruned vs unpruned speed (torch and ORT) next to the analytic FLOP ratio of the
same work. With `--roofline`, each fixed-length point is set against this machine's limits, measured in the
same run (export/bench/roofline.py): the time its own matmuls — the encoder's, then every step's at its rows — take
at the faster of torch.mm and onnxruntime's MatMul on each shape, over the measured time (fp32 engines), and
at batch 1 the weight bytes the steps read over the measured memory read bandwidth (INT8: one byte per weight);
`python -m export.bench.table REPORT --limits` renders that table. With `--int8-export` the INT8 export is
timed beside fp32 (pair int8/ort). Peak memory in-process is the rise of the process's peak RSS (VmHWM, reset through
/proc/self/clear_refs) over its RSS before one run of the point; what a torch-free server pays is
measured in a fresh process per runtime and export (export/bench/rss_probe.py: VmHWM after loading and
after the headline work) next to the export's weight bytes. With `--int8-export`, BLEU of fp32 vs
INT8 ORT on the test split (paired bootstrap).

`_run` reads as its steps:
  load      the baseline runtime, the checkpoint and the torch model the export holds, the exports, the
            sentences, the matmul roofline
  engines   the engines timed side by side and the pairs compared (a baseline runtime loads its exports here,
            so a foreign checkpoint is refused before any timing)
  header    the report's description of the run, printed in one line
  grid      every mode × search × batch point, natural-mode targets checked
  headline  fixed-length beam 5 × batch 32 with at least 3 rounds: from the grid, else measured apart
  paper     the GHT paper's speed setting (--paper-batch 0 leaves it out)
  memory    a fresh torch-free process per runtime and export on the headline's batches
  pruning   with --pruned-export: pruned vs unpruned speed on the last point's batches, beside the FLOP ratio
  int8      with --int8-export: BLEU of fp32 vs INT8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import torch

from export import runtime as runtime_package
from export.bench import rss_probe
from export.bench.roofline import MachineLimits, decoder_steps, matmul_flops, search_matmuls, step_weight_bytes
from export.bench.table import machine, paired_ratio
from export.graph import ExportError
from export.pruning import prune
from export.runtime import ExportedModel, ExportRuntimeError, Search, load
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.data import build_splits
from zoo.errors import one_line_errors
from zoo.flops import model_flops
from zoo.generate import generate
from zoo.metrics import paired_bootstrap
from zoo.model import Transformer

TARGETS = {("greedy", 1): 1.5, ("beam5", 32): 1.2}  # ORT / torch sentences-per-second, natural mode
HEADLINE_BEAM, HEADLINE_BATCH, HEADLINE_SENTENCES = 5, 32, 64  # the fixed-length point every run measures
HEADLINE_MIN_ROUNDS = 3
BASELINE_MODULE = "export_bench_baseline_runtime"  # the module name another runtime is imported under
SQUARE = (1024, 1024, 1024)  # the matmul of the header's roofline: what a kernel reaches at its best
RUNTIME_FILE = Path(runtime_package.__file__).parent.resolve()  # the runtime engine `ort` runs (export.runtime)


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


def graph_weight_bytes(path: str | Path) -> int:
    """Bytes of every initializer of an ONNX graph, from dims × element size: tensors kept in external data
    files count without being read, and nothing is deduplicated (a tied embedding in both graphs counts twice)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(
        math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in graph.initializer
    )


def export_weights(runtime: ExportedModel) -> dict[str, Any]:
    """What the export weighs: initializer bytes per graph (what ORT holds), and the exported model's unique
    parameters from the manifest (shared tensors once) at 4 bytes each — the fp32 model the graphs encode."""
    graphs = runtime.manifest["graphs"]
    per_graph = {k: graph_weight_bytes(runtime.directory / graphs[k]["file"]) for k in ("encoder", "decoder")}
    params = runtime.manifest.get("size", {}).get("after", {}).get("params")
    return {
        "encoder_bytes": per_graph["encoder"],
        "decoder_bytes": per_graph["decoder"],
        "graph_bytes": sum(per_graph.values()),
        "unique_params": params,
        "unique_param_bytes_fp32": 4 * params if params is not None else None,
    }


def fresh_process_rss(
    runtime_file: Path, export_dir: Path, batches: list[np.ndarray], threads: int, spinning: bool, fixed_len: int
) -> dict[str, Any]:
    """Peak RSS (MB) of a new interpreter that imports only `runtime_file` (a runtime package or file), loads
    the export and decodes `batches` once with beam 5 to exactly `fixed_len` tokens (export/bench/rss_probe.py): what
    a torch-free server pays, which this process — torch, the checkpoint, every engine — cannot show."""
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as tmp:
        work = Path(tmp) / "batches.npz"
        np.savez(work, *batches)
        command = [sys.executable, str(Path(rss_probe.__file__).resolve()), "--runtime", str(runtime_file)]
        command += ["--export", str(export_dir), "--batches", str(work), "--threads", str(threads)]
        command += ["--beam", str(HEADLINE_BEAM), "--fixed-len", str(fixed_len)]
        command += ["--spinning"] if spinning else []
        proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExportError(f"the memory probe failed ({' '.join(command)}): {proc.stderr.strip()[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "after_load_mb": out["after_load_bytes"] / 1e6,
        "peak_mb": out["peak_bytes"] / 1e6,
        "seconds": out["seconds"],
        "sentences": out["sentences"],
        "torch_imported": out["torch_imported"],
    }


# ---------------------------------------------------------------------------------------------- baseline runtime
def sha256_file(path: Path) -> str:
    """Which runtime a report measured (paths move, worktrees get removed): a runtime.py file's sha256, or a
    runtime package's — the sha256 of what `sha256sum *.py` prints in it (files in name order)."""
    if path.is_dir():
        lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in sorted(path.glob("*.py"))]
        return hashlib.sha256("".join(lines).encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_runtime(path: Path) -> bool:
    """A runtime.py file, or a runtime package (its __init__.py beside model.py)."""
    return path.is_file() or ((path / "__init__.py").is_file() and (path / "model.py").is_file())


def resolve_runtime(given: str | Path) -> Path:
    """The runtime `--baseline-runtime` names: a runtime package or an older commit's runtime.py itself, or a
    checkout (a `git worktree`) holding export/runtime/ or export/runtime.py, or an export/ directory holding
    either."""
    path = Path(given).expanduser()
    fix = (
        "give the runtime package export/runtime/, an older commit's export/runtime.py, or a checkout holding "
        "either (e.g. `git worktree add /tmp/base <commit>`, then --baseline-runtime /tmp/base)"
    )
    if path.is_dir():
        candidates = [path, path / "export" / "runtime", path / "export" / "runtime.py"]
        for candidate in (*candidates, path / "runtime", path / "runtime.py"):
            if candidate.exists() and _is_runtime(candidate):
                return candidate.resolve()
        raise ExportError(
            f"--baseline-runtime {path}: no export/runtime.py or runtime.py in that directory, nor a runtime "
            f"package; {fix}"
        )
    if not path.is_file():
        raise ExportError(f"--baseline-runtime {path}: no such file; {fix}")
    return path.resolve()


def load_baseline_runtime(given: str | Path) -> tuple[Path, ModuleType]:
    """Import another version of the runtime next to export.runtime (its own module name, its own classes)."""
    path = resolve_runtime(given)
    try:
        module = rss_probe.load_runtime_file(path, BASELINE_MODULE)
    except Exception as exc:  # anything the file raises on import: say which file and what
        raise ExportError(
            f"--baseline-runtime {path} cannot be imported ({type(exc).__name__}: {exc}); give a self-contained "
            "runtime, export/runtime/ or an older export/runtime.py (stdlib, numpy, onnxruntime, sentencepiece)"
        ) from exc
    if not callable(getattr(module, "load", None)) or not hasattr(module, "Search"):
        raise ExportError(
            f"--baseline-runtime {path} does not define load() and Search; give the export/runtime.py (or "
            "export/runtime/) of a checkout"
        )
    return path, module


def load_with_baseline(
    module: ModuleType, file: Path, export_dir: str, ours: ExportedModel, flag: str, threads: int, spinning: bool
) -> Any:
    """`module.load(export_dir)` — an export of the checkpoint `ours` encodes (sha256 checked: else the ratios
    compare two models) — its failures as one line: the baseline's exceptions are its own classes (not
    export.runtime's), and an old runtime may not read an export made for a newer runtime format."""
    try:
        baseline = module.load(export_dir, threads=threads, spinning=spinning)
    except Exception as exc:
        raise ExportError(
            f"the baseline runtime {file} cannot load {export_dir} ({type(exc).__name__}: {exc}); compare runtimes "
            "on an export both can read (one made by the baseline's commit, if the export format changed since)"
        ) from exc
    mine = ours.manifest["checkpoint"]["sha256"]
    theirs = baseline.manifest.get("checkpoint", {}).get("sha256")
    if mine != theirs:
        raise ExportError(
            f"{flag} {baseline.directory} was exported from another checkpoint (sha256 {str(theirs)[:12]}) "
            f"than {ours.directory} ({mine[:12]}); export the same checkpoint with the baseline's commit"
        )
    return baseline


def search_for(engine: Any, search: Search) -> Any:
    """`search` as the Search class of the runtime module that defined `engine` (a baseline runtime has its
    own class; fields it does not know are left out)."""
    cls = sys.modules[type(engine).__module__].Search
    if cls is Search:
        return search
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in asdict(search).items() if k in known})


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

    def runner(name: str, kind: str, engine: Any) -> Callable[[], None]:
        if kind == "torch":

            def run() -> None:
                results[name] = [h for src in tensors for h in generate(engine, src, search)]

        else:
            own = search_for(engine, search)

            def run() -> None:
                results[name] = [h for src in batches for h in engine.generate(src, own)]

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
    at batch 1: the weight bytes every step reads over the measured read bandwidth; the encoder's time is in
    `seconds` too, so that share is a lower bound of the decoder's own."""
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
    return out


def pair(point: dict[str, Any], engine: str, baseline: str) -> dict[str, Any] | None:
    """The point's comparison of `engine` against `baseline`, if it made one."""
    return next((p for p in point["pairs"] if (p["engine"], p["baseline"]) == (engine, baseline)), None)


def _pairs_text(p: dict[str, Any]) -> str:
    same = p.get("same_model", True)
    return ", ".join(
        f"{q['engine']}/{q['baseline']} {q['ratio']:.2f}x"
        + f" (paired {q['paired_ratio']:.2f}x)"
        + (f" (same hyps {q['identical']}/{p['sentences']})" if same else "")
        for q in p["pairs"]
    )


def _line(p: dict[str, Any], roofline: float | None) -> str:
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
            s += ")"
        if e["peak_rss_rise_mb"] is not None:
            s += f" peak +{e['peak_rss_rise_mb']:.0f}MB"
        parts.append(s)
    ratios = f"  {_pairs_text(p)}" if p["pairs"] else ""
    return f"  {p['label']:<37} " + " | ".join(parts) + ratios


def _mb(n: float) -> str:
    """Bytes as MB (1e6), whole above 10 MB; a tiny test model's weights would print as 0 otherwise."""
    return f"{n / 1e6:.0f}" if n >= 1e7 else f"{n / 1e6:.2f}"


def _memory_line(kind: str, fixed_len: int, entry: dict[str, Any]) -> str:
    w = entry["weights"]
    engines = ", ".join(
        f"{name} peak {_mb(m['peak_mb'] * 1e6)} MB (after load {_mb(m['after_load_mb'] * 1e6)} MB)"
        for name, m in entry["engines"].items()
    )
    unique = f"{_mb(w['unique_param_bytes_fp32'])} MB weights" if w["unique_params"] is not None else "weights"
    graphs = f"unique fp32 parameters; encoder {_mb(w['encoder_bytes'])} + decoder {_mb(w['decoder_bytes'])} MB"
    work = f"beam {HEADLINE_BEAM} × batch {HEADLINE_BATCH}, fixed {fixed_len}"
    return f"memory (fresh process, {work}): {kind} {engines} for {unique} ({graphs} in the graphs)"


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
    baseline = load_baseline_runtime(args.baseline_runtime) if args.baseline_runtime else None
    torch.set_num_threads(args.threads)
    inputs = _load_inputs(args)
    sweep = _engines(args, inputs, baseline)
    report = _report_header(args, inputs, sweep)
    last_batches = _grid(args, inputs, sweep)
    head_batches = _headline(args, inputs, sweep, report)
    if args.paper_batch > 0:  # 0: leave the paper's point out
        last_batches = _paper_point(args, inputs, sweep)
    report["memory"] = _memory(args, inputs, sweep, head_batches)
    if inputs.limits is not None:  # every shape the points timed
        report["limits"] = inputs.limits.as_json()
    if args.pruned_export:
        report["pruning"] = _pruning(args, inputs, last_batches)
    if inputs.int8 is not None:
        _int8_bleu(args, inputs, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


# ---------------------------------------------------------------------------------------------- the steps' results
@dataclass
class _Inputs:
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
class _Sweep:
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


# ---------------------------------------------------------------------------------------------- load
def _load_inputs(args: argparse.Namespace) -> _Inputs:
    """The exports, the torch model they were made from, the sentences and the roofline, before any timing."""
    payload = load_checkpoint(args.checkpoint) if args.checkpoint else None
    runtime = load(args.export, threads=args.threads, spinning=args.ort_spinning)
    if args.pruned_export and runtime.manifest.get("heads_removed") and runtime.manifest.get("head_plan"):
        raise ExportError(
            "--export must be the unpruned model (exported with remove_heads=false) when --pruned-export is given"
        )
    # torch runs the very model the export holds: heads removed if the export removed them, else gated
    model = None
    if payload is not None:
        model = prune(
            model_from_checkpoint(payload),
            runtime.manifest.get("head_plan") or {},
            remove=bool(runtime.manifest.get("heads_removed", True)),
        )[0]
    int8 = load(args.int8_export, threads=args.threads, spinning=args.ort_spinning) if args.int8_export else None
    sizes = (args.paper_batch, args.batch1_sentences, HEADLINE_SENTENCES, 64, *args.batches)
    texts, refs = load_sentences(payload, args.src, max(sizes), runtime)
    limits = MachineLimits.measure(args.threads) if args.roofline else None
    roofline = limits.gflops(SQUARE) if limits is not None else None
    return _Inputs(payload, runtime, int8, model, texts, refs, roofline, limits)


# ---------------------------------------------------------------------------------------------- engines
def _engines(args: argparse.Namespace, inputs: _Inputs, baseline: tuple[Path, ModuleType] | None) -> _Sweep:
    """Which engines run and which pairs are compared; a baseline runtime must load its export first, so a
    foreign checkpoint is refused before any timing."""
    engines: dict[str, tuple[str, Any]] = {}
    pairs: list[tuple[str, str]] = []
    baseline_exports: dict[str, Path] = {}
    if not args.no_torch:
        engines["torch"] = ("torch", inputs.model)

    def add_baseline(kind: str, name: str, ours: ExportedModel, given: str | None, flag: str) -> None:
        assert baseline is not None
        directory = given or str(ours.directory)
        file, module = baseline
        engines[f"{name}-baseline"] = (
            "ort",
            load_with_baseline(module, file, directory, ours, flag, args.threads, args.ort_spinning),
        )
        baseline_exports[kind] = Path(directory)
        pairs.append((name, f"{name}-baseline"))

    if baseline is not None:
        add_baseline("fp32", "ort", inputs.runtime, args.baseline_export, "--baseline-export")
    engines["ort"] = ("ort", inputs.runtime)
    if inputs.int8 is not None:
        if baseline is not None:
            add_baseline("int8", "int8", inputs.int8, args.baseline_int8_export, "--baseline-int8-export")
        engines["int8"] = ("ort", inputs.int8)
    if not args.no_torch:
        pairs.append(("ort", "torch"))
    if inputs.int8 is not None and baseline is None:
        pairs.append(("int8", "ort"))  # what quantisation buys (its hypotheses may differ)
    flops_models = {name: inputs.model for name in engines} if inputs.model is not None else None
    baseline_file = baseline[0] if baseline is not None else None
    return _Sweep(engines, pairs, flops_models, inputs.limits, inputs.runtime.pad_id, baseline_file, baseline_exports)


def _report_header(args: argparse.Namespace, inputs: _Inputs, sweep: _Sweep) -> dict[str, Any]:
    """The report's description of what was measured (its points are filled in by the later steps), printed in
    one line."""
    baseline_file = sweep.baseline_file
    report: dict[str, Any] = {
        "checkpoint": inputs.payload["path"] if inputs.payload is not None else None,
        "export": str(args.export),
        "int8_export": str(args.int8_export) if args.int8_export else None,
        "baseline_exports": {kind: str(path) for kind, path in sweep.baseline_exports.items()},
        "runtime": {"path": str(RUNTIME_FILE), "sha256": sha256_file(RUNTIME_FILE)},
        "baseline_runtime": (
            {"path": str(baseline_file), "sha256": sha256_file(baseline_file)} if baseline_file is not None else None
        ),
        "engines": list(sweep.engines),
        "machine": machine(),
        "threads": args.threads,
        "ort_spinning": args.ort_spinning,
        "repeats": args.repeats,
        "fixed_len": args.fixed_len,
        "matmul_roofline_gflops": inputs.roofline,
        "read_bandwidth_gbps": inputs.limits.bandwidth_gbps if inputs.limits else None,
        "model": inputs.runtime.manifest["model_config"],
        "points": sweep.points,
    }
    roofline = inputs.roofline
    roof = f"fp32 matmul roofline {roofline:.1f} GFLOP/s (1024³, the faster of torch.mm and ORT), " if roofline else ""
    base = (
        f"; baseline runtime {baseline_file} (sha256 {report['baseline_runtime']['sha256'][:12]})"
        if baseline_file is not None
        else ""
    )
    print(
        f"{inputs.runtime.name}: engines {', '.join(sweep.engines)}; threads {args.threads}, {roof}"
        f"medians of {args.repeats} interleaved runs{base}"
    )
    return report


# ---------------------------------------------------------------------------------------------- points
def _grid(args: argparse.Namespace, inputs: _Inputs, sweep: _Sweep) -> list[np.ndarray]:
    """Every mode × search × batch point, each checked against its target where one is set; returns the last
    point's batches."""
    per_batch = {1: args.batch1_sentences, 32: 64, 256: 256}
    batches: list[np.ndarray] = []
    for mode in args.modes:
        for spec in args.searches:
            for batch in args.batches:
                fixed = args.fixed_len if mode == "fixed" else None
                batches = make_batches(inputs.runtime, inputs.texts, batch, per_batch.get(batch, batch))
                p = sweep.measure(f"{mode} {spec} batch {batch}", batches, _searches(spec, fixed), args.repeats, fixed)
                p["mode"] = mode
                target = TARGETS.get((spec, batch)) if mode == "natural" else None
                vs_torch = pair(p, "ort", "torch")
                if target and vs_torch:
                    p["target"], p["meets_target"] = target, vs_torch["ratio"] >= target
                    met = "met" if p["meets_target"] else "MISSED"
                    print(_line(p, inputs.roofline) + f"  target ≥{target}x: {met}", flush=True)
                else:
                    print(_line(p, inputs.roofline), flush=True)
    return batches


def _headline(args: argparse.Namespace, inputs: _Inputs, sweep: _Sweep, report: dict[str, Any]) -> list[np.ndarray]:
    """The headline, fixed-length beam 5 × batch 32: from the grid when it holds it with enough rounds, else
    measured apart; returns its batches (the memory probe decodes them)."""
    spec, batch = f"beam{HEADLINE_BEAM}", HEADLINE_BATCH
    head_batches = make_batches(inputs.runtime, inputs.texts, batch, HEADLINE_SENTENCES)
    label = f"fixed {spec} batch {batch}"
    head = next((p for p in sweep.points if p["label"] == label and p["rounds"] >= HEADLINE_MIN_ROUNDS), None)
    if head is None:
        rounds = max(args.repeats, HEADLINE_MIN_ROUNDS)
        search = _searches(spec, args.fixed_len)
        head = sweep.measure(f"headline: {label}", head_batches, search, rounds, args.fixed_len)
        head["mode"] = "fixed"
        print(_line(head, inputs.roofline), flush=True)
    report["headline"] = {"label": head["label"], "rounds": head["rounds"], "pairs": head["pairs"]}
    if head["pairs"]:
        print(
            f"headline (fixed beam {HEADLINE_BEAM} × batch {batch}, {args.fixed_len} tokens, median of "
            f"{head['rounds']} interleaved rounds): {_pairs_text(head)}",
            flush=True,
        )
    return head_batches


def _paper_point(args: argparse.Namespace, inputs: _Inputs, sweep: _Sweep) -> list[np.ndarray]:
    """The GHT paper's speed setting (beam 5, at most 10 output tokens); returns its batches."""
    paper = Search(beam_size=5, max_len_a=0.0, max_len_b=10)
    batches = make_batches(inputs.runtime, inputs.texts, args.paper_batch, args.paper_batch)
    p = sweep.measure(f"paper: beam 5, batch {args.paper_batch}, max len 10", batches, paper, args.repeats, None)
    print(_line(p, inputs.roofline), flush=True)
    return batches


# ---------------------------------------------------------------------------------------------- memory
def _memory(args: argparse.Namespace, inputs: _Inputs, sweep: _Sweep, head_batches: list[np.ndarray]) -> dict[str, Any]:
    """Peak RSS of a torch-free process per runtime and export on the headline's batches: what a server pays,
    which this process cannot show."""
    memory: dict[str, Any] = {
        "beam": HEADLINE_BEAM,
        "batch": HEADLINE_BATCH,
        "sentences": HEADLINE_SENTENCES,
        "fixed_len": args.fixed_len,
    }
    runtimes = {"ort": RUNTIME_FILE, **({"ort-baseline": sweep.baseline_file} if sweep.baseline_file else {})}
    for kind, rt in (("fp32", inputs.runtime), ("int8", inputs.int8)):
        if rt is None:
            continue
        entry: dict[str, Any] = {"export": str(rt.directory), "weights": export_weights(rt), "engines": {}}
        for name, file in runtimes.items():
            directory = sweep.baseline_exports.get(kind, rt.directory) if name == "ort-baseline" else rt.directory
            entry["engines"][name] = fresh_process_rss(
                file, directory, head_batches, args.threads, args.ort_spinning, args.fixed_len
            )
        memory[kind] = entry
        print(_memory_line(kind, args.fixed_len, entry), flush=True)
    return memory


# ---------------------------------------------------------------------------------------------- pruning
def _pruning(args: argparse.Namespace, inputs: _Inputs, batches: list[np.ndarray]) -> dict[str, Any]:
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
            _line(p, inputs.roofline) + f"  time ratio {1 / p['ratio']:.2f} vs analytic FLOP ratio "
            f"{prune_report['analytic_flops_ratio']:.2f}",
            flush=True,
        )
    return prune_report


# ---------------------------------------------------------------------------------------------- int8
def _int8_bleu(args: argparse.Namespace, inputs: _Inputs, report: dict[str, Any]) -> None:
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="run dir or .pt the export was made from (needed unless --no-torch)")
    ap.add_argument("--export", required=True, help="export dir (python -m export …)")
    ap.add_argument("--pruned-export", help="an export of the same checkpoint with a head plan")
    ap.add_argument("--int8-export", help="an export of the same checkpoint with quantize=true (BLEU cost)")
    ap.add_argument(
        "--baseline-runtime",
        help="another version's runtime: export/runtime/, an older export/runtime.py, or a checkout holding one "
        "(e.g. from `git worktree add`): "
        "timed against the working tree's runtime on the same exports",
    )
    ap.add_argument(
        "--baseline-export",
        help="the export the baseline runtime reads (default: --export); an export of the same checkpoint made by "
        "the baseline's commit, when the export format changed since",
    )
    ap.add_argument("--baseline-int8-export", help="as --baseline-export, for --int8-export")
    ap.add_argument("--no-torch", action="store_true", help="leave out the PyTorch engine (and its long runs)")
    ap.add_argument("--src", help="source sentences file (default: the checkpoint's test split)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ort-spinning", action="store_true", help="let ORT's idle threads spin-wait")
    ap.add_argument("--modes", default="natural,fixed", type=lambda s: s.split(","))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", default="1,32,256", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--searches", default="greedy,beam5", type=lambda s: s.split(","))
    ap.add_argument("--fixed-len", type=int, default=30, help="output tokens in the fixed-length mode")
    ap.add_argument("--batch1-sentences", type=int, default=16, help="sentences decoded one by one per run")
    ap.add_argument(
        "--paper-batch",
        type=int,
        default=256,
        help="batch of the paper's speed setting (beam 5, len 10); 0 leaves it out",
    )
    ap.add_argument("--bleu-sentences", type=int, default=None, help="test sentences for the int8 BLEU check")
    ap.add_argument(
        "--roofline",
        action="store_true",
        help="set each fixed-length fp32 point against this machine's limits, measured in the same run (the step's "
        "matmul roofline; at batch 1 the read bandwidth); needs --checkpoint (the step's shapes)",
    )
    ap.add_argument("--json", help="write the full report here")
    args = ap.parse_args(argv)
    if args.roofline and not args.checkpoint:
        ap.error("--roofline needs --checkpoint: the step's matmul shapes come from the torch model")
    if not args.checkpoint and not args.no_torch:
        ap.error("--checkpoint is required unless --no-torch is given")
    if args.pruned_export and not args.checkpoint:
        ap.error("--pruned-export needs --checkpoint (the analytic FLOP ratio is computed on the torch models)")
    with one_line_errors(ExportRuntimeError):
        run(args)


if __name__ == "__main__":
    main()
