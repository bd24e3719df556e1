"""The report's data from a suite's results records alone: every number in a table is read from a record
or recomputed from one (means over seeds, paired bootstrap on the stored hypotheses)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from zoo.machine import quality_class
from zoo.metrics import (
    bleu_from_stats,
    document_stats,
    mean_from_stats,
    output_stats,
    paired_bootstrap,
    paired_bootstrap_means,
    sentence_stats,
)
from zoo.report.budget_probe import probe_choice
from zoo.report.claims import Stats, collect_claims
from zoo.report.pairing import above_floor, input_dependence
from zoo.report.records import Record, References, convergence
from zoo.report.run_state import climbing
from zoo.report.suite import Suite

Records = Mapping[tuple[str, int], Record]


def mean_std(values: Sequence[float | None]) -> dict[str, float] | None:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}


def compactness(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """GHT's cluster-quality probes: the first (update 0: before GCT) and the last (end of GCT) means, and which
    partition they describe."""
    probes = (record.get("ght") or {}).get("probes") or []
    if not probes:
        return None
    last = probes[-1]["modules"].values()
    return {
        "before": {"step": probes[0]["step"], **probes[0]["mean"]},
        "after": {"step": probes[-1]["step"], **probes[-1]["mean"]},
        "probes": len(probes),
        # the groups the loss trained (issue 62), or, in older records, the probe batch's own k-means
        "partition": "trained" if last and all(m.get("partition") == "trained" for m in last) else "probe",
    }


def compaction_curve(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every check of a GHT run: its update, the means over modules and each module's silhouette and intra-group
    cos (of the trained partition; older records: of the probe batch's own k-means) — the compaction plots."""
    return [
        {
            "step": probe["step"],
            "mean": probe["mean"],
            "modules": {
                name: {"silhouette": m["silhouette"], "intra_cos": m["intra_cos"]}
                for name, m in probe["modules"].items()
            },
        }
        for probe in (record.get("ght") or {}).get("probes") or []
    ]


def run_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the tables and plots use of one record (no hypotheses: those only feed the bootstrap)."""
    voting = (record.get("ght") or {}).get("voting")
    return {
        "updates": record["updates"],
        "train_minutes": record["train_minutes"],
        "stop_reason": record.get("stop_reason"),
        "size": record["size"],
        "pruned_size": record.get("pruned_size"),
        "head_plan": record.get("head_plan"),
        "test": record["test"],
        "compactness": compactness(record),
        "compaction_curve": compaction_curve(record),
        "outputs": output_stats(record.get("hypotheses") or []),
        "votes": {"votes": voting["votes"], "plan": voting["plan"]} if voting else None,
        "voting": {
            k: voting.get(k) for k in ("step", "trigger", "voting_batches", "vote_maps", "voting_seconds", "selection")
        }
        if voting
        else None,
        "learning_curve": record.get("learning_curve") or [],
        "convergence": convergence(record.get("learning_curve") or []) or record.get("convergence"),
        "update_freq": ((record.get("config") or {}).get("trainer") or {}).get("update_freq") or 1,
        "git_sha": record["git_sha"],
        "machine": str((record.get("machine") or {}).get("class") or ""),
    }


def _bootstrap(
    suite: Suite,
    records: Records,
    refs: References,
    entry: str,
    seed: int,
    baseline: str,
    samples: int,
    stats: Stats,
) -> dict[str, Any] | None:
    """Paired bootstrap of `entry` against `baseline` trained with the same seed, on the suite's headline metric,
    recomputed from the two records' stored hypotheses: translation BLEU by sacreBLEU's test, summarization
    ROUGE-L by the same rule over per-document scores (`stats` gives them)."""
    base, system = records.get((baseline, seed)), records.get((entry, seed))
    if entry == baseline or base is None or system is None:
        return None
    if suite.task == "translation":
        result = paired_bootstrap(base["hypotheses"], system["hypotheses"], refs.texts, n_samples=samples)
        base_score, sys_score = result["baseline"]["bleu"], result["system"]["bleu"]
    else:
        base_stats, sys_stats = stats(baseline, seed), stats(entry, seed)
        assert base_stats is not None and sys_stats is not None
        result = paired_bootstrap_means(base_stats[:, 0], sys_stats[:, 0], n_samples=samples)
        base_score, sys_score = result["baseline"], result["system"]
    return {
        "seed": seed,
        "metric": suite.headline,
        "baseline_score": base_score,
        "score": sys_score,
        "delta": round(sys_score - base_score, 2),
        "p_value": result["p_value"],
        "significant": result["significant"],
    }


def epoch_length(records: Mapping[Any, Mapping[str, Any]]) -> dict[str, Any] | None:
    """Training batches in one epoch, as a Voting-to-Stay pass over the whole training split counted them
    (`vote_batches=0`): the one stored number that sizes an epoch (records hold no token count). ≈: the
    token-bucketed batches of another epoch's shuffle number a few more or less."""
    for key in sorted(records):
        rec = records[key]
        voting = (rec.get("ght") or {}).get("voting") or {}
        ght_config = (rec["config"].get("model") or {}).get("ght") or {}
        if voting.get("voting_batches") and not ght_config.get("vote_batches"):
            name = rec.get("shared_from") or f"{rec['suite']}/{rec['entry']}-seed{rec['seed']}"
            return {"batches": int(voting["voting_batches"]), "source": name.removesuffix(".json.gz")}
    return None


def training_state(entries: Mapping[str, Mapping[str, Any]], epoch: dict[str, Any] | None) -> dict[str, Any]:
    """The table's budget as it was spent — updates, epochs where an epoch's length is known — and how many of
    its runs were still climbing at their end."""
    runs = [run for rec in entries.values() for run in rec["seeds"].values()]
    updates = sorted(int(r["updates"]) for r in runs)
    batches = sorted(int(r["updates"]) * int(r["update_freq"]) for r in runs)
    gains = [r["convergence"]["last20_gain"] for r in runs if r.get("convergence")]
    falls = [f for r in runs if (f := (r.get("convergence") or {}).get("last25_loss_fall")) is not None]
    return {
        "updates": [updates[0], updates[-1]] if updates else None,
        "epochs": [round(b / epoch["batches"], 2) for b in (batches[0], batches[-1])] if epoch and runs else None,
        "epoch": epoch,
        **climbing(runs),
        "median_gain": statistics.median(gains) if gains else None,
        "median_loss_fall": statistics.median(falls) if falls else None,
    }


def _per_source_mean(runs: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean over seeds of each data source's scores (a pooled score can hide a regression on one source)."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for run in runs.values():
        for origin, scores in (run["test"].get("per_source") or {}).items():
            for key, value in scores.items():
                if key != "n":
                    pooled.setdefault(origin, {}).setdefault(key, []).append(float(value))
    return {o: {k: round(statistics.fmean(v), 2) for k, v in m.items()} for o, m in sorted(pooled.items())}


def machine_summary(records: Records) -> dict[str, Any]:
    """The machine line of a table: the quality class every record shares, and what the records say about it."""
    machines = [r["machine"] for r in records.values()]
    counts = Counter(f"{m.get('cpu_model')} ({m.get('cores')} cores)" for m in machines)
    return {
        "class": quality_class(str(machines[0].get("class"))) if machines else None,
        "accelerator": machines[0].get("accelerator") if machines else None,
        "cpus": dict(sorted(counts.items())),
        "torch_threads": sorted({m.get("torch_threads") for m in machines if m.get("torch_threads")}),
        "torch": sorted({m.get("torch") for m in machines if m.get("torch")}),
    }


def compute_spent(records: Records) -> dict[str, Any]:
    """What the table cost to train — the issue-37 budget is counted in core-hours — summed over its records:
    a CPU run costs its training minutes × its torch threads, an accelerator run its minutes on the device.
    Evaluation (test decoding, speed) is not in `train_minutes`, so it is not counted."""
    core_minutes = device_minutes = 0.0
    runs = shared = 0
    for rec in records.values():
        minutes = rec.get("train_minutes")
        if minutes is None:
            continue
        runs += 1
        shared += bool(rec.get("shared_from"))
        machine = rec.get("machine") or {}
        if machine.get("accelerator"):
            device_minutes += float(minutes)
        else:
            core_minutes += float(minutes) * int(machine.get("torch_threads") or 1)
    return {
        "runs": runs,
        "shared": shared,
        "core_hours": round(core_minutes / 60, 1),
        "device_hours": round(device_minutes / 60, 2),
    }


def ordered_entries(suite: Suite, records: Records) -> list[str]:
    """The suite file's entries in its order, then entries that only have records (a suite grown by
    `suite.entries=[...]` on the command line), alphabetically."""
    present = {e for e, _ in records}
    return [e for e in suite.entries if e in present] + sorted(present - set(suite.entries))


def _probe(suite: Suite, entries: Mapping[str, Any]) -> dict[str, Any] | None:
    """A budget probe's decision from its baseline's curve (None before the baseline ran)."""
    return probe_choice(suite.probe, entries[suite.baseline]) if suite.probe and suite.baseline in entries else None


def collect(
    suite: Suite,
    refs: References,
    records: Records,
    bootstrap_samples: int = 1000,
    epoch: dict[str, Any] | None = None,
    floor_outputs: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The report's data: per entry, per-seed summaries, mean ± std over seeds, bootstrap, speed, size, claims.
    `epoch` (`epoch_length` of other records of the same budget) sizes an epoch when these records cannot;
    `floor_outputs` (a summarization suite's constant baseline, one output per document) is the score every run is
    measured against (`above_constant`), which a claim's runs must clear (run_state.degenerate_outputs)."""
    epoch = epoch_length(records) or epoch
    stats: dict[tuple[str, int], np.ndarray] = {}

    def run_stats(entry: str, seed: int) -> np.ndarray | None:
        """Per-segment statistics of a record's hypotheses (BLEU's, or per-document ROUGE), computed once."""
        if (entry, seed) not in records:
            return None
        if (entry, seed) not in stats:
            hyps = records[(entry, seed)]["hypotheses"]
            stats[(entry, seed)] = (
                sentence_stats(hyps, refs.texts)
                if suite.task == "translation"
                else document_stats(hyps, refs.texts, suite.headline)
            )
        return stats[(entry, seed)]

    tests: dict[tuple[str, int, str], dict[str, Any] | None] = {}

    def bootstrap(entry: str, seed: int, baseline: str) -> dict[str, Any] | None:
        """Each pair's paired bootstrap once: the table and the claims against the suite's baseline share it."""
        if (entry, seed, baseline) not in tests:
            tests[(entry, seed, baseline)] = _bootstrap(
                suite, records, refs, entry, seed, baseline, bootstrap_samples, run_stats
            )
        return tests[(entry, seed, baseline)]

    floor = None  # the constant baseline's per-document ROUGE-L F1 × 100 [N]
    if floor_outputs is not None and suite.headline == "rougeL" and len(refs.texts) >= 2:
        floor = document_stats(list(floor_outputs), refs.texts, suite.headline)[:, 0]
    entries: dict[str, Any] = {}
    for entry in ordered_entries(suite, records):
        seeds = sorted(s for e, s in records if e == entry)
        runs = {seed: run_summary(records[(entry, seed)]) for seed in seeds}
        if suite.task != "translation" and len(refs.texts) >= 2:  # do the outputs depend on their documents?
            for seed, run in runs.items():
                per_document = run_stats(entry, seed) if suite.headline == "rougeL" else None
                own = per_document[:, 0] if per_document is not None else None  # ROUGE-L F1 × 100, computed once
                run["dependence"] = input_dependence(records[(entry, seed)]["hypotheses"], refs.texts, own)
                if floor is not None and own is not None:
                    run["above_constant"] = above_floor(own, floor)
        first = runs[seeds[0]]
        entries[entry] = {
            "seeds": runs,
            "config": {
                k: records[(entry, seeds[0])]["config"]["model"].get(k)
                for k in ("attention", "num_heads", "head_dim", "d_model", "attention_options")
            },
            "quality": {m: mean_std([r["test"].get(m) for r in runs.values()]) for m in suite.metrics},
            "per_source": _per_source_mean(runs),
            "size": first["pruned_size"] or first["size"],
            "size_before_pruning": first["size"] if first["pruned_size"] else None,
            "train_minutes": mean_std([r["train_minutes"] for r in runs.values()]),
            "updates": mean_std([r["updates"] for r in runs.values()]),
            "bootstrap": [b for seed in seeds if (b := bootstrap(entry, seed, suite.baseline)) is not None],
        }
    missing = [
        f"{e} (seed{'s' if len(left) > 1 else ''} {', '.join(map(str, left))})"
        for e in suite.entries
        if (left := [s for s in suite.seeds if (e, s) not in records])
    ]
    claims = collect_claims(
        suite,
        entries,
        sorted({s for _, s in records}),
        bootstrap,
        run_stats,
        score=bleu_from_stats if suite.task == "translation" else mean_from_stats,
        samples=bootstrap_samples,
        epoch_batches=epoch["batches"] if epoch else None,
    )
    shared_runs: dict[str, list[str]] = {}  # origin suite -> its runs shared into this one
    for (e, s), rec in sorted(records.items()):
        if rec.get("shared_from"):
            shared_runs.setdefault(rec["shared_from"].split("/")[0], []).append(f"{e} seed {s}")
    shared_runs = dict(sorted(shared_runs.items()))
    return {
        "suite": suite.name,
        "task": suite.task,
        "data": suite.data,
        "baseline": suite.baseline,
        "seeds": sorted({s for _, s in records}),
        "metrics": list(suite.metrics),
        "headline": suite.headline,
        "budget": list(suite.overrides),
        "bootstrap_samples": bootstrap_samples,
        "machine": machine_summary(records),
        "references": {
            "sha256": refs.sha256,
            "segments": len(refs.texts),
            "mean_words": round(statistics.fmean(len(t.split()) for t in refs.texts), 2) if refs.texts else 0.0,
        },
        "missing": missing,
        "entries": entries,
        "shared": shared_runs,
        "state": training_state(entries, epoch),
        "compute": compute_spent(records),
        "claims": claims,
        "compaction_rule": asdict(suite.compaction) if suite.compaction else None,
        **({"probe": _probe(suite, entries)} if suite.probe else {}),  # budget probes only
    }


__all__ = [
    "collect",
    "compaction_curve",
    "compactness",
    "compute_spent",
    "epoch_length",
    "machine_summary",
    "mean_std",
    "ordered_entries",
    "run_summary",
    "training_state",
]
