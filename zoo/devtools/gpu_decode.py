"""Decoding on a lent GPU: the export runtime's host-cache path against its device-resident path (I/O binding), fp32
(TF32 off) and fp16, beside the same machine's CPU threads — sentences/s and target tokens/s per search and batch.

Why this shape: decoding speed is a property of the architecture and of how many tokens are produced, not of the
weights (zoo/report/speed_models.py), so the GPU machine needs no corpus and no trained checkpoint: `prepare` (here)
writes the workload — the first test sources, the tokens each must produce (the lengths of a trained CPU-preset
transformer's stored test hypotheses), its tokenizer and the two architectures (the record's CPU preset and
size=base) — and `run` (there) rebuilds both with random weights, exports them fp32 and fp16, and times every
engine on the same batches in interleaved rounds with every search forced to those lengths (so a ratio of
sentences/s is a ratio of tokens/s). Hypotheses are compared between engines (agreement share per pair).

usage:
  python -m zoo.devtools.gpu_decode prepare RECORD.json.gz WORK_DIR [SENTENCES]
  python -m zoo.devtools.gpu_decode pack WORK_DIR WHEEL PARTS_DIR [PART_MB]
  python -m zoo.devtools.gpu_decode run WORK_DIR OUT_JSON [DEADLINE_S] [CPU_THREADS]
  python -m zoo.devtools.gpu_decode serve WORK_DIR OUT_DIR [CONCURRENCY ...]
  python -m zoo.devtools.gpu_decode render OUT_JSON TABLE_MD
environment (serve): SERVE_PYTHONPATH is put first on the served process' path (its tritonserver, numpy < 2, client).
environment (run): FP16=0 leaves the fp16 exports out; POINTS=greedy:1,beam5:32 limits the grid; MODELS=cpu_preset
limits the architectures (SERVE_MODEL=cpu_preset: `serve`'s); DRYRUN=1 runs the "cuda" engines, the fp16
verification and the served model on the CPU (a rehearsal here).

How it ran on the lent machine (its image has torch, onnx and onnxscript, not Hydra or onnxruntime-gpu, and one call
carries at most 64 MiB): `prepare` and `pack` here write WORK_DIR (the workload and `site/`, this checkout's pure-Python
hydra, omegaconf and antlr4) and PARTS_DIR/<k>/ (the onnxruntime-gpu wheel cut into parts of PART_MB); calls that
carry one part each copy it to /tmp/parts on the warm machine, and the last call, carrying WORK_DIR, runs
`cat /tmp/parts/* > /tmp/ort.whl && pip install --no-deps --target /tmp/site …; PYTHONPATH=/tmp/site:WORK_DIR/site
python -m zoo.devtools.gpu_decode run WORK_DIR $OUT/gpu_decode.json`.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.time()
SEARCHES = {"greedy": 1, "beam5": 5}
BATCHES = (1, 32, 128)
BATCH1_SENTENCES = 16  # sentences decoded one at a time per round at batch 1
ROUNDS = 3
# how each precision is exported (python -m export overrides); verification sentences kept few: the parity the
# export checks is not what is measured here, and the base model's torch reference runs on the CPU
# fp16 is verified against fp32 on the GPU's own kernels (fp16.provider=cuda) and its measured differences stored;
# the gates are opened (tolerance 1, agreement 0) because random weights give near-uniform distributions whose
# near-ties a trained model does not have, and the point here is the speed
EXPORTS = {
    "fp32": ["verify.sentences=4"],
    "fp16": [
        "verify.sentences=4",
        "precision=fp16",
        "fp16.provider=cuda",
        "fp16.tolerance=1.0",
        "fp16.min_agreement=0",
    ],
}
MODELS = {"cpu_preset": [], "base": ["size=base"]}  # zoo.train overrides on top of the record's entry
DRYRUN = os.environ.get("DRYRUN") == "1"
GPU = "cpu" if DRYRUN else "cuda"  # the provider of the engines named cuda-*


def say(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- prepare (here)
def prepare(record_path: str, work: Path, sentences: int = 256) -> None:
    """The workload `run` needs, from one stored run record of a translation suite (its test hypotheses give the
    lengths): work/workload.json (+ tokenizer.model)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from zoo.entries import CONF_DIR
    from zoo.report.speed_models import forced_lengths, speed_corpus

    record = json.loads(gzip.open(record_path).read())
    corpus = speed_corpus(record, record_path, sentences, work / "cache")
    lengths = forced_lengths(record, record_path, corpus)
    models = {}
    for name, extra in MODELS.items():
        if not extra:  # the record's own architecture
            models[name] = record["config"]["model"]
            continue
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = compose(config_name="train", overrides=[f"+model={record['entry']}", *extra]).model
        models[name] = OmegaConf.to_container(node, resolve=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / "tokenizer.model").write_bytes(corpus.tokenizer.model_bytes)
    payload = {
        "record": record_path,
        "entry": record["entry"],
        "texts": corpus.texts,
        "lengths": lengths,
        "data_config": corpus.data_config,
        "heldout": corpus.heldout,
        "models": models,
    }
    (work / "workload.json").write_text(json.dumps(payload))
    say(f"{len(corpus.texts)} sentences, {sum(lengths)} target tokens, models {list(models)} → {work}")


def pack(work: Path, wheel: Path, parts: Path, part_mb: int = 40) -> None:
    """WORK_DIR/site (Hydra and its two dependencies, pure Python, from this environment) and the wheel cut into
    numbered parts PARTS_DIR/<k>/part (one call's carry each)."""
    import shutil

    import antlr4
    import hydra
    import omegaconf

    site = work / "site"
    for module in (hydra, omegaconf, antlr4):
        source = Path(module.__file__).parent
        shutil.copytree(source, site / source.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    data = wheel.read_bytes()
    size = part_mb * 2**20
    for k, start in enumerate(range(0, len(data), size)):
        (parts / str(k)).mkdir(parents=True, exist_ok=True)
        (parts / str(k) / "part").write_bytes(data[start : start + size])
    say(f"site → {site}; {wheel.name} ({len(data) / 2**20:.0f} MiB) → {-(-len(data) // size)} parts in {parts}")


# ---------------------------------------------------------------------------------------------- run (there)
def machine_line() -> dict[str, Any]:
    """The GPU, its driver, the CPU and onnxruntime that ran."""
    import onnxruntime as ort

    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        gpu = "none (no nvidia-smi)"
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    return {
        "gpu": gpu,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ort": ort.__version__,
        "providers": ort.get_available_providers(),
    }


def build_exports(work: Path, wanted: list[str], models: list[str] | None = None) -> dict[tuple[str, str], Path]:
    """Random-weight checkpoints of both architectures and their exports (all in parallel processes)."""
    from zoo.data import Tokenizer
    from zoo.report.speed_models import SpeedCorpus, rebuild_checkpoint

    w = json.loads((work / "workload.json").read_text())
    corpus = SpeedCorpus(
        w["texts"], Tokenizer.from_bytes((work / "tokenizer.model").read_bytes()), w["data_config"], w["heldout"]
    )
    jobs, out = [], {}
    chosen = models or os.environ.get("MODELS", ",".join(w["models"])).split(",")
    for model, node in w["models"].items():
        if model not in chosen:
            continue
        record = {"config": {"model": node}, "entry": w["entry"]}
        checkpoint = rebuild_checkpoint(record, model, corpus, work / f"{model}.pt")
        for precision in wanted:
            target = work / f"export-{model}-{precision}"
            cmd = [sys.executable, "-m", "export", f"checkpoint={checkpoint}", f"out={target}", "overwrite=true"]
            extra = [o.replace("fp16.provider=cuda", "fp16.provider=cpu") if DRYRUN else o for o in EXPORTS[precision]]
            log = open(work / f"export-{model}-{precision}.log", "w")
            jobs.append(((model, precision), target, subprocess.Popen([*cmd, *extra], stdout=log, stderr=log)))
    for key, target, proc in jobs:
        if proc.wait() == 0:
            out[key] = target
        else:
            say(f"export {key} failed: {(work / f'export-{key[0]}-{key[1]}.log').read_text()[-1500:]}")
    say(f"exports made: {sorted(out)}")
    return out


def engines_for(exports: dict[tuple[str, str], Path], model: str, cpu_threads: int) -> dict[str, Any]:
    """The engines timed for one architecture: CUDA host path and device path (fp32), device path fp16, CPU."""
    from export import runtime

    engines = {}
    fp32, fp16 = exports.get((model, "fp32")), exports.get((model, "fp16"))
    if fp32 is not None:
        engines["cuda-host"] = runtime.load(fp32, provider=GPU, state="host", check_files=False)
        engines["cuda-device"] = runtime.load(fp32, provider=GPU, state="device", check_files=False)
    if fp16 is not None:
        engines["cuda-device-fp16"] = runtime.load(fp16, provider=GPU, state="device", check_files=False)
    if fp32 is not None:
        engines[f"cpu{cpu_threads}"] = runtime.load(fp32, provider="cpu", threads=cpu_threads, check_files=False)
    return engines


def time_point(engines: dict[str, Any], batches: list[Any], limits: list[Any], search: Any) -> dict[str, Any]:
    """Every engine over the same batches: a warm-up, then ROUNDS interleaved rounds (export.bench's)."""
    from export.bench.points import interleaved
    from export.bench.rss_probe import decode_batch

    hyps: dict[str, list[list[int]]] = {}

    def runner(name: str, engine: Any) -> Any:
        def decode() -> None:
            hyps[name] = [
                h for src, lim in zip(batches, limits, strict=True) for h in decode_batch(engine, src, search, lim)
            ]

        return decode

    times = interleaved({name: runner(name, engine) for name, engine in engines.items()}, ROUNDS)
    return {"times": times, "hyps": hyps}


def run(work: Path, out_json: Path, deadline: float = 420.0, cpu_threads: int = 16) -> None:
    """Export, then time the grid until `deadline` seconds after start; the JSON is rewritten after every point."""
    import numpy as np

    from export import runtime
    from export.runtime import generation

    report: dict[str, Any] = {"machine": machine_line(), "rounds": ROUNDS, "points": [], "skipped": []}
    say(f"machine {report['machine']}")
    w = json.loads((work / "workload.json").read_text())
    wanted = ["fp32"] + (["fp16"] if os.environ.get("FP16", "1") != "0" else [])
    exports = build_exports(work, wanted)
    manifests = {f"{m}-{p}": json.loads((d / "manifest.json").read_text()) for (m, p), d in exports.items()}
    report["exports"] = {
        k: {key: v.get(key) for key in ("verification", "verification_fp16")} for k, v in manifests.items()
    }

    only = os.environ.get("POINTS")
    grid = [(s, b) for s in SEARCHES for b in BATCHES]
    if only:
        grid = [(s, int(b)) for s, b in (p.split(":") for p in only.split(","))]
    for model in MODELS:
        engines = engines_for(exports, model, cpu_threads)
        if not engines:
            continue
        first = next(iter(engines.values()))
        encoded = first.encode_texts(w["texts"])
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        for search_name, batch in grid:
            if time.time() - T0 > deadline:
                report["skipped"].append(f"{model} {search_name} × {batch}")
                continue
            n = BATCH1_SENTENCES if batch == 1 else min(len(order), 4 * batch if batch < 128 else 128)
            picked = [order[i] for i in range(0, len(order), max(1, len(order) // n))][:n]
            groups = [picked[i : i + batch] for i in range(0, len(picked), batch)]
            batches = [generation.padded([encoded[i] for i in g], first.pad_id) for g in groups]
            limits = [runtime.forced_limits([w["lengths"][i] for i in g], first.max_positions) for g in groups]
            search = runtime.Search(beam_size=SEARCHES[search_name])
            measured = time_point(engines, batches, limits, search)
            tokens = sum(w["lengths"][i] for i in picked)
            point = {
                "model": model,
                "search": search_name,
                "batch": batch,
                "sentences": len(picked),
                "tokens": tokens,
                "engines": {},
            }
            base = measured["hyps"].get("cuda-host")
            for name, times in measured["times"].items():
                med = statistics.median(times)
                same = (
                    None
                    if base is None
                    else float(np.mean([a == b for a, b in zip(measured["hyps"][name], base, strict=True)]))
                )
                point["engines"][name] = {
                    "times_s": times,
                    "sentences_per_s": len(picked) / med,
                    "tokens_per_s": tokens / med,
                    "same_as_cuda_host": same,
                }
            report["points"].append(point)
            say(
                f"{model} {search_name} × {batch}: "
                + ", ".join(f"{n} {e['tokens_per_s']:.0f} tok/s" for n, e in point["engines"].items())
            )
            out_json.write_text(json.dumps(report, indent=1))
    out_json.write_text(json.dumps(report, indent=1))


# ---------------------------------------------------------------------------------------------- serve (there)
def serve(work: Path, out: Path, concurrency: list[int]) -> None:
    """The base model's fp16 export served by tritonserver on the GPU (`python -m serve.bench`, gRPC, our load
    generator, provider=cuda: GPU instance groups and the device path), every request forced to its sentence's
    length as `run` forces it; serve.bench's results copied to OUT_DIR."""
    model = os.environ.get("SERVE_MODEL", "base")
    w = json.loads((work / "workload.json").read_text())
    export = build_exports(work, ["fp16"], [model])[(model, "fp16")]
    (work / "sources.txt").write_text("\n".join(w["texts"]) + "\n")
    (work / "lengths.json").write_text(json.dumps(w["lengths"]))
    bench = work / "bench"
    cmd = [
        sys.executable,
        "-m",
        "serve.bench",
        f"exports=[{export}]",
        f"out={bench}",
        "protocols=[grpc]",
        f"concurrency=[{','.join(map(str, concurrency))}]",
        "no_batching_concurrency=[]",
        "baseline=false",
        f"sentences={work / 'sources.txt'}",
        f"lengths=[{work / 'lengths.json'}]",
        "duration_s=10",
        "+server.provider=" + GPU,
        "server.instance_count=2",
    ]
    say(" ".join(cmd))
    env = dict(os.environ)
    if os.environ.get("SERVE_PYTHONPATH"):  # the server's own packages first (pytriton's stubs want numpy < 2)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ["SERVE_PYTHONPATH"], env.get("PYTHONPATH")) if p)
    subprocess.run(cmd, check=False, env=env)
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(bench.glob("*"))[:6]:
        if f.is_file():
            (out / f"serve_{f.name}").write_bytes(f.read_bytes())


# ---------------------------------------------------------------------------------------------- render (here)
def render(report_path: Path, table: Path) -> None:
    """The stored report as a Markdown table: target tokens/s per engine, and the device path's ratio."""
    report = json.loads(report_path.read_text())
    m = report["machine"]
    order = ["cuda-host", "cuda-device", "cuda-device-fp16"]  # the old path, the new one, the new one in fp16, CPU
    names = sorted(
        {n for p in report["points"] for n in p["engines"]},
        key=lambda n: (n not in order, order.index(n) if n in order else 0, n),
    )
    lines = [
        f"Machine: {m['gpu']}; CPU {m['cpu']} ({m['cores']} cores); onnxruntime {m['ort']}. Median of "
        f"{report['rounds']} interleaved rounds; every search forced to the stored hypotheses' lengths. "
        "Rendered by `python -m zoo.devtools.gpu_decode render`.",
        "",
        "Cells: target tokens/s (sentences/s). device / host: the new path over the old on the GPU (fp32); fp16 / CPU: "
        "the fp16 device path over the same machine's CPU threads.",
        "",
        "| model | search | batch | sentences | " + " | ".join(names) + " | device / host | fp16 / host | fp16 / CPU |",
        "|---" * (4 + len(names) + 3) + "|",
    ]
    for p in report["points"]:
        e = p["engines"]
        cells = [f"{e[n]['tokens_per_s']:.0f} ({e[n]['sentences_per_s']:.0f})" if n in e else "–" for n in names]
        cpu = next((n for n in e if n.startswith("cpu")), "")

        def ratio(a: str, b: str, e: dict[str, Any] = e) -> str:
            return f"{e[a]['tokens_per_s'] / e[b]['tokens_per_s']:.2f}×" if a in e and b in e else "–"

        lines.append(
            f"| {p['model']} | {p['search']} | {p['batch']} | {p['sentences']} | "
            + " | ".join(cells)
            + f" | {ratio('cuda-device', 'cuda-host')} | {ratio('cuda-device-fp16', 'cuda-host')}"
            + f" | {ratio('cuda-device-fp16', cpu)} |"
        )
    if report.get("skipped"):
        lines += ["", f"Not reached before the deadline: {', '.join(report['skipped'])}."]
    table.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("prepare", "pack", "run", "serve", "render"):
        raise SystemExit(__doc__)
    if args[0] == "prepare":
        prepare(args[1], Path(args[2]), *(int(a) for a in args[3:4]))
    elif args[0] == "pack":
        pack(Path(args[1]), Path(args[2]), Path(args[3]), *(int(a) for a in args[4:5]))
    elif args[0] == "run":
        run(Path(args[1]), Path(args[2]), *(float(a) for a in args[3:4]), *(int(a) for a in args[4:5]))
    elif args[0] == "serve":
        serve(Path(args[1]), Path(args[2]), [int(a) for a in args[3:]] or [16, 64])
    else:
        render(Path(args[1]), Path(args[2]))


if __name__ == "__main__":
    main()
