"""The processes a server runs — tritonserver replicas, nginx, the gate, a detached launcher — started, waited for
and stopped one way.

Why one home: each was spawned, polled until it listened and signalled until gone by its own copy of the same loops,
so a rule learned by one (never signal a pid that now belongs to another program; reap an exited child so it does not
linger as a zombie) reached only that copy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

READY, EXITED, LATE, CANCELLED = "ready", "exited", "late", "cancelled"


def spawn(
    cmd: list[str], log: Path, detach: bool, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    """Run `cmd` with stdout and stderr appended to `log` (O_APPEND: the supervisor truncates logs in place when
    they grow too big) and stdin closed; `detach`: in its own session, so it outlives this process."""
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=detach,
            cwd=cwd,
        )


def wait_until(
    process: subprocess.Popen,
    ready: Callable[[], bool],
    timeout: float,
    cancelled: Callable[[], bool] | None = None,
    every: float = 0.1,
) -> str:
    """Poll `ready()` every `every` s: READY once it holds, else why not — EXITED (the process ended first; its
    returncode is set), LATE (`timeout` s passed) or CANCELLED (`cancelled()` held). The caller says it in words."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cancelled is not None and cancelled():
            return CANCELLED
        if process.poll() is not None:
            return EXITED
        if ready():
            return READY
        time.sleep(every)
    return LATE


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie — exited, not yet reaped — does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True


def runs(pid: int, program: str) -> bool:
    """Whether `pid`'s command line names `program` (a pid read from a state file may have been reused since)."""
    try:
        return program in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def stop(
    pid: int,
    timeout: float,
    process: subprocess.Popen | None = None,
    program: str | None = None,
    sig: int = signal.SIGTERM,
) -> int | None:
    """Send `sig` (SIGKILL after `timeout`) and wait until the process is gone. Returns its exit code where this
    process started it (`process`), else 0 (it exited) or −9 (killed); None where nothing ran. A pid this process did
    not start is signalled only while it runs `program`: a reused pid belongs to someone else."""
    if process is None and not (pid_alive(pid) and (program is None or runs(pid, program))):
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid, process):
            return process.returncode if process is not None else 0
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return process.wait(10) if process is not None else -9


def _gone(pid: int, process: subprocess.Popen | None) -> bool:
    if process is not None:
        return process.poll() is not None
    with contextlib.suppress(ChildProcessError):  # our exited child would linger as a zombie: reap it
        os.waitpid(pid, os.WNOHANG)
    return not pid_alive(pid)


__all__ = ["CANCELLED", "EXITED", "LATE", "READY", "pid_alive", "runs", "spawn", "stop", "wait_until"]
