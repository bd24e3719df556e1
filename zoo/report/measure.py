"""The speed stage: every entry's speed-seed record → a rebuilt model (speed_models.py) → fp32 and INT8 exports →
interleaved timing rounds → `results/<suite>/speed-<machine>.json`. No run directory or checkpoint is needed.

Steps, each resumable (what is on disk under reports/<suite>/speed/ is not redone):
  inputs   the test sources, the forced output lengths — the *baseline's* seed record's hypothesis lengths, one
           workload for every entry, so a ratio of sent/s is a ratio of tokens/s and output length cannot leak
           into speed — and per entry a random-weight checkpoint
  export   `python -m export` with the record's head plan, fp32 and quantize=true, one process each; kept under
           reports/speed-exports/<key>/, the key a hash of everything the export reads, so suites that time the
           same architecture on the same data (quick and heads share six entries) export it once
  rounds   rounds × entries × settings × precisions, each a fresh `python -m zoo.report.speed` process; the entries
           include `<baseline>@control`, the baseline's export timed again (speed_plan.py: the A/A noise floor);
           the order rotates every round, so no entry always runs first or last on a warming machine; each point
           must have decoded the baseline's lengths (their digest), else it is stored as an error
  served   every entry's fp32 export in one real tritonserver (`python -m serve.bench`), each request one sentence
           carrying the baseline's forced length, `rounds` interleaved repeats (the A/A control is not served:
           serve.bench names a model by its export, so one export cannot be served twice)
  store    the measurements as taken, with the machine (CPU family included), settings, controls and git sha
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from zoo.machine import describe_machine
from zoo.report.records import load_records
from zoo.report.speed_models import (
    SpeedCorpus,
    forced_lengths,
    head_plan,
    rebuild_checkpoint,
    speed_corpus,
    write_plan,
)
from zoo.report.speed_plan import control_name, round_orders, with_control
from zoo.report.speed_results import PRECISIONS, SPEED_FORMAT, speed_path, workload_mismatches, write_speed
from zoo.report.suite import Suite
from zoo.runs import git_sha

log = logging.getLogger(__name__)
WORKLOAD = (
    "every entry decodes the same work: each sentence to exactly as many tokens as the baseline's seed record's "
    "stored test hypothesis has (capped by the setting's length limit), by a model rebuilt from the entry's record's "
    "config and head plan with random weights; the baseline's export is timed a second time as `<baseline>@control`"
)


@dataclass
class _Entry:
    """One entry's inputs: where its rebuilt model, exports and forced lengths are."""

    name: str
    record: str  # the record file it was rebuilt from
    size: dict[str, Any]
    lengths: Path  # the baseline's forced lengths: the same file for every entry
    exports: dict[str, Path | str]  # precision → export directory, or the export's error text
    control_of: str | None = None  # the A/A control: the entry whose export it times again


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 3) -> str:
    return " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-lines:])


def _export(checkpoint: Path, plan: Path | None, out: Path, precision: str, threads: int | None) -> Path | str:
    """`python -m export` of a rebuilt checkpoint into `out`; the directory, or the error text."""
    if (out / "manifest.json").is_file():
        return out
    cmd = [sys.executable, "-m", "export", f"checkpoint={checkpoint}", f"out={out}", "overwrite=true"]
    cmd.append(f"name={out.name}")  # the entry: suite variants are not model entries
    if plan is not None:
        cmd.append(f"head_plan={plan}")
    if precision == "int8":  # its BLEU cost is meaningless on random weights: measure it on 4 held-out pairs
        cmd += ["quantize=true", "quantize_eval.split=heldout", "quantize_eval.sentences=4"]
    if threads:
        cmd.append(f"runtime.threads={threads}")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"export failed (exit {proc.returncode}): {_tail(proc, 5)}"
    return out


def export_key(
    record: Mapping[str, Any], name: str, plan: Mapping[str, list[int]] | None, corpus: SpeedCorpus, threads: int | None
) -> str:
    """Names an export by everything it is made from: the record's model config, the entry and its suite name, the
    head plan, the data config, tokenizer and held-out pairs, and the runtime threads written into its manifest."""
    spec = {
        "model": record["config"]["model"],
        "entry": record["entry"],
        "name": name,
        "plan": plan,
        "data": corpus.data_config,
        "tokenizer": hashlib.sha256(corpus.tokenizer.model_bytes).hexdigest(),
        "heldout": corpus.heldout,
        "threads": threads,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _label(suite: Suite, name: str) -> str:
    return f"results/{suite.name}/{name}-seed{suite.speed_seed}.json.gz"


def _baseline_lengths(work: Path, suite: Suite, records: Mapping[str, dict[str, Any]], corpus: SpeedCorpus) -> Path:
    """The one forced-lengths file every entry decodes: the baseline record's hypothesis lengths (rewritten on
    every run — cheap — so a re-trained baseline record changes them, and with them the workload key)."""
    path = work / f"lengths-{suite.baseline}-seed{suite.speed_seed}-{len(corpus.texts)}.json"
    path.write_text(json.dumps(forced_lengths(records[suite.baseline], _label(suite, suite.baseline), corpus)) + "\n")
    return path


def _inputs(work: Path, suite: Suite, records: Mapping[str, dict[str, Any]], corpus: SpeedCorpus) -> list[_Entry]:
    """Every timed entry (the A/A control included, halfway down the list), its exports and the shared lengths."""
    shared = work.parent.parent / "speed-exports"
    lengths = _baseline_lengths(work, suite, records, corpus)
    entries = {}
    for name, record in tqdm(records.items(), desc="rebuild + export", unit="entry"):
        label = _label(suite, name)
        directory = work / "models" / name
        directory.mkdir(parents=True, exist_ok=True)
        checkpoint = directory / "rebuilt.pt"
        if not checkpoint.is_file():
            rebuild_checkpoint(record, label, corpus, checkpoint)
        plan = head_plan(record)
        plan_file = write_plan(plan, directory / "head_plan.json") if plan else None
        key = export_key(record, name, plan, corpus, suite.speed_threads)
        exports = {}
        for p in PRECISIONS:
            legacy = directory / p / name  # where exports were kept before they were shared between suites
            out = legacy if (legacy / "manifest.json").is_file() else shared / key / p / name
            exports[p] = _export(checkpoint, plan_file, out, p, suite.speed_threads)
        entries[name] = _Entry(name, label, record.get("pruned_size") or record["size"], lengths, exports)
    base = entries[suite.baseline]
    entries[control_name(suite.baseline)] = _Entry(
        control_name(suite.baseline), base.record, base.size, lengths, base.exports, control_of=suite.baseline
    )
    return [entries[n] for n in with_control(list(records), suite.baseline)]


def _time(entry: _Entry, precision: str, setting: Any, texts: Path, threads: int | None, out: Path) -> None:
    """One measurement in a fresh process, written to `out` (its error text when it failed)."""
    model = entry.exports[precision]
    if isinstance(model, str):
        out.write_text(json.dumps({"error": model}) + "\n")
        return
    cmd = [sys.executable, "-m", "zoo.report.speed", "--model", str(model), "--texts", str(texts)]
    cmd += ["--lengths", str(entry.lengths), "--batch", str(setting.batch), "--beam-size", str(setting.beam_size)]
    cmd += ["--max-len-a", str(setting.max_len_a), "--max-len-b", str(setting.max_len_b), "--out", str(out)]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        out.write_text(json.dumps({"error": _tail(proc)}) + "\n")


def _workload_key(suite: Suite, lengths: Path) -> str:
    """Names the measurements of one workload (format, sentences, threads, settings, the forced lengths every entry
    decodes): a changed suite or baseline record is measured anew, and rounds of format 1 — each entry its own
    lengths, no control — are never reused."""
    spec = {
        "format": SPEED_FORMAT,
        "lengths": hashlib.sha256(lengths.read_bytes()).hexdigest(),
        "control": control_name(suite.baseline),
        "n": suite.speed_sentences,
        "t": suite.speed_threads,
        "s": [asdict(s) for s in suite.speed_settings],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def _collect(work: Path, suite: Suite, entry: str) -> dict[str, Any]:
    """One entry's points from its round files: sent/s, peak RSS and the lengths' digest per round, or an error."""
    points: dict[str, Any] = {}
    for setting in suite.speed_settings:
        for precision in PRECISIONS:
            name = f"{entry}-{setting.name}-{precision}.json"
            taken = [json.loads((work / f"round{r + 1}" / name).read_text()) for r in range(suite.speed_rounds)]
            errors = [t["error"] for t in taken if "error" in t]
            digests = {t.get("lengths_sha256") for t in taken if "error" not in t}
            if not errors and len(digests) != 1:
                errors = [f"the rounds decoded different lengths ({sorted(map(str, digests))})"]
            points[f"{setting.name}/{precision}"] = (
                {"error": errors[0]}
                if errors
                else {
                    "sentences_per_s": [t["sentences_per_s"] for t in taken],
                    "peak_rss_mb": [t["peak_rss_mb"] for t in taken],
                    "output_tokens": taken[0]["output_tokens"],
                    "lengths_sha256": taken[0]["lengths_sha256"],
                    "cache_kb": taken[0].get("cache_kb"),
                }
            )
    return points


def _rounds(work: Path, suite: Suite, entries: list[_Entry], texts: Path) -> dict[str, dict[str, Any]]:
    """Every (round, entry, setting, precision) once, entries rotated per round; the points per entry, a point
    that decoded other lengths than the baseline's at the same point turned into an error."""
    work = work / f"rounds-{_workload_key(suite, entries[0].lengths)}"
    by_name = {e.name: e for e in entries}
    plan = [
        (r, by_name[name], s, p)
        for r, order in enumerate(round_orders([e.name for e in entries], suite.speed_rounds))
        for name in order
        for s in suite.speed_settings
        for p in PRECISIONS
    ]
    for r, entry, setting, precision in tqdm(plan, desc="speed rounds", unit="point"):
        out = work / f"round{r + 1}" / f"{entry.name}-{setting.name}-{precision}.json"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            _time(entry, precision, setting, texts, suite.speed_threads, out)
    points = {e.name: _collect(work, suite, e.name) for e in entries}
    for bad in workload_mismatches(points, suite.baseline):
        entry, key = bad.split(" ", 1)
        log.warning("%s %s decoded other lengths than the baseline %s: not compared", entry, key, suite.baseline)
        points[entry][key] = {"error": f"decoded other lengths than the baseline {suite.baseline} (a smaller limit?)"}
    return points


def _served(work: Path, suite: Suite, entries: list[_Entry], texts: Path) -> dict[str, dict[str, Any]]:
    """Served sentences/s per entry and round (or the error), from one serve.bench run over every fp32 export."""
    cfg = suite.triton
    exports = {
        e.name: e.exports["fp32"] for e in entries if not isinstance(e.exports["fp32"], str) and not e.control_of
    }
    if not cfg.get("enabled") or not exports:
        return {}
    out = work / f"served-{_workload_key(suite, entries[0].lengths)}"
    if not (out / "results.json").is_file():
        lengths = [str(e.lengths) for e in entries if e.name in exports]  # the baseline's file, for every entry
        cmd = [sys.executable, "-m", "serve.bench", f"exports=[{','.join(str(x) for x in exports.values())}]"]
        cmd += [f"sentences={texts}", f"lengths=[{','.join(lengths)}]", "client_batch=[1]", "tool=ours"]
        cmd += [f"protocols=[{cfg.get('protocol', 'grpc')}]", f"concurrency=[{int(cfg.get('concurrency', 16))}]"]
        cmd += ["no_batching_concurrency=[]", "baseline=false", f"duration_s={cfg.get('duration_s', 20)}"]
        cmd += [f"repeats={suite.speed_rounds}", f"out={out}", "search.beam_size=5"]
        cmd += [f"server.instance_count={int(cfg.get('instance_count', 1))}"]
        if cfg.get("threads") or suite.speed_threads:
            cmd.append(f"server.threads={cfg.get('threads') or suite.speed_threads}")
        print(f"[report] served: {' '.join(cmd[3:])}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return {name: {"error": _tail(proc)} for name in exports}
    results = json.loads((out / "results.json").read_text())
    served: dict[str, dict[str, Any]] = {}
    for point in results["points"]:
        if point["model"] in exports and point["dynamic_batching"]:
            served[point["model"]] = {
                "sentences_per_s": point["rounds_sentences_per_s"] or [point["sentences_per_s"]],
                "errors": point["errors"],
                "p95_ms": point["latency_ms"].get("p95"),
                "effective_batch": point["effective_batch"],
            }
            if point["errors"]:
                served[point["model"]]["error"] = f"{point['errors']} failed requests: {point['first_error']}"
    return served


def _controls(suite: Suite) -> list[dict[str, Any]]:
    """The file's negative controls: the automatic A/A control, then the suite's `speed.controls`."""
    aa = {
        "system": control_name(suite.baseline),
        "baseline": suite.baseline,
        "points": None,  # every in-process point (not served: see the module docstring)
        "why": "A/A: the baseline's own export timed twice in each round — the measurement's noise floor",
    }
    return [aa, *(asdict(c) for c in suite.speed_controls)]


def run_speed(report_dir: Path, results_dir: Path, suite: Suite) -> Path | None:
    """Measure the speed of every entry that has a record of the speed seed and write the suite's speed file for
    this machine; returns its path (None when the suite measures no speed)."""
    if not suite.speed_enabled or not suite.speed_settings:
        print(f"[report] suite {suite.name} measures no speed (speed.enabled / speed.settings)", flush=True)
        return None
    _, all_records = load_records(results_dir, suite)
    records = {e: all_records[(e, suite.speed_seed)] for e in suite.entries if (e, suite.speed_seed) in all_records}
    absent = [e for e in suite.entries if e not in records]
    if absent:
        log.warning("no seed-%d record of %s: not timed", suite.speed_seed, ", ".join(absent))
    if suite.baseline not in records:
        raise FileNotFoundError(
            f"results/{suite.name}/{suite.baseline}-seed{suite.speed_seed}.json.gz (the baseline's record) is "
            "missing: speed is reported as ratios to it; train it first (stages=[train])"
        )
    work = report_dir / "speed"
    corpus = speed_corpus(records[suite.baseline], f"results/{suite.name}", suite.speed_sentences, work)
    texts = work / "texts.txt"
    texts.write_text("".join(t + "\n" for t in corpus.texts), encoding="utf-8")
    entries = _inputs(work, suite, records, corpus)
    points = _rounds(work, suite, entries, texts)
    served = _served(work, suite, entries, texts)
    machine = describe_machine()
    return write_speed(
        speed_path(results_dir, machine["class"]),
        {
            "suite": suite.name,
            "baseline": suite.baseline,
            "seed": suite.speed_seed,
            "measured": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "git_sha": git_sha(),
            "machine": machine,
            "sentences": len(corpus.texts),
            "threads": suite.speed_threads,
            "rounds": suite.speed_rounds,
            "workload": WORKLOAD,
            "settings": [asdict(s) for s in suite.speed_settings],
            "served_settings": suite.triton if served else None,
            "controls": _controls(suite),
            "entries": {
                e.name: {
                    "record": e.record,
                    "size": e.size,
                    "exports": {p: str(x) if isinstance(x, str) else "ok" for p, x in e.exports.items()},
                    "points": points[e.name],
                    "served": served.get(e.name),
                    **({"control_of": e.control_of} if e.control_of else {}),
                }
                for e in entries
            },
        },
    )


__all__ = ["WORKLOAD", "export_key", "run_speed"]
