"""The training progress bar: its total is the update the run will actually stop at — `max_updates`, or, when a
wall-clock budget (`max_minutes`) ends the run first, the update the current rate reaches by then — so the count and
the ETA tell the truth on the CPU preset, whose 16-minute budget ends a 3000-update run near update 1000."""

from __future__ import annotations

import sys

from tqdm import tqdm


def projected_stop(step: int, max_updates: int, elapsed_s: float, max_minutes: float, seconds_per_update: float) -> int:
    """The update a run stops at: `max_updates`, or sooner if `max_minutes` of training time run out first at
    `seconds_per_update` (elapsed_s: training time so far; 0 minutes = no wall-clock budget)."""
    if not max_minutes or seconds_per_update <= 0:
        return max_updates
    left = max(max_minutes * 60 - elapsed_s, 0.0)
    return max(step, min(max_updates, step + int(left / seconds_per_update)))


class TrainingBar:
    """tqdm over updates whose total follows `projected_stop` (re-estimated from this process's own rate)."""

    def __init__(self, step: int, elapsed_s: float, max_updates: int, max_minutes: float, shown: bool) -> None:
        self.max_updates, self.max_minutes = max_updates, max_minutes
        self.start_step, self.start_elapsed = step, elapsed_s
        self.bar = tqdm(
            total=max_updates,
            initial=step,
            desc="train",
            unit="upd",
            disable=not shown,
            dynamic_ncols=True,
            mininterval=1.0 if sys.stderr.isatty() else 30.0,
        )

    def update(self, step: int, elapsed_s: float) -> None:
        done = step - self.start_step
        if self.max_minutes and done:
            per_update = (elapsed_s - self.start_elapsed) / done
            total = projected_stop(step, self.max_updates, elapsed_s, self.max_minutes, per_update)
            if total != self.bar.total:
                self.bar.total = total
        self.bar.update(1)

    def set_postfix(self, values: dict[str, str]) -> None:
        self.bar.set_postfix(values)

    def close(self) -> None:
        self.bar.close()


__all__ = ["TrainingBar", "projected_stop"]
