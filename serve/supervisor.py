"""Keeps a started server serving: restarts a crashed tritonserver replica (or the gate) with back-off, and bounds the
logs.

Why: one request that crashed tritonserver used to take serving down until an operator came — nginx answered 502
to everyone and server.log said nothing. Now the process that started the server (`serve.start`, or whoever
called `Server.start`) watches its children: when one exits without being asked to, a line with its exit signal
goes into server.log, the server's state becomes "degraded" (another replica serves, and the gate retries there)
or "restarting" (none does: the gate answers 503 / UNAVAILABLE "retry"), and it is started again after a back-off
(0.5 s, doubling to 30 s; reset after 60 s up), so an unforeseen crash costs seconds. Each child restarts in a thread
of its own, and a back-off is cut short once no other replica serves: waiting never leaves zero replicas up. The
last 1 MB of the crashed replica's log is kept as `crash.<n>.log`.

Logs are bounded while running: every `LOG_CHECK_S` each log over its size is copied to `<log>.1` (older ones
shifted, the oldest dropped) and truncated in place ("copytruncate": tritonserver, nginx and the gate write with
O_APPEND, so they carry on at the new end without being told).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from serve.state_lock import stop_requested

SERVER_LOG_BYTES = 16 << 20  # server.log: 16 MB, 5 older kept (server.log.1 … .5) → ≤ 96 MB
PROXY_LOG_BYTES = 4 << 20  # nginx's error.log / stdout.log, the gate's stdout: 4 MB, 3 older kept
CRASH_LOG_BYTES = 1 << 20  # the tail of server.log kept per crash
CRASH_LOGS_KEPT = 5
LOG_CHECK_S = 2.0


@dataclass(frozen=True)
class RestartPolicy:
    """How fast a crashed child comes back: `first_delay_s`, doubling per crash in a row up to `max_delay_s`; a
    child up for `stable_after_s` starts the count again."""

    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_after_s: float = 60.0
    poll_s: float = 0.2

    def delay(self, crashes_in_a_row: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** max(0, crashes_in_a_row - 1))


class Supervised(Protocol):
    """What the supervisor needs of a server (serve.server.Server implements it)."""

    def children(self) -> dict[str, Callable[[], int | None]]:
        """name → poll(): None while that child runs, else its exit code (negative: the signal)."""
        ...

    def restart_child(self, name: str, cancelled: Callable[[], bool]) -> None:
        """Start child `name` again and wait until it serves (raises when it cannot)."""
        ...

    def others_serving(self, name: str) -> bool:
        """Whether a tritonserver other than child `name` is up (the back-off may wait only then)."""
        ...

    def crash_log(self, name: str) -> Path | None:
        """The log whose tail is kept when child `name` crashes (None: none kept)."""
        ...

    def set_state(self, state: str) -> None: ...

    def log_paths(self) -> dict[Path, tuple[int, int]]:
        """log → (max bytes, older copies kept)."""
        ...


def describe_exit(code: int | None) -> str:
    """'signal SIGFPE (8)' for a negative Popen code, else 'exit code N'."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name} ({-code})"
        return f"signal {-code}"
    return f"exit code {code}"


def rotate_by_size(log: Path, max_bytes: int, keep: int) -> bool:
    """Copy `log` to `log.1` (shifting `.1` … to `.2` …, dropping beyond `keep`) and truncate it, when over
    `max_bytes`. Whatever is written between the copy and the truncation is lost (a few lines at most)."""
    try:
        if log.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    for n in range(keep - 1, 0, -1):
        older = log.with_name(f"{log.name}.{n}")
        if older.exists():
            older.replace(log.with_name(f"{log.name}.{n + 1}"))
    shutil.copyfile(log, log.with_name(f"{log.name}.1"))
    with log.open("r+b") as fh:
        fh.truncate(0)
    return True


def keep_crash_log(log: Path, reason: str) -> Path:
    """The last CRASH_LOG_BYTES of `log` as `crash.1.log` (older ones shifted, CRASH_LOGS_KEPT kept): the lines
    before a crash survive however much the restarted server logs afterwards."""
    directory = log.parent
    for n in range(CRASH_LOGS_KEPT - 1, 0, -1):
        older = directory / f"crash.{n}.log"
        if older.exists():
            older.replace(directory / f"crash.{n + 1}.log")
    tail = b""
    with contextlib.suppress(OSError), log.open("rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - CRASH_LOG_BYTES))
        tail = fh.read()
    target = directory / "crash.1.log"
    target.write_bytes(tail + f"\n{reason}\n".encode())
    return target


def log_line(log: Path, text: str) -> None:
    """A supervisor line in server.log (appended; tritonserver writes to it with O_APPEND too)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    with log.open("a") as fh:
        fh.write(f"Z{stamp} UTC zoo-supervisor] {text}\n")


class Supervisor(threading.Thread):
    """The watching thread (daemon: it dies with its process, and the server is then unsupervised); each restart
    runs in a thread of its own, so one child's back-off never holds up another's restart."""

    def __init__(self, server: Supervised, state_dir: Path, log: Path, policy: RestartPolicy | None = None) -> None:
        super().__init__(name="zoo-supervisor", daemon=True)
        self.server, self.state_dir, self.log = server, state_dir, log
        self.policy = policy or RestartPolicy()
        self.stopping = threading.Event()
        self.restarts = 0
        self.restarting: dict[str, threading.Thread] = {}
        self.state_lock = threading.Lock()  # restart threads and the log share server.log and server.json

    def cancelled(self) -> bool:
        return self.stopping.is_set() or stop_requested(self.state_dir)

    def run(self) -> None:
        crashes: dict[str, int] = {}
        up_since: dict[str, float] = {}
        next_rotation = 0.0
        while not self.stopping.wait(self.policy.poll_s):
            if self.cancelled():
                return
            try:
                self._check(crashes, up_since)
                if time.monotonic() >= next_rotation:
                    next_rotation = time.monotonic() + LOG_CHECK_S
                    for path, (max_bytes, keep) in self.server.log_paths().items():
                        rotate_by_size(path, max_bytes, keep)
            except Exception as exc:  # a full disk, say: logged, and the watching goes on
                with contextlib.suppress(OSError):
                    log_line(self.log, f"supervisor error: {exc!r}"[:500])
                self.stopping.wait(LOG_CHECK_S)

    def _check(self, crashes: dict[str, int], up_since: dict[str, float]) -> None:
        now = time.monotonic()
        for name, poll in self.server.children().items():
            if name in self.restarting and self.restarting[name].is_alive():
                up_since.pop(name, None)
                continue
            code = poll()
            if code is None:
                if now - up_since.setdefault(name, now) > self.policy.stable_after_s:
                    crashes[name] = 0
                continue
            if self.cancelled():  # serve.stop ended it
                return
            crashes[name] = crashes.get(name, 0) + 1
            self.restarts += 1
            thread = threading.Thread(
                target=self._restart, args=(name, code, crashes[name], self.restarts), name=f"zoo-restart-{name}"
            )
            self.restarting[name] = thread
            thread.start()

    def _restart(self, name: str, code: int | None, crashes: int, number: int) -> None:
        delay = self.policy.delay(crashes)
        reason = f"{name} exited with {describe_exit(code)} without being stopped; restart {number}"
        crash_log = self.server.crash_log(name)
        with self.state_lock:
            log_line(self.log, f"{reason} in {delay:.1f} s (sooner once no other replica serves)")
            if crash_log is not None:
                keep_crash_log(crash_log, reason)
            self.server.set_state("restarting")
        if self._backoff(name, delay):
            return
        try:
            self.server.restart_child(name, self.cancelled)
        except Exception as exc:  # logged; the next poll sees it down and tries again, later
            with self.state_lock:
                log_line(self.log, f"restarting {name} failed: {str(exc).splitlines()[0] if str(exc) else exc!r}")
            return
        with self.state_lock:
            log_line(self.log, f"{name} restarted and ready")
            self.server.set_state("ready")

    def _backoff(self, name: str, delay: float) -> bool:
        """Wait `delay` — or `first_delay_s` only, once no other replica serves; True when stopped meanwhile."""
        begin = time.monotonic()
        while True:
            waited = time.monotonic() - begin
            if waited >= delay or (waited >= self.policy.first_delay_s and not self.server.others_serving(name)):
                return self.cancelled()
            if self.stopping.wait(min(self.policy.poll_s, delay - waited)) or self.cancelled():
                return True

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        for thread in list(self.restarting.values()):
            if thread.is_alive() and threading.current_thread() is not thread:
                thread.join(timeout)


__all__ = [
    "RestartPolicy",
    "Supervisor",
    "describe_exit",
    "keep_crash_log",
    "log_line",
    "rotate_by_size",
]
