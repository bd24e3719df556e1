"""The tritonserver replicas behind the gate and the one way both fronts call them (serve/gate_http.py,
serve/gate_grpc.py): the least busy replica that is up, and once more on another when it broke off or could not be
reached — so one crashed tritonserver costs its requests in flight a retry, not an outage.

Why here and not in each front: which replica, when it counts as down, which requests were there at a crash (serve/
crash_memory.py) and that no client can cancel a call are the same over HTTP and gRPC; the fronts only say how to
send one request to one replica and how its failure reads. Every request the gate builds is side-effect free
(inference, metadata, health), so a retry is always safe. Requests with a crash strike (suspects) run one at a time:
were a retried crasher to take the second replica down too, it would be the only request in flight at both crashes,
and only its repeats are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from serve.crash_memory import ANSWERED, BROKE_OFF, UNREACHABLE, CrashMemory

LOG = logging.getLogger("serve.gate")  # gate.log: the operator reads there which replica was lost and why
DOWN_S = 1.0  # a replica lost by a call is passed over this long (then tried again: restarted ones come back)
T = TypeVar("T")


class UpstreamLost(Exception):
    """A call that did not get Triton's answer: `broke_off` — the replica went away while serving it (a crash),
    else it could not be reached (restarting, refused)."""

    def __init__(self, broke_off: bool, detail: str = "") -> None:
        super().__init__(detail or ("broke off" if broke_off else "unreachable"))
        self.broke_off = broke_off


@dataclass
class Replica:
    """One tritonserver behind the gate: its loopback listeners, the gate's calls on it, and until when it is
    passed over."""

    index: int
    http_port: int
    grpc_port: int | None
    in_flight: int = 0
    down_until: float = 0.0


class Upstreams:
    """The replicas, the crash memory and the gate's calls to Triton, which run as tasks of their own: a client that
    hangs up (or cancels a stream) leaves its call to finish inside Triton and its answer dropped here — Triton 2.51
    crashed on streams cancelled mid-answer."""

    def __init__(self, replicas: list[Replica]) -> None:
        if not replicas:
            raise ValueError("the gate needs at least one tritonserver replica")
        self.replicas = replicas
        self.memory = CrashMemory()
        self.running: set[asyncio.Task] = set()
        self._suspects: asyncio.Lock | None = None
        self._turn = 0

    @classmethod
    def on_ports(cls, http_ports: list[int], grpc_ports: list[int] | None) -> Upstreams:
        grpc = grpc_ports or [None] * len(http_ports)
        return cls([Replica(i, h, g) for i, (h, g) in enumerate(zip(http_ports, grpc, strict=True))])

    def pick(self, tried: list[int]) -> Replica:
        """The least busy replica that is up and not tried yet (ties in turn); when none is up, the untried one back
        soonest (a replica restarted in the meantime answers); when every one was tried, the one back soonest."""
        now = time.monotonic()
        pool = [r for r in self.replicas if r.index not in tried] or self.replicas
        up = [r for r in pool if r.down_until <= now]
        if not up:
            return min(pool, key=lambda r: r.down_until)
        self._turn += 1
        return min(up, key=lambda r: (r.in_flight, (r.index - self._turn) % len(self.replicas)))

    async def call(self, digest: bytes, send: Callable[[Replica], Awaitable[T]]) -> T:
        """`send(replica)` on a replica, and once more on another (or, alone, the same) when it raised
        UpstreamLost; the last UpstreamLost propagates. `digest`: the inference request's fingerprint (b"" for
        metadata and health), whose calls the crash memory follows."""
        tried: list[int] = []
        lost: UpstreamLost | None = None
        for _ in range(2):
            replica = self.pick(tried)
            tried.append(replica.index)
            replica.in_flight += 1  # counted from the pick: the next call's pick sees it
            try:
                return await self._run(self._attempt(replica, digest, send))
            except UpstreamLost as exc:
                lost = exc
        assert lost is not None
        raise lost

    async def _attempt(self, replica: Replica, digest: bytes, send: Callable[[Replica], Awaitable[T]]) -> T:
        """One call on one replica, with its bookkeeping; all of it runs in the uncancellable task."""
        suspect = bool(digest) and self.memory.suspect(digest)
        async with self._suspect_lock() if suspect else contextlib.nullcontext():
            token = self.memory.begin(digest, replica.index) if digest else 0
            outcome = ANSWERED  # an error Triton answered with (raised by `send`) is an answer too
            try:
                return await send(replica)
            except UpstreamLost as exc:
                outcome = BROKE_OFF if exc.broke_off else UNREACHABLE
                if replica.down_until <= time.monotonic():  # the call that lost it, not every one refused after
                    LOG.warning("replica %d %s (%d calls there): %s", replica.index, outcome, replica.in_flight, exc)
                raise
            finally:
                replica.in_flight -= 1
                replica.down_until = 0.0 if outcome == ANSWERED else time.monotonic() + DOWN_S
                if token:
                    self.memory.end(token, outcome)

    def _suspect_lock(self) -> asyncio.Lock:
        if self._suspects is None:  # made on the running loop
            self._suspects = asyncio.Lock()
        return self._suspects

    async def _run(self, call: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(call)
        self.running.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Task) -> None:
        self.running.discard(task)
        if not task.cancelled():
            task.exception()  # read, so an answer nobody waits for is not logged as "never retrieved"
