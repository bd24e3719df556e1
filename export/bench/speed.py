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

Why this shape (zoo/DESIGN.md §3c): the baseline is our best torch path — `zoo.decoding.generate` with the
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

One point — its batches, the engines timed interleaved, its record and line — is export/bench/points.py; peak
memory is export/bench/memory.py; the pruning and int8 steps, which compare two exports of one checkpoint,
are export/bench/variants.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from export import runtime as runtime_package
from export.bench import rss_probe
from export.bench.memory import export_weights, fresh_process_rss
from export.bench.points import Inputs, Sweep, load_sentences, make_batches, pair, pairs_text, point_line, searches
from export.bench.roofline import MachineLimits
from export.bench.table import machine
from export.bench.variants import int8_bleu, pruned_vs_unpruned
from export.graph import ExportError
from export.pruning import prune
from export.runtime import ExportedModel, ExportRuntimeError, Search, load, sha256_file
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.errors import one_line_errors

TARGETS = {("greedy", 1): 1.5, ("beam5", 32): 1.2}  # ORT / torch sentences-per-second, natural mode
HEADLINE_BEAM, HEADLINE_BATCH, HEADLINE_SENTENCES = 5, 32, 64  # the fixed-length point every run measures
HEADLINE_MIN_ROUNDS = 3
BASELINE_MODULE = "export_bench_baseline_runtime"  # the module name another runtime is imported under
SQUARE = (1024, 1024, 1024)  # the matmul of the header's roofline: what a kernel reaches at its best
RUNTIME_FILE = Path(runtime_package.__file__).parent.resolve()  # the runtime engine `ort` runs (export.runtime)


# ---------------------------------------------------------------------------------------------- baseline runtime
def runtime_sha256(path: Path) -> str:
    """Which runtime a report measured (paths move, worktrees get removed): a runtime.py file's sha256, or a
    runtime package's — the sha256 of what `sha256sum *.py` prints in it (files in name order)."""
    if path.is_dir():
        lines = [f"{sha256_file(f)}  {f.name}\n" for f in sorted(path.glob("*.py"))]
        return hashlib.sha256("".join(lines).encode()).hexdigest()
    return sha256_file(path)


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
        report["pruning"] = pruned_vs_unpruned(args, inputs, last_batches)
    if inputs.int8 is not None:
        int8_bleu(args, inputs, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


# ---------------------------------------------------------------------------------------------- load
def _load_inputs(args: argparse.Namespace) -> Inputs:
    """The exports, the torch model they were made from, the sentences and the roofline, before any timing."""
    payload = load_checkpoint(args.checkpoint) if args.checkpoint else None
    state = "host" if args.device_state else "auto"
    runtime = load(args.export, threads=args.threads, spinning=args.ort_spinning, state=state)
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
    return Inputs(payload, runtime, int8, model, texts, refs, roofline, limits)


# ---------------------------------------------------------------------------------------------- engines
def _engines(args: argparse.Namespace, inputs: Inputs, baseline: tuple[Path, ModuleType] | None) -> Sweep:
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
            load_with_baseline(module, file, directory, ours, flag, args.threads, args.ort_spinning is True),
        )
        baseline_exports[kind] = Path(directory)
        pairs.append((name, f"{name}-baseline"))

    if baseline is not None:
        add_baseline("fp32", "ort", inputs.runtime, args.baseline_export, "--baseline-export")
    engines["ort"] = ("ort", inputs.runtime)
    if args.device_state:
        device = load(args.export, threads=args.threads, spinning=args.ort_spinning, state="device")
        engines["ort-device"] = ("ort", device)
        pairs.append(("ort-device", "ort"))
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
    return Sweep(engines, pairs, flops_models, inputs.limits, inputs.runtime.pad_id, baseline_file, baseline_exports)


def _report_header(args: argparse.Namespace, inputs: Inputs, sweep: Sweep) -> dict[str, Any]:
    """The report's description of what was measured (its points are filled in by the later steps), printed in
    one line."""
    baseline_file = sweep.baseline_file
    report: dict[str, Any] = {
        "checkpoint": inputs.payload["path"] if inputs.payload is not None else None,
        "export": str(args.export),
        "int8_export": str(args.int8_export) if args.int8_export else None,
        "baseline_exports": {kind: str(path) for kind, path in sweep.baseline_exports.items()},
        "runtime": {"path": str(RUNTIME_FILE), "sha256": runtime_sha256(RUNTIME_FILE)},
        "baseline_runtime": (
            {"path": str(baseline_file), "sha256": runtime_sha256(baseline_file)} if baseline_file is not None else None
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
def _grid(args: argparse.Namespace, inputs: Inputs, sweep: Sweep) -> list[np.ndarray]:
    """Every mode × search × batch point, each checked against its target where one is set; returns the last
    point's batches."""
    per_batch = {1: args.batch1_sentences, 32: 64, 256: 256}
    batches: list[np.ndarray] = []
    for mode in args.modes:
        for spec in args.searches:
            for batch in args.batches:
                fixed = args.fixed_len if mode == "fixed" else None
                batches = make_batches(inputs.runtime, inputs.texts, batch, per_batch.get(batch, batch))
                p = sweep.measure(f"{mode} {spec} batch {batch}", batches, searches(spec, fixed), args.repeats, fixed)
                p["mode"] = mode
                target = TARGETS.get((spec, batch)) if mode == "natural" else None
                vs_torch = pair(p, "ort", "torch")
                if target and vs_torch:
                    p["target"], p["meets_target"] = target, vs_torch["ratio"] >= target
                    met = "met" if p["meets_target"] else "MISSED"
                    print(point_line(p, inputs.roofline) + f"  target ≥{target}x: {met}", flush=True)
                else:
                    print(point_line(p, inputs.roofline), flush=True)
    return batches


def _headline(args: argparse.Namespace, inputs: Inputs, sweep: Sweep, report: dict[str, Any]) -> list[np.ndarray]:
    """The headline, fixed-length beam 5 × batch 32: from the grid when it holds it with enough rounds, else
    measured apart; returns its batches (the memory probe decodes them)."""
    spec, batch = f"beam{HEADLINE_BEAM}", HEADLINE_BATCH
    head_batches = make_batches(inputs.runtime, inputs.texts, batch, HEADLINE_SENTENCES)
    label = f"fixed {spec} batch {batch}"
    head = next((p for p in sweep.points if p["label"] == label and p["rounds"] >= HEADLINE_MIN_ROUNDS), None)
    if head is None:
        rounds = max(args.repeats, HEADLINE_MIN_ROUNDS)
        search = searches(spec, args.fixed_len)
        head = sweep.measure(f"headline: {label}", head_batches, search, rounds, args.fixed_len)
        head["mode"] = "fixed"
        print(point_line(head, inputs.roofline), flush=True)
    report["headline"] = {"label": head["label"], "rounds": head["rounds"], "pairs": head["pairs"]}
    if head["pairs"]:
        print(
            f"headline (fixed beam {HEADLINE_BEAM} × batch {batch}, {args.fixed_len} tokens, median of "
            f"{head['rounds']} interleaved rounds): {pairs_text(head)}",
            flush=True,
        )
    return head_batches


def _paper_point(args: argparse.Namespace, inputs: Inputs, sweep: Sweep) -> list[np.ndarray]:
    """The GHT paper's speed setting (beam 5, at most 10 output tokens); returns its batches."""
    paper = Search(beam_size=5, max_len_a=0.0, max_len_b=10)
    batches = make_batches(inputs.runtime, inputs.texts, args.paper_batch, args.paper_batch)
    p = sweep.measure(f"paper: beam 5, batch {args.paper_batch}, max len 10", batches, paper, args.repeats, None)
    print(point_line(p, inputs.roofline), flush=True)
    return batches


# ---------------------------------------------------------------------------------------------- memory
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


def _memory(args: argparse.Namespace, inputs: Inputs, sweep: Sweep, head_batches: list[np.ndarray]) -> dict[str, Any]:
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
                file, directory, head_batches, args.threads, args.ort_spinning, args.fixed_len, HEADLINE_BEAM
            )
        memory[kind] = entry
        print(_memory_line(kind, args.fixed_len, entry), flush=True)
    return memory


def spinning_choice(text: str) -> bool | str:
    """--ort-spinning's value → the runtime's `spinning`: "both" → True, "decoder" → "decoder", "false" → False,
    "auto" → "auto" (export.load's default, resolved once for every engine: `main`); anything else is an argparse
    error naming them (it was read as False before, silently)."""
    choices: dict[str, bool | str] = {"both": True, "decoder": "decoder", "false": False, "auto": "auto"}
    if text == "shared":  # onnxruntime then refuses every session with a pool of its own: the baseline's, roofline's
        raise argparse.ArgumentTypeError(
            "'shared' is one pool for the whole process, and onnxruntime then refuses the sessions this bench also "
            "makes; time it against the others in fresh processes: python -m export.bench.spin_pairs"
        )
    if text not in choices:
        raise argparse.ArgumentTypeError(f"{text!r}: give auto, both, decoder or false (whose idle threads spin)")
    return choices[text]


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
    ap.add_argument(
        "--ort-spinning",
        nargs="?",
        const=True,
        default="auto",
        type=spinning_choice,
        help="whose ORT idle threads spin-wait: `auto` (the default: export.load's, resolved for --threads), both "
        "sessions' (no value, or `both`), `decoder` the decoder's only, or `false` none",
    )
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
    ap.add_argument(
        "--device-state",
        action="store_true",
        help="also time the runtime with its decoding state on the execution device (state=device: I/O binding) as "
        "engine ort-device against the host-owned state (ort, state=host) on the same export: the ratio says which "
        "path the provider's default should be",
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
        # every engine (baseline runtimes included) gets the setting export.load's default resolves to here
        args.ort_spinning = runtime_package.resolve_spinning(args.ort_spinning, args.threads)
        run(args)


if __name__ == "__main__":
    main()
