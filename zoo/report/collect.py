"""Read a suite's artefacts into one record per entry: every number in the report comes from a file a
run or a measurement wrote (summary.json, test_hypotheses.txt, metrics.csv, ght/*, speed/*.json)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zoo.metrics import paired_bootstrap
from zoo.report.suite import Suite


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def test_references(run_dir: Path) -> tuple[list[str], list[str]]:
    """References and data-source labels of the run's test split, rebuilt from its saved data config
    (the corpus cache makes this a file read)."""
    from zoo.data import build_splits

    cfg = OmegaConf.load(run_dir / "config.yaml")
    test = build_splits(cfg.data).test
    return [e.tgt for e in test], [e.origin for e in test]


def read_hypotheses(run_dir: Path) -> list[str] | None:
    path = run_dir / "test_hypotheses.txt"
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def compactness(run_dir: Path) -> dict[str, Any] | None:
    """GHT's cluster-quality probes: the first (update 0: before GCT) and the last (end of GCT) means."""
    path = run_dir / "ght" / "compactness.jsonl"
    if not path.is_file():
        return None
    probes = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not probes:
        return None
    return {"before": {"step": probes[0]["step"], **probes[0]["mean"]},
            "after": {"step": probes[-1]["step"], **probes[-1]["mean"]}, "probes": len(probes)}


def mean_std(values: Sequence[float]) -> dict[str, float] | None:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}


def collect_run(run_dir: Path) -> dict[str, Any]:
    summary = _read_json(run_dir / "summary.json") or {}
    record: dict[str, Any] = {
        "run_dir": str(run_dir),
        "updates": summary.get("updates"),
        "train_minutes": summary.get("train_minutes"),
        "stop_reason": summary.get("stop_reason"),
        "size": summary.get("size"),
        "pruned_size": summary.get("pruned_size"),
        "head_plan": summary.get("head_plan"),
        "test": summary.get("test"),
        "compactness": compactness(run_dir),
        "votes_png": str(run_dir / "ght" / "votes.png") if (run_dir / "ght" / "votes.png").is_file() else None,
        "metrics_csv": str(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else None,
    }
    return record


def _bootstrap(suite: Suite, runs: Mapping[tuple[str, int], Path], entry: str, seed: int,
               samples: int) -> dict[str, Any] | None:
    """Paired bootstrap of `entry` against the baseline trained with the same seed (translation: BLEU)."""
    if suite.task != "translation" or entry == suite.baseline:
        return None
    base_dir, sys_dir = runs.get((suite.baseline, seed)), runs.get((entry, seed))
    if base_dir is None or sys_dir is None:
        return None
    base_h, sys_h = read_hypotheses(base_dir), read_hypotheses(sys_dir)
    if base_h is None or sys_h is None:
        return None
    refs, _ = test_references(sys_dir)
    result = paired_bootstrap(base_h, sys_h, refs, n_samples=samples)
    return {"seed": seed, "baseline_bleu": result["baseline"]["bleu"], "bleu": result["system"]["bleu"],
            "delta": round(result["system"]["bleu"] - result["baseline"]["bleu"], 2),
            "p_value": result["p_value"], "significant": result["significant"]}


def read_speed(report_dir: Path, entry: str) -> dict[str, Any]:
    """speed/<entry>/<setting>-<engine>.json records, keyed "<setting>/<engine>"."""
    out: dict[str, Any] = {}
    directory = report_dir / "speed" / entry
    if directory.is_dir():
        for path in sorted(directory.glob("*.json")):
            setting, _, engine = path.stem.rpartition("-")
            out[f"{setting}/{engine}"] = _read_json(path)
    return out


def read_triton(report_dir: Path) -> dict[str, Any]:
    """entry → its served load point (sentences/s, effective batch, latency) from serve.bench's results.json,
    or {"error": ...} for every entry when the serving run failed."""
    out = report_dir / "triton"
    if (out / "error.txt").is_file():
        return {"*": {"error": (out / "error.txt").read_text().strip()}}
    results, entries = _read_json(out / "results.json"), _read_json(out / "entries.json")
    if not results or not entries:
        return {}
    by_model = {p["model"]: p for p in results["points"] if p["dynamic_batching"]}
    served: dict[str, Any] = {}
    for entry, model in zip(entries, results["models"], strict=True):
        p = by_model.get(model)
        if p is not None:
            served[entry] = {"model": model, "protocol": p["protocol"], "concurrency": p["concurrency"],
                             "sentences_per_s": p["sentences_per_s"], "effective_batch": p["effective_batch"],
                             "p95_ms": p["latency_ms"].get("p95"), "errors": p["errors"]}
    return served


def collect(report_dir: Path, suite: Suite, runs: Mapping[tuple[str, int], Path],
            bootstrap_samples: int = 1000) -> dict[str, Any]:
    """The report's data: per entry, per-seed records, mean ± std over seeds, bootstrap, speed, size."""
    entries: dict[str, Any] = {}
    triton = read_triton(report_dir)
    for entry in suite.entries:
        seeds = {seed: collect_run(runs[(entry, seed)]) for seed in suite.seeds if (entry, seed) in runs}
        quality: dict[str, Any] = {}
        for metric in suite.metrics:
            quality[metric] = mean_std([(r["test"] or {}).get(metric) for r in seeds.values() if r["test"]])
        any_run = next(iter(seeds.values()), None)
        size = (any_run or {}).get("pruned_size") or (any_run or {}).get("size")
        entries[entry] = {
            "seeds": seeds,
            "quality": quality,
            "per_source": _per_source_mean(seeds),
            "size": size,
            "size_before_pruning": (any_run or {}).get("size") if (any_run or {}).get("pruned_size") else None,
            "train_minutes": mean_std([r["train_minutes"] for r in seeds.values()]),
            "updates": mean_std([r["updates"] for r in seeds.values()]),
            "bootstrap": [b for seed in suite.seeds
                          if (b := _bootstrap(suite, runs, entry, seed, bootstrap_samples)) is not None],
            "speed": read_speed(report_dir, entry),
            "triton": triton.get(entry) or triton.get("*"),
        }
    return {"suite": suite.name, "task": suite.task, "data": suite.data, "baseline": suite.baseline,
            "seeds": list(suite.seeds), "metrics": list(suite.metrics), "triton_settings": suite.triton,
            "speed_threads": suite.speed_threads, "entries": entries}


def _per_source_mean(seeds: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean over seeds of each data source's scores (a pooled score can hide a regression on one source)."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for record in seeds.values():
        for origin, scores in ((record.get("test") or {}).get("per_source") or {}).items():
            for key, value in scores.items():
                if key != "n":
                    pooled.setdefault(origin, {}).setdefault(key, []).append(float(value))
    return {o: {k: round(statistics.fmean(v), 2) for k, v in m.items()} for o, m in sorted(pooled.items())}


__all__ = ["collect", "collect_run", "compactness", "mean_std", "read_speed", "read_triton", "test_references"]
