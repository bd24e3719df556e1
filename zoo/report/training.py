"""The train stage: one `zoo.train` subprocess per (entry, seed), reusing finished runs.

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

from zoo.report.suite import Suite
from zoo.runs import DONE_MARKER

log = logging.getLogger(__name__)


class TrainingFailed(RuntimeError):
    """A `zoo.train` subprocess exited non-zero; its own log says why."""


def seed_root(report_dir: Path, seed: int) -> Path:
    return report_dir / "runs" / f"seed{seed}"


def _runs_of(report_dir: Path, entry: str, seed: int) -> list[Path]:
    """Run dirs of `entry` under the seed's root, whatever the data is named (`data.name=iwslt14`
    renames the run dirs), confirmed by the entry name in each run's saved config."""
    root = seed_root(report_dir, seed)
    dirs = [d for base in root.glob(f"{entry}-*") if base.is_dir() for d in base.iterdir()
            if (d / "config.yaml").is_file()]
    return sorted((d for d in dirs if OmegaConf.load(d / "config.yaml").model.name == entry), key=lambda d: d.name)


def finished_run(report_dir: Path, entry: str, seed: int) -> Path | None:
    """Newest run of (entry, seed) with a DONE marker and a summary, or None."""
    done = [d for d in _runs_of(report_dir, entry, seed)
            if (d / DONE_MARKER).is_file() and (d / "summary.json").is_file()]
    return done[-1] if done else None


def unfinished_run(report_dir: Path, entry: str, seed: int) -> Path | None:
    """Newest interrupted run of (entry, seed): it has checkpoints/last.pt and no DONE marker."""
    left = [d for d in _runs_of(report_dir, entry, seed)
            if (d / "checkpoints" / "last.pt").is_file() and not (d / DONE_MARKER).exists()]
    return left[-1] if left else None


def train_command(report_dir: Path, suite: Suite, entry: str, seed: int) -> list[str]:
    cmd = [sys.executable, "-m", "zoo.train", *suite.train_overrides(entry, seed, seed_root(report_dir, seed))]
    interrupted = unfinished_run(report_dir, entry, seed)
    if interrupted is not None:
        cmd.append(f"resume={interrupted}")
    return cmd


def plan(report_dir: Path, suite: Suite) -> list[tuple[str, int, Path | None]]:
    """(entry, seed, finished run or None) for every run of the suite, seeds outermost so a partly
    finished report already has one complete seed to show."""
    return [(entry, seed, finished_run(report_dir, entry, seed)) for seed in suite.seeds
            for entry in suite.entries]


def run_training(report_dir: Path, suite: Suite, dry_run: bool = False) -> dict[tuple[str, int], Path]:
    """Train whatever is not finished yet; returns the run directory of every (entry, seed)."""
    runs: dict[tuple[str, int], Path] = {}
    todo = [(e, s) for e, s, done in plan(report_dir, suite) if done is None]
    log.info("suite %s: %d runs, %d finished, %d to train", suite.name, len(suite.entries) * len(suite.seeds),
             len(suite.entries) * len(suite.seeds) - len(todo), len(todo))
    for entry, seed, done in plan(report_dir, suite):
        if done is not None:
            runs[(entry, seed)] = done
            continue
        cmd = train_command(report_dir, suite, entry, seed)
        print(f"[report {len(runs) + 1}/{len(suite.entries) * len(suite.seeds)}] {' '.join(cmd[1:])}", flush=True)
        if dry_run:
            continue
        start = time.perf_counter()
        proc = subprocess.run(cmd, check=False)
        if proc.returncode != 0:
            raise TrainingFailed(
                f"zoo.train for {entry} seed {seed} exited with {proc.returncode}; see its train.log under "
                f"{seed_root(report_dir, seed)}/{entry}-*/. Fix the cause and rerun the same "
                "zoo.report command: finished runs are reused and this one resumes.")
        finished = finished_run(report_dir, entry, seed)
        if finished is None:
            raise TrainingFailed(f"zoo.train for {entry} seed {seed} exited 0 but left no finished run (DONE + "
                                 "summary.json); was it stopped by a signal? Rerun to resume it.")
        log.info("%s seed %d trained in %.1f min", entry, seed, (time.perf_counter() - start) / 60)
        runs[(entry, seed)] = finished
    return runs
