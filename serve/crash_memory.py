"""Requests that were being served when tritonserver went away: the gate refuses their repeats for a while.

Why: a request that crashes Triton every time it runs can keep the service down however fast the supervisor restarts
it — a client resending it whenever `/v2/health/ready` turned 200 kept one server down with 5 requests in 120 s
(issue 84). The gate cannot know which of the requests in flight at a crash caused it, so it counts, per request
fingerprint (what the gate built for Triton, its id left out), the crashes it was in flight for: one is any
request's bad luck, `strikes` within `window_s` with no answer in between is a pattern, and that request is refused
for `refuse_s` — the others are served as before. A request Triton answers (any status) is not a crasher: its
strikes are forgotten, so a monitoring probe that happened to be in flight at two crashes keeps being served. The
requests "in flight at a crash" are those being answered when the gate first lost Triton after having reached it (a
call that failed for good); calls made while it stays down count nothing.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

STRIKES = 2  # crashes a request was in flight for before its repeats are refused
WINDOW_S = 600.0  # … within this long
REFUSE_S = 600.0  # how long its repeats are refused after the last one
MOST_REMEMBERED = 4096  # fingerprints kept (the oldest forgotten first): a flood of distinct requests is bounded


@dataclass
class CrashMemory:
    strikes: int = STRIKES
    window_s: float = WINDOW_S
    refuse_s: float = REFUSE_S
    seen: dict[bytes, list[float]] = field(default_factory=dict)  # fingerprint digest → crash times
    in_flight: dict[int, bytes] = field(default_factory=dict)  # call token → its request's digest
    reachable: bool = True  # False from a call that lost Triton until one that reached it
    _tokens: int = 0

    @staticmethod
    def digest(built: bytes) -> bytes:
        return hashlib.sha256(built).digest()

    def begin(self, digest: bytes) -> int:
        """A call to Triton for `digest`'s request starts; the token ends it."""
        self._tokens += 1
        self.in_flight[self._tokens] = digest
        return self._tokens

    def end(self, token: int, reached: bool) -> None:
        """The call ended: `reached` — Triton answered (any status), else it could not be reached or broke off.
        The first call that lost Triton marks every request in flight, its own included, as there at a crash."""
        if reached:
            self.reachable = True
            self.seen.pop(self.in_flight.get(token, b""), None)  # answered: not the request that crashed Triton
        elif self.reachable:
            self.reachable = False
            for digest in set(self.in_flight.values()):
                self.crashed_during(digest)
        self.in_flight.pop(token, None)

    def crashed_during(self, digest: bytes, now: float | None = None) -> None:
        """`digest`'s request was being answered when Triton's connection broke."""
        now = time.monotonic() if now is None else now
        times = [t for t in self.seen.pop(digest, []) if now - t < self.window_s]
        self.seen[digest] = [*times, now]  # re-inserted: the most recent last
        while len(self.seen) > MOST_REMEMBERED:
            del self.seen[next(iter(self.seen))]

    def refused_for(self, digest: bytes, now: float | None = None) -> float:
        """Seconds this request is still refused (0: it may run)."""
        now = time.monotonic() if now is None else now
        times = [t for t in self.seen.get(digest, []) if now - t < self.window_s]
        if len(times) < self.strikes:
            return 0.0
        return max(0.0, times[-1] + self.refuse_s - now)

    def message(self, seconds: float) -> str:
        return (
            f"this request was being served when tritonserver crashed, {self.strikes} times in "
            f"{self.window_s / 60:.0f} minutes; it is refused for {seconds:.0f} s more (other requests are served)"
        )
