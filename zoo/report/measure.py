"""The speed stage: export each entry's checkpoint and time PyTorch and ONNX Runtime decoding, one
process per (entry, setting, engine), skipping measurements already on disk (resumable)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zoo.checkpoint import resolve_checkpoint
from zoo.data import build_splits
from zoo.machine import describe_machine
from zoo.report.records import add_speed, record_path
from zoo.report.suite import Suite

log = logging.getLogger(__name__)


def speed_texts(report_dir: Path, suite: Suite, run_dir: Path) -> Path:
    """The first `speed.sentences` test sources, written once so every engine decodes the same lines."""
    path = report_dir / "speed" / "texts.txt"
    if not path.is_file():
        test = build_splits(OmegaConf.load(run_dir / "config.yaml").data).test
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "".join(e.src.replace("\n", " ") + "\n" for e in test[: suite.speed_sentences]), encoding="utf-8"
        )
    return path


def export_entry(report_dir: Path, entry: str, checkpoint: Path, threads: int | None) -> Path | str:
    """`python -m export` into reports/<suite>/exports/<entry>; returns the directory or the error text."""
    out = report_dir / "exports" / entry
    if (out / "manifest.json").is_file():
        return out
    cmd = [sys.executable, "-m", "export", f"checkpoint={checkpoint}", f"out={out}", "overwrite=true"]
    if threads:
        cmd.append(f"runtime.threads={threads}")
    print(f"[report] export {entry}: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return f"export failed (exit {proc.returncode}): " + " | ".join(tail)
    return out


def _time_engine(engine: str, model: Path, texts: Path, setting, threads: int | None, out: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "zoo.report.speed",
        "--engine",
        engine,
        "--model",
        str(model),
        "--texts",
        str(texts),
        "--batch",
        str(setting.batch),
        "--beam-size",
        str(setting.beam_size),
        "--max-len-a",
        str(setting.max_len_a),
        "--max-len-b",
        str(setting.max_len_b),
        "--out",
        str(out),
    ]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        out.write_text(json.dumps({"engine": engine, "error": " | ".join(tail)}) + "\n")


def run_triton(report_dir: Path, suite: Suite, exports: Mapping[str, Path], texts: Path) -> None:
    """All exported entries served by one real tritonserver, each loaded in turn at the suite's concurrency
    (serve.bench), so the served number sits next to the in-process ones. Skipped if already measured."""
    cfg = suite.triton
    out = report_dir / "triton"
    if not cfg.get("enabled") or not exports or (out / "results.json").is_file():
        return
    entries = list(exports)
    cmd = [
        sys.executable,
        "-m",
        "serve.bench",
        "exports=[" + ",".join(str(exports[e]) for e in entries) + "]",
        f"sentences={texts}",
        f"protocols=[{cfg.get('protocol', 'grpc')}]",
        f"concurrency=[{int(cfg.get('concurrency', 16))}]",
        "no_batching_concurrency=[]",
        "baseline=false",
        f"duration_s={cfg.get('duration_s', 20)}",
        f"out={out}",
    ]
    threads = cfg.get("threads") or suite.speed_threads
    if threads:
        cmd.append(f"server.threads={threads}")
    cmd.append(f"server.instance_count={int(cfg.get('instance_count', 1))}")
    print(f"[report] triton: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    out.mkdir(parents=True, exist_ok=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        (out / "error.txt").write_text(" | ".join(tail) + "\n")
        return
    (out / "entries.json").write_text(json.dumps(entries) + "\n")  # results.json lists models in this order


def run_speed(report_dir: Path, results_dir: Path, suite: Suite, runs: Mapping[tuple[str, int], Path]) -> None:
    """Measure every entry of the speed seed and store the points in that seed's results record. A failed
    export or engine is recorded with its error (the report shows it) instead of stopping the remaining
    entries. Speed needs the run's checkpoint, so it is measured where the run directory is."""
    if not suite.speed_enabled or not suite.speed_settings:
        return
    absent = [
        e
        for e in suite.entries
        if (e, suite.speed_seed) not in runs and record_path(results_dir, e, suite.speed_seed).is_file()
    ]
    if absent:
        log.warning(
            "no run directory (checkpoint) on this machine for %s seed %d: their speed cannot be measured here",
            ", ".join(absent),
            suite.speed_seed,
        )
    exports: dict[str, Path] = {}
    texts: Path | None = None
    for entry in suite.entries:
        run_dir = runs.get((entry, suite.speed_seed))
        if run_dir is None:
            continue
        texts = speed_texts(report_dir, suite, run_dir)
        checkpoint = resolve_checkpoint(run_dir)
        out_dir = report_dir / "speed" / entry
        out_dir.mkdir(parents=True, exist_ok=True)
        engines: dict[str, Path | str] = {"torch": checkpoint}
        if suite.speed_export:
            engines["ort"] = export_entry(report_dir, entry, checkpoint, suite.speed_threads)
            if isinstance(engines["ort"], Path):
                exports[entry] = engines["ort"]
        for setting in suite.speed_settings:
            for engine, model in engines.items():
                out = out_dir / f"{setting.name}-{engine}.json"
                if out.is_file():
                    continue
                if isinstance(model, str):  # the export failed: record why, once per setting
                    out.write_text(json.dumps({"engine": engine, "error": model}) + "\n")
                    continue
                print(f"[report] speed {entry} {setting.name} {engine}", flush=True)
                _time_engine(engine, model, texts, setting, suite.speed_threads, out)
    if texts is not None:
        run_triton(report_dir, suite, exports, texts)
    _store_speed(report_dir, results_dir, suite, [e for e in suite.entries if (e, suite.speed_seed) in runs])


def read_speed(report_dir: Path, entry: str) -> dict[str, Any]:
    """speed/<entry>/<setting>-<engine>.json measurements, keyed "<setting>/<engine>"."""
    out: dict[str, Any] = {}
    directory = report_dir / "speed" / entry
    if directory.is_dir():
        for path in sorted(directory.glob("*.json")):
            setting, _, engine = path.stem.rpartition("-")
            out[f"{setting}/{engine}"] = json.loads(path.read_text())
    return out


def read_triton(report_dir: Path) -> dict[str, Any]:
    """entry → its served load point (sentences/s, effective batch, latency) from serve.bench's results.json,
    or {"error": ...} for every entry when the serving run failed."""
    out = report_dir / "triton"
    if (out / "error.txt").is_file():
        return {"*": {"error": (out / "error.txt").read_text().strip()}}
    if not (out / "results.json").is_file() or not (out / "entries.json").is_file():
        return {}
    results, entries = json.loads((out / "results.json").read_text()), json.loads((out / "entries.json").read_text())
    by_model = {p["model"]: p for p in results["points"] if p["dynamic_batching"]}
    served: dict[str, Any] = {}
    for entry, model in zip(entries, results["models"], strict=True):
        p = by_model.get(model)
        if p is not None:
            served[entry] = {
                "model": model,
                "protocol": p["protocol"],
                "concurrency": p["concurrency"],
                "sentences_per_s": p["sentences_per_s"],
                "effective_batch": p["effective_batch"],
                "p95_ms": p["latency_ms"].get("p95"),
                "errors": p["errors"],
            }
    return served


def _store_speed(report_dir: Path, results_dir: Path, suite: Suite, entries: list[str]) -> None:
    """Copy each entry's measured points into its speed-seed record, with the settings and the machine."""
    triton = read_triton(report_dir)
    for entry in entries:
        path = record_path(results_dir, entry, suite.speed_seed)
        points = read_speed(report_dir, entry)
        if not path.is_file() or not points:
            continue
        add_speed(
            path,
            {
                "settings": [s.__dict__ for s in suite.speed_settings],
                "threads": suite.speed_threads,
                "points": points,
                "triton": triton.get(entry) or triton.get("*"),
                "triton_settings": suite.triton,
                "machine": describe_machine(),
            },
        )


__all__ = ["export_entry", "read_speed", "read_triton", "run_speed", "run_triton", "speed_texts"]
