"""Learning-rate schedules written from their formulas: fairseq's inverse-sqrt and the budgeted linear decay
(warm-up, then linear to zero where max_updates or max_minutes ends), stepped through a real optimizer."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from tests.conftest import smoke_overrides
from tests.zoo_testing import compose_train
from zoo.train import UsageError, train
from zoo.training.optim import budget_left, budget_reached, inverse_sqrt_schedule, linear_decay_schedule

PEAK, INIT, WARMUP, TOTAL = 1e-3, 1e-7, 4, 12


def _lrs(scheduler: torch.optim.lr_scheduler.LambdaLR, steps: int) -> list[float]:
    """The lr of update 1 … steps (the scheduler is stepped after each optimizer step, as the trainer does)."""
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)


def _warmup(step: int) -> float:
    return PEAK * (INIT / PEAK + (1 - INIT / PEAK) * step / WARMUP)


def test_inverse_sqrt_follows_fairseq() -> None:
    got = _lrs(inverse_sqrt_schedule(_optimizer(), WARMUP, INIT), TOTAL)
    want = [_warmup(s) if s < WARMUP else PEAK * (WARMUP / s) ** 0.5 for s in range(TOTAL)]
    assert got == pytest.approx(want, rel=1e-12)


def test_linear_decay_reaches_zero_at_max_updates() -> None:
    def left(step: int) -> float:
        return budget_left(step, WARMUP, TOTAL)

    got = _lrs(linear_decay_schedule(_optimizer(), WARMUP, left, INIT), TOTAL + 3)
    want = [_warmup(s) if s < WARMUP else PEAK * max(TOTAL - s, 0) / (TOTAL - WARMUP) for s in range(TOTAL + 3)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert got[WARMUP] == pytest.approx(PEAK) and got[TOTAL] == 0.0 and got[-1] == 0.0  # never negative


def test_budget_left_by_time_counts_from_the_end_of_warmup() -> None:
    # 10-minute budget, warm-up ended after 60 s: half of the remaining 540 s spent → half the peak left
    assert budget_left(500, 400, 0, elapsed_s=330, max_minutes=10, warmup_end_s=60) == pytest.approx(0.5)
    assert budget_left(500, 400, 0, elapsed_s=600, max_minutes=10, warmup_end_s=60) == pytest.approx(0.0)
    # both limits: the one that ends first decides
    assert budget_left(1100, 400, 1200, elapsed_s=330, max_minutes=10, warmup_end_s=60) == pytest.approx(100 / 800)
    assert budget_left(500, 400, 3000, elapsed_s=330, max_minutes=10, warmup_end_s=60) == pytest.approx(0.5)
    assert budget_left(7, 400, 0) == 1.0  # no limit: no decay


def test_budget_reached_names_the_limit_that_spent_the_fraction_first() -> None:
    """One rule for the end of training (fraction 1) and GHT-PS's fractional vote_at: updates, then wall time."""
    assert budget_reached(1.0, 3000, 3000, elapsed_s=10, max_minutes=16) == "max_updates"
    assert budget_reached(1.0, 2999, 3000, elapsed_s=16 * 60, max_minutes=16) == "max_minutes"
    assert budget_reached(1.0, 2999, 3000, elapsed_s=10**6, max_minutes=0) == ""  # 0: no wall-clock limit
    assert budget_reached(0.6, 1800, 3000, elapsed_s=0, max_minutes=16) == "max_updates"
    assert budget_reached(0.6, 1799, 3000, elapsed_s=0.6 * 16 * 60, max_minutes=16) == "max_minutes"
    assert budget_reached(0.6, 1799, 3000, elapsed_s=575, max_minutes=16) == ""


def test_a_linear_run_logs_the_decay_and_ends_at_zero(tmp_path: Path, smoke_corpus: Path) -> None:
    overrides = smoke_overrides("transformer", smoke_corpus, tmp_path) + [
        "trainer.lr_schedule=linear",
        "trainer.max_updates=30",
        "trainer.warmup_updates=10",
        "trainer.log_every=5",
        "trainer.validate_every=30",
    ]
    run_dir = Path(train(compose_train(overrides))["run_dir"])
    rows = {int(r["step"]): float(r["lr"]) for r in csv.DictReader((run_dir / "metrics.csv").open())}
    peak = 3e-3  # smoke_overrides' trainer.lr
    for step, lr in rows.items():
        if step >= 10:
            assert lr == pytest.approx(peak * (30 - step) / 20, rel=1e-9, abs=1e-12), step
    assert rows[30] == 0.0


def test_an_unknown_schedule_is_refused_before_a_run_dir_exists(tmp_path: Path, smoke_corpus: Path) -> None:
    overrides = smoke_overrides("transformer", smoke_corpus, tmp_path) + ["trainer.lr_schedule=cosine"]
    with pytest.raises(UsageError, match=r"trainer.lr_schedule='cosine' is not a schedule; use one of inverse_sqrt"):
        train(compose_train(overrides))
    assert not any(tmp_path.iterdir())


def test_the_progress_bar_counts_to_the_update_the_run_stops_at() -> None:
    """Issue 63: the CPU preset's bar said `0/3000 … 50:50 left` while its 16-minute budget ended the run near update
    1000. The total is now the update the run stops at: max_updates, or where the wall-clock budget runs out at the
    measured rate, whichever comes first."""
    from zoo.training.progress import TrainingBar, projected_stop

    # 16 minutes at 0.95 s per update, 100 updates (95 s) in: 960 − 95 = 865 s left → 910 more → stops at 1010
    assert projected_stop(100, 3000, 95.0, 16, 0.95) == 1010
    assert projected_stop(100, 600, 95.0, 16, 0.95) == 600  # max_updates ends it first
    assert projected_stop(100, 3000, 95.0, 0, 0.95) == 3000  # no wall-clock budget
    assert projected_stop(1200, 3000, 2000.0, 16, 0.95) == 1200  # over time: it stops now
    bar = TrainingBar(step=0, elapsed_s=0.0, max_updates=3000, max_minutes=16, shown=False)
    for step in range(1, 101):
        bar.update(step, elapsed_s=0.95 * step)
    assert bar.bar.total == 1010
    bar.close()
