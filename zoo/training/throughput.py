"""Notice when training updates become much slower than the run's own pace, and say why.

A run that shares its cores with another CPU-bound process can slow down several-fold without any error
(8× for the CPU preset on 2 cores next to one other job); the tokens/s column drops, but nobody reads it
mid-run. The monitor compares the last few updates with the run's own median, so it needs no
machine-specific baseline, and it warns once per slow stretch: again only after throughput has recovered
and dropped again.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque


def contention_hint(device_type: str, cores: int, threads: int) -> str:
    """The likely cause and the fix, for the slowdown warning."""
    if device_type != "cpu":
        return "another process is probably competing for this machine; run fewer jobs at once"
    fewer = "give each job fewer threads (trainer.threads=1) or " if threads > 1 else ""
    return f"another process is probably competing for the {cores} cores; {fewer}run fewer jobs at once"


class ThroughputMonitor:
    """Per-update wall times in, one warning per slow stretch out.

    Slow = the median of the last `recent` updates is above `slow_factor` × the median of every update of
    the run so far (from `min_updates` on); recovered = that ratio is back below `recover_factor`. The gap
    between the two keeps a ratio hovering near the threshold from warning again and again. Both are lower
    medians (actual update times): with an even window the mean of a quiet and a slow update would report
    half the slowdown that more than half of the recent updates show.
    """

    def __init__(
        self,
        hint: str,
        recent: int = 10,
        min_updates: int = 20,
        slow_factor: float = 2.0,
        recover_factor: float = 1.5,
    ) -> None:
        if not 1 < recover_factor <= slow_factor:
            raise ValueError(f"need 1 < recover_factor <= slow_factor, got {recover_factor} and {slow_factor}")
        self.hint = hint
        self.min_updates = max(min_updates, recent)
        self.slow_factor = slow_factor
        self.recover_factor = recover_factor
        self._sorted: list[float] = []  # every update's time, kept sorted: the median is an index away
        self._recent: deque[float] = deque(maxlen=recent)
        self.slowdown: float | None = None  # the current ratio while in a slow stretch, else None

    def observe(self, seconds: float) -> str | None:
        """Record one update's wall time; return a warning when a slow stretch begins, else None."""
        bisect.insort(self._sorted, seconds)
        self._recent.append(seconds)
        if len(self._sorted) < self.min_updates:
            return None
        median = self._sorted[(len(self._sorted) - 1) // 2]
        ratio = statistics.median_low(self._recent) / median if median > 0 else 1.0
        if self.slowdown is not None:
            self.slowdown = ratio if ratio >= self.recover_factor else None
            return None
        if ratio <= self.slow_factor:
            return None
        self.slowdown = ratio
        return f"updates are {ratio:.1f}× slower than this run's median — {self.hint}"

    def postfix(self) -> dict[str, str]:
        """For the progress bar: `{"slow": "3.1x"}` during a slow stretch, else nothing."""
        return {} if self.slowdown is None else {"slow": f"{self.slowdown:.1f}x"}


__all__ = ["ThroughputMonitor", "contention_hint"]
