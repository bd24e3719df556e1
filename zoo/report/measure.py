"""The speed stage: export each entry's checkpoint and time PyTorch and ONNX Runtime decoding, one
process per (entry, setting, engine), skipping measurements already on disk (resumable)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from zoo.checkpoint import resolve_checkpoint
from zoo.report.suite import Suite

log = logging.getLogger(__name__)


def speed_texts(report_dir: Path, suite: Suite, run_dir: Path) -> Path:
    """The first `speed.sentences` test sources, written once so every engine decodes the same lines."""
    path = report_dir / "speed" / "texts.txt"
    if not path.is_file():
        from omegaconf import OmegaConf

        from zoo.data import build_splits

        test = build_splits(OmegaConf.load(run_dir / "config.yaml").data).test
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(e.src.replace("\n", " ") + "\n" for e in test[: suite.speed_sentences]),
                        encoding="utf-8")
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
    cmd = [sys.executable, "-m", "zoo.report.speed", "--engine", engine, "--model", str(model),
           "--texts", str(texts), "--batch", str(setting.batch), "--beam-size", str(setting.beam_size),
           "--max-len-a", str(setting.max_len_a), "--max-len-b", str(setting.max_len_b), "--out", str(out)]
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
    cmd = [sys.executable, "-m", "serve.bench", "exports=[" + ",".join(str(exports[e]) for e in entries) + "]",
           f"sentences={texts}", f"protocols=[{cfg.get('protocol', 'grpc')}]",
           f"concurrency=[{int(cfg.get('concurrency', 16))}]", "no_batching_concurrency=[]", "baseline=false",
           f"duration_s={cfg.get('duration_s', 20)}", f"out={out}"]
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


def run_speed(report_dir: Path, suite: Suite, runs: Mapping[tuple[str, int], Path]) -> None:
    """Measure every entry of the speed seed. A failed export or engine is recorded with its error (the
    report shows it) instead of stopping the remaining entries."""
    if not suite.speed_enabled or not suite.speed_settings:
        return
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


__all__ = ["export_entry", "run_speed", "run_triton", "speed_texts"]
