"""Requests that were being served when tritonserver went away: the gate refuses their repeats for a while.

Why: a request that crashes Triton every time it runs can keep the service down however fast the supervisor restarts
it — a client resending it whenever `/v2/health/ready` turned 200 kept one server down with 5 requests in 120 s
(issue 84). The gate cannot know which of the requests in flight at a crash caused it, so it counts, per request
fingerprint (what the gate built for Triton, its id left out), the crashes it was in flight for: one is any
request's bad luck, `strikes` within `window_s` with no answer in between is a pattern, and that request is refused
for `refuse_s` — the others are served as before. A request Triton answers (any status) is not a crasher: its
strikes are forgotten, so a monitoring probe that happened to be in flight at two crashes keeps being served. The
requests "in flight at a crash" are those a replica was answering when the gate first lost it (a call that broke off
after reaching it); calls refused while it is down, and calls on the other replicas, count nothing. A request with a
strike is a suspect: serve/upstreams.py runs suspects one at a time, so when a retried one crashes the other replica
too, it is the only request there twice.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

STRIKES = 2  # crashes a request was in flight for before its repeats are refused
WINDOW_S = 600.0  # … within this long
REFUSE_S = 600.0  # how long its repeats are refused after the last one
MOST_REMEMBERED = 4096  # fingerprints kept (the oldest forgotten first): a flood of distinct requests is bounded


ANSWERED, BROKE_OFF, UNREACHABLE = "answered", "broke off", "unreachable"  # how a call to a replica ended


@dataclass
class CrashMemory:
    strikes: int = STRIKES
    window_s: float = WINDOW_S
    refuse_s: float = REFUSE_S
    seen: dict[bytes, list[float]] = field(default_factory=dict)  # fingerprint digest → crash times
    in_flight: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # call token → (digest, replica)
    lost: set[int] = field(default_factory=set)  # replicas lost by a call and not answering since
    _tokens: int = 0

    @staticmethod
    def digest(built: bytes) -> bytes:
        return hashlib.sha256(built).digest()

    def begin(self, digest: bytes, replica: int = 0) -> int:
        """A call to `replica` for `digest`'s request starts; the token ends it."""
        self._tokens += 1
        self.in_flight[self._tokens] = (digest, replica)
        return self._tokens

    def end(self, token: int, outcome: str) -> None:
        """The call ended: ANSWERED (any status), BROKE_OFF (the replica went away while it served) or UNREACHABLE
        (it could not be reached). The first call that lost a replica by breaking off marks every request in flight
        on it, its own included, as there at a crash."""
        digest, replica = self.in_flight.pop(token, (b"", 0))
        if outcome == ANSWERED:
            self.lost.discard(replica)
            self.seen.pop(digest, None)  # answered: not the request that crashed Triton
        elif replica not in self.lost:
            self.lost.add(replica)
            if outcome == BROKE_OFF:
                there = {d for d, r in self.in_flight.values() if r == replica}
                for crashed in there | {digest}:
                    self.crashed_during(crashed)

    def suspect(self, digest: bytes, now: float | None = None) -> bool:
        """Whether the request was in flight at a crash within the window (and not answered since)."""
        now = time.monotonic() if now is None else now
        return any(now - t < self.window_s for t in self.seen.get(digest, ()))

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
