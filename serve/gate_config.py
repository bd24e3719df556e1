"""What the gate's two fronts share (serve/gate_http.py, serve/gate_grpc.py): its configuration, the calls it makes to
Triton — which no client can cancel — and what it remembers of crashes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.crash_memory import CrashMemory
from serve.served_models import ServedModel

RESTARTING = "tritonserver is not reachable (restarting after a crash?); retry in a few seconds"
UNREACHABLE = ("failed to connect", "connection refused", "socket closed", "connection reset", "unavailable for")
ADMIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # an admin key the gate passes on (Triton checks it)


@dataclass(frozen=True)
class GateConfig:
    """Where the gate listens and forwards (all on loopback), what it serves and its log."""

    http_port: int
    triton_http_port: int
    grpc_port: int | None
    triton_grpc_port: int | None
    max_body_bytes: int
    # Triton's calls run to their end whatever the client does (a client's deadline passed on would cancel them
    # inside Triton, the path that crashed 2.51): nginx's limit on Triton's answer bounds them instead
    upstream_timeout_s: float
    models: dict[str, ServedModel]
    log: str
    nginx_log_port: int | None = None  # nginx's error log arrives here as syslog (loopback UDP) …
    nginx_log: str | None = None  # … and is written here, repeats collapsed (serve/log_collapse.py)

    @classmethod
    def read(cls, path: Path) -> GateConfig:
        raw = json.loads(path.read_text())
        return cls(**{**raw, "models": {n: ServedModel.from_json(m) for n, m in raw["models"].items()}})

    def write(self, path: Path) -> None:
        raw = {**self.__dict__, "models": {n: m.to_json() for n, m in self.models.items()}}
        path.write_text(json.dumps(raw, indent=1))


class UpstreamCalls:
    """Every call to Triton runs as a task of its own that the client cannot cancel: a client that hangs up (or
    cancels a stream) leaves the call to finish inside Triton and its answer dropped here — Triton 2.51 crashed on
    streams cancelled mid-answer. The tasks are kept until done, their errors read."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task] = set()
        self.memory = CrashMemory()  # the requests in flight when Triton went away (serve/crash_memory.py)

    async def run(self, call: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(call)
        self.running.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Task) -> None:
        self.running.discard(task)
        if not task.cancelled():
            task.exception()  # read, so an answer nobody waits for is not logged as "never retrieved"
