"""`StopRequest`: SIGINT/SIGTERM as a flag the training loop checks between updates, so a stop never splits one.

The loop then saves `last.pt` and exits (exact resume: zoo.training.trainer); a second signal aborts at once.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

log = logging.getLogger("zoo.train")


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag checked between updates (a second signal aborts)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("stop requested (signal %d): saving last.pt after this update; signal again to abort", signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
