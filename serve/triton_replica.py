"""One tritonserver process of a server (serve/server.py runs one or more behind the gate): its command, listeners,
shared-memory prefix and log; started, started again after a crash, waited for, stopped.

Why apart from the server: a server with replicas does each of these per process — a crashed replica is restarted
while the others serve, with a fresh shm prefix (the dead one's stubs may still map the old regions), and stopping
the server stops each replica with its stubs and regions.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serve import child
from serve.errors import ServerError
from serve.launch import SHM_PREFIX_ARG, launch_triton, log_errors, relaunch_triton
from serve.server_settings import TritonPorts
from serve.shm import OUR_SHM, kill_stubs, remove_shm, remove_unmapped_shm


@dataclass
class TritonInfo:
    """One replica as server.json records it: its process, its own (loopback behind the proxy) listeners, shm
    prefix and log."""

    pid: int
    http_port: int
    grpc_port: int
    metrics_port: int
    shm_prefix: str
    log: str


def fresh_shm_prefix() -> str:
    return f"{OUR_SHM}{secrets.token_hex(4)}_"


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class TritonReplica:
    """A tritonserver started with `command` (serve/launch.py's triton_command) on `ports`, logging to `log`."""

    def __init__(self, index: int, command: list[str], ports: TritonPorts, log: Path, detach: bool) -> None:
        self.index, self.command, self.ports, self.log, self.detach = index, command, ports, log, detach
        self.process: subprocess.Popen | None = None
        self.old_prefixes: list[str] = []

    @property
    def name(self) -> str:
        return f"tritonserver {self.index}"

    @property
    def shm_prefix(self) -> str:
        return next(a for a in self.command if a.startswith(SHM_PREFIX_ARG))[len(SHM_PREFIX_ARG) :]

    def info(self) -> TritonInfo:
        assert self.process is not None
        return TritonInfo(
            self.process.pid, self.ports.http, self.ports.grpc, self.ports.metrics, self.shm_prefix, str(self.log)
        )

    def launch(self) -> None:
        """The first start: the log of the start before is rotated to `<log>.1`."""
        self.process = launch_triton(self.command, self.log, self.detach)

    def relaunch(self) -> None:
        """Start again after a crash, with a fresh shm prefix (the dead server's stubs are killed first: they would
        keep its regions mapped), appending to the same log."""
        old = self.shm_prefix
        prefix = fresh_shm_prefix()
        self.command = [SHM_PREFIX_ARG + prefix if a.startswith(SHM_PREFIX_ARG) else a for a in self.command]
        self.old_prefixes.append(old)
        kill_stubs(old)
        remove_unmapped_shm(old)
        self.process = relaunch_triton(self.command, self.log, self.detach)

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        with contextlib.suppress(OSError):
            return http_get(f"http://127.0.0.1:{self.ports.http}/v2/health/ready")[0] == 200
        return False

    def wait_ready(self, timeout: float, cancelled: Callable[[], bool] | None = None) -> None:
        """Poll readiness; if the process dies, raise with Triton's own reason from its log."""
        assert self.process is not None
        outcome = child.wait_until(self.process, self.ready, timeout, cancelled, every=0.25)
        if outcome == child.READY:
            return
        if outcome == child.CANCELLED:
            raise ServerError("interrupted while waiting for tritonserver to become ready; stopped it")
        late = f"was not ready after {timeout:.0f} s"
        why = f"exited with code {self.process.returncode} while starting" if outcome == child.EXITED else late
        raise ServerError(f"{self.name} {why} (log: {self.log}):\n{log_errors(self.log)}")

    def stop(self, timeout: float) -> int | None:
        """SIGTERM (Triton unloads its models and exits), SIGKILL after `timeout`; then its stubs and shm regions,
        of this start and of every earlier one, are removed."""
        code = child.stop(self.process.pid, timeout, self.process) if self.process is not None else None
        for prefix in (*self.old_prefixes, self.shm_prefix):
            kill_stubs(prefix)  # none outlives its server
            remove_shm(prefix)
        return code
