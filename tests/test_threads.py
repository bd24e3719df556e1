"""Training on a shared CPU (issue 23): `trainer.threads`, the OpenMP wait policy set before torch loads, and
the throughput warning when updates become much slower than the run's own median."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo.training.trainer
from tests.conftest import smoke_overrides
from tests.zoo_testing import REPO, compose_train
from zoo.train import UsageError, train
from zoo.training.threads import choose_threads, describe, torch_threads
from zoo.training.throughput import ThroughputMonitor, contention_hint

HINT = contention_hint("cpu", cores=2, threads=2)
QUIET, SLOW = 0.8, 2.5  # seconds per update; 2.5 / 0.8 = 3.1×


def _wait_policy_in_subprocess(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import zoo, torch, os; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))",
        ],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_importing_zoo_bounds_how_long_openmp_threads_spin() -> None:
    assert _wait_policy_in_subprocess() == "None 10000"


def test_an_explicit_wait_setting_is_kept() -> None:
    assert _wait_policy_in_subprocess(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE None"
    assert _wait_policy_in_subprocess(GOMP_SPINCOUNT="300000") == "None 300000"


def test_auto_is_the_usable_cores_unless_omp_num_threads_is_exported() -> None:
    assert choose_threads("auto", environ={}, cores=3).threads == 3
    assert choose_threads("auto", environ={}, cores=3).reason == "auto: 3 usable cores"
    assert choose_threads("auto", environ={"OMP_NUM_THREADS": "1"}, cores=3).threads == 1
    assert choose_threads("auto", environ={"OMP_NUM_THREADS": "2,1"}, cores=3).threads == 2  # nesting list
    assert choose_threads("auto", environ={"OMP_NUM_THREADS": "lots"}, cores=3).threads == 3  # libgomp ignores it too
    assert choose_threads("auto").threads >= 1


def test_an_explicit_count_wins_over_the_environment() -> None:
    choice = choose_threads(1, environ={"OMP_NUM_THREADS": "4"}, cores=8)
    assert choice.threads == 1 and choice.reason == "trainer.threads=1"
    assert choose_threads("2", environ={}, cores=8).threads == 2


@pytest.mark.parametrize("value", [0, -1, "two", "", True, 1.5, None])
def test_invalid_thread_counts_name_the_key_and_the_allowed_values(value) -> None:
    with pytest.raises(ValueError, match=r"trainer\.threads=.* use auto or a positive integer"):
        choose_threads(value, environ={}, cores=2)


def test_train_refuses_a_bad_thread_count_before_creating_a_run(tmp_path) -> None:
    cfg = compose_train(["+model=transformer", f"runs_root={tmp_path}", "trainer.threads=0"])
    with pytest.raises(UsageError, match=r"^trainer\.threads=0 is not allowed: use auto or a positive integer"):
        train(cfg)
    assert not any(tmp_path.iterdir())


def test_torch_threads_restores_the_callers_count() -> None:
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_the_log_line_names_count_reason_and_wait_policy(monkeypatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    line = describe(choose_threads("auto", environ={}, cores=2))
    assert line == "torch threads: 2 (auto: 2 usable cores; OpenMP wait GOMP_SPINCOUNT=10000)"
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert describe(choose_threads(1)).endswith("(trainer.threads=1; OpenMP wait OMP_WAIT_POLICY=PASSIVE)")


def _feed(monitor: ThroughputMonitor, times: list[float]) -> list[str]:
    return [w for t in times if (w := monitor.observe(t)) is not None]


def _quiet(n: int) -> list[float]:
    """Deterministic jitter of ±10% around QUIET."""
    return [QUIET * (1 + 0.05 * ((i * 7) % 5 - 2)) for i in range(n)]


def test_a_quiet_run_never_warns() -> None:
    monitor = ThroughputMonitor(HINT)
    assert _feed(monitor, _quiet(300)) == []
    assert monitor.postfix() == {}


def test_a_slow_stretch_warns_once_with_its_factor() -> None:
    monitor = ThroughputMonitor(HINT)
    warnings = _feed(monitor, _quiet(40) + [SLOW] * 8)
    assert warnings == [
        "updates are 3.1× slower than this run's median — another process is probably competing for the 2 cores; "
        "give each job fewer threads (trainer.threads=1) or run fewer jobs at once"
    ]
    assert monitor.postfix() == {"slow": "3.1x"}
    assert _feed(monitor, [SLOW] * 20) == []  # the same stretch: not again


def test_recovery_then_a_second_slow_stretch_warns_again() -> None:
    monitor = ThroughputMonitor(HINT)
    assert len(_feed(monitor, _quiet(40) + [SLOW] * 15)) == 1
    assert _feed(monitor, _quiet(15)) == []
    assert monitor.postfix() == {}
    assert len(_feed(monitor, [SLOW] * 15)) == 1


def test_hovering_near_the_threshold_does_not_warn_again() -> None:
    monitor = ThroughputMonitor(HINT)
    assert len(_feed(monitor, _quiet(60) + [SLOW] * 12 + [1.7 * QUIET] * 12 + [SLOW] * 12)) == 1


def test_no_warning_before_the_run_has_a_median() -> None:
    monitor = ThroughputMonitor(HINT, min_updates=20)
    assert _feed(monitor, _quiet(5) + [SLOW] * 14) == []  # 19 updates: too few to judge


def test_the_hint_fits_the_setting() -> None:
    assert "trainer.threads=1" not in contention_hint("cpu", cores=2, threads=1)
    assert "run fewer jobs at once" in contention_hint("cpu", cores=2, threads=1)
    assert "cores" not in contention_hint("cuda", cores=16, threads=16)


class _SlowAtSecondUpdate(ThroughputMonitor):
    """The trainer's wiring without a slow machine: a slow stretch begins at the second update."""

    updates = 0

    def observe(self, seconds: float) -> str | None:
        super().observe(seconds)
        self.updates += 1
        if self.updates == 2:
            self.slowdown = 3.0
            return "updates are 3.0× slower than this run's median — test"
        return None


def test_training_logs_threads_records_them_and_warns_without_a_bar(tmp_path, smoke_corpus, monkeypatch, caplog):
    monkeypatch.setattr(zoo.training.trainer, "ThroughputMonitor", _SlowAtSecondUpdate)
    caplog.set_level(logging.INFO, logger="zoo.train")
    overrides = smoke_overrides("transformer", smoke_corpus, tmp_path) + [
        "trainer.threads=1",
        "trainer.progress=false",
        "trainer.max_updates=3",
        "trainer.validate_every=3",
        "trainer.valid_quality_sentences=2",
        "evaluate_test=false",
    ]
    summary = train(compose_train(overrides))
    messages = [r.getMessage() for r in caplog.records if r.name == "zoo.train"]
    assert any(m.startswith("torch threads: 1 (trainer.threads=1; OpenMP wait ") for m in messages), messages
    assert sum("slower than this run's median" in m for m in messages) == 1
    machine = json.loads((Path(summary["run_dir"]) / "machine.json").read_text())
    assert machine["torch_threads"] == 1 and "omp_wait_policy" in machine and "gomp_spincount" in machine
    packages = (Path(summary["run_dir"]) / "pip_freeze.txt").read_text().splitlines()
    assert f"torch=={torch.__version__}" in packages
    assert packages == sorted(packages, key=lambda line: line.split("==")[0].lower())
