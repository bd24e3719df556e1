"""The train stage: one `zoo.train` subprocess per (entry, seed) that has no results record, each
recorded (results/<suite>/<entry>-seed<k>.json.gz) as soon as it finishes.

A subprocess per run keeps each run's provenance (config.yaml, git sha, log) exactly as a user's own
`zoo.train` would write it, and an interrupted report resumes the interrupted run with `resume=latest`.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from zoo.errors import ZooError
from zoo.report.records import adopt_shared_record, missing_records, shared_record, write_record_from_run
from zoo.report.suite import Suite
from zoo.runs import DONE_MARKER
from zoo.training.branch_point import FOLDER, STATE

log = logging.getLogger(__name__)


class TrainingFailed(ZooError, RuntimeError):
    """A `zoo.train` subprocess exited non-zero; its own log says why."""


def seed_root(report_dir: Path, seed: int) -> Path:
    return report_dir / "runs" / f"seed{seed}"


def _runs_of(report_dir: Path, entry: str, seed: int) -> list[Path]:
    """Run dirs of `entry` under the seed's root, whatever the data is named (`data.name=iwslt14`
    renames the run dirs), confirmed by the entry name in each run's saved config."""
    root = seed_root(report_dir, seed)
    dirs = [
        d for base in root.glob(f"{entry}-*") if base.is_dir() for d in base.iterdir() if (d / "config.yaml").is_file()
    ]
    return sorted((d for d in dirs if OmegaConf.load(d / "config.yaml").model.name == entry), key=lambda d: d.name)


def finished_run(report_dir: Path, entry: str, seed: int) -> Path | None:
    """Newest run of (entry, seed) with a DONE marker and a summary, or None."""
    done = [
        d for d in _runs_of(report_dir, entry, seed) if (d / DONE_MARKER).is_file() and (d / "summary.json").is_file()
    ]
    return done[-1] if done else None


def unfinished_run(report_dir: Path, entry: str, seed: int) -> Path | None:
    """Newest interrupted run of (entry, seed): it has checkpoints/last.pt and no DONE marker."""
    left = [
        d
        for d in _runs_of(report_dir, entry, seed)
        if (d / "checkpoints" / "last.pt").is_file() and not (d / DONE_MARKER).exists()
    ]
    return left[-1] if left else None


def train_command(report_dir: Path, suite: Suite, entry: str, seed: int) -> list[str]:
    cmd = [sys.executable, "-m", "zoo.train", *suite.train_overrides(entry, seed, seed_root(report_dir, seed))]
    interrupted = unfinished_run(report_dir, entry, seed)
    if interrupted is not None:
        cmd.append(f"resume={interrupted}")
    elif (variant := suite.variants.get(entry)) and variant.init_from:
        source = finished_run(report_dir, variant.init_from, seed)
        cmd.append(f"init_from={source if source else f'<{variant.init_from} seed {seed} run: trained first>'}")
    elif variant and variant.branch_from and (source := branch_source(report_dir, variant.branch_from, seed)):
        cmd.append(f"branch_from={source}")
    return cmd


def branch_source(report_dir: Path, entry: str, seed: int) -> Path | None:
    """Newest run of (entry, seed), finished or not, that has kept its branch point (a GHT past its vote update)."""
    kept = [d for d in _runs_of(report_dir, entry, seed) if (d / "checkpoints" / FOLDER / STATE).is_file()]
    return kept[-1] if kept else None


def run_training(
    report_dir: Path, results_dir: Path, suite: Suite, dry_run: bool = False
) -> dict[tuple[str, int], Path]:
    """Train every (entry, seed) of the suite that has no results record yet and write its record as soon
    as it finishes (a finished run directory without a record is recorded, not retrained; a sibling suite's
    record of the same run under the same budget is shared, not retrained). Returns the
    run directories present on this machine, which the speed stage needs for its checkpoints."""
    todo = missing_records(results_dir, suite)
    total = len(suite.entries) * len(suite.seeds)
    print(
        f"[report] suite {suite.name}: {total} runs, {total - len(todo)} recorded in {results_dir}, "
        f"{len(todo)} to {'list' if dry_run else 'train'}",
        flush=True,
    )
    for n, (entry, seed) in enumerate(todo, 1):
        shared = shared_record(results_dir, suite, entry, seed)
        if shared is not None:
            print(
                f"[report {n}/{len(todo)}] {entry} seed {seed}: the same run is recorded in {shared} (same budget "
                f"and test references){'' if dry_run else '; shared, not retrained'}",
                flush=True,
            )
            if not dry_run:
                adopt_shared_record(shared, results_dir, suite)
            continue
        done = finished_run(report_dir, entry, seed)
        if done is not None:
            print(f"[report {n}/{len(todo)}] {entry} seed {seed}: finished run {done} has no record yet", flush=True)
        else:
            cmd = train_command(report_dir, suite, entry, seed)
            print(f"[report {n}/{len(todo)}] {' '.join(cmd[1:])}", flush=True)
        if dry_run:
            continue
        if done is None:
            _source_run(report_dir, suite, entry, seed)
            done = _train(report_dir, suite, entry, seed)
        path = write_record_from_run(results_dir, suite, entry, seed, done)
        print(f"[report] recorded {entry} seed {seed}: {path}", flush=True)
    return {(e, s): d for e in suite.entries for s in suite.seeds if (d := finished_run(report_dir, e, s)) is not None}


def _source_run(report_dir: Path, suite: Suite, entry: str, seed: int) -> None:
    """An uptrained variant starts from its source entry's run of the same seed, which must be on this machine: a
    source whose record was shared from a sibling suite left no checkpoint here, so its run is trained (the same
    config and seed: the same run; its shared record stays as it is)."""
    variant = suite.variants.get(entry)
    if variant is None or variant.init_from is None or finished_run(report_dir, variant.init_from, seed):
        return
    source = f"{variant.init_from} seed {seed}"
    print(f"[report] {entry} seed {seed} starts from {source}'s run, not on this machine: training it", flush=True)
    _train(report_dir, suite, variant.init_from, seed)


def _train(report_dir: Path, suite: Suite, entry: str, seed: int) -> Path:
    cmd = train_command(report_dir, suite, entry, seed)
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise TrainingFailed(
            f"zoo.train for {entry} seed {seed} exited with {proc.returncode}; see its train.log under "
            f"{seed_root(report_dir, seed)}/{entry}-*/. Fix the cause and rerun the same "
            "zoo.report command: recorded runs are skipped and this one resumes."
        )
    finished = finished_run(report_dir, entry, seed)
    if finished is None:
        raise TrainingFailed(
            f"zoo.train for {entry} seed {seed} exited 0 but left no finished run (DONE + "
            "summary.json); was it stopped by a signal? Rerun to resume it."
        )
    log.info("%s seed %d trained in %.1f min", entry, seed, (time.perf_counter() - start) / 60)
    return finished
