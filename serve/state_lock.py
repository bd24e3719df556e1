"""One server per state directory: an exclusive lock held for the server's whole life.

Why: two `serve.start` on one repository could both pass the old check (server.json with a live pid) when the
second ran before the first had written it, and both reported success; `serve.stop` then stopped the one
server.json named. `flock` on `<state>/lock` is atomic, and the kernel releases it when the holder exits, however
it exits — so a crashed launcher never leaves a stale lock, and the second start refuses naming who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from serve.errors import ServeError

LOCK_FILE = "lock"
STOP_MARKER = "stopping"  # written by serve.stop before it signals anything: the supervisor must not restart


class StateLocked(ServeError):
    """Another server already runs from this state directory; the message names it and how to stop it."""


class StateLock:
    """The held lock (`release()` or process exit frees it); the holder's pid is written into the file."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _running(state: Path) -> str:
    """The running server as server.json and the lock file describe it (pid and ports), for the refusal."""
    parts = []
    with contextlib.suppress(OSError, ValueError):
        holder = (state / LOCK_FILE).read_text().strip()
        if holder:
            parts.append(f"started by pid {holder}")
    with contextlib.suppress(OSError, ValueError, KeyError):
        info = json.loads((state / "server.json").read_text())
        pids = ", ".join(str(t["pid"]) for t in info["tritons"])
        parts.append(
            f"tritonserver pid {pids}, HTTP {info['host']}:{info['http_port']}, gRPC {info['host']}:{info['grpc_port']}"
        )
    return "; ".join(parts) or "still starting"


def acquire(state: Path, repo: Path) -> StateLock:
    """Take `<state>/lock` or raise StateLocked naming the running server (pid, ports) and the stop command."""
    path = state / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateLocked(
            f"a server already runs from {state} ({_running(state)}); stop it first with "
            f"`python -m serve.stop repo={repo}`"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    (state / STOP_MARKER).unlink(missing_ok=True)
    return StateLock(fd, path)


def held(state: Path) -> bool:
    """Whether some process holds the state's lock now (a launcher still supervising its server)."""
    path = state / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def request_stop(state: Path) -> None:
    """Tell the supervisor of this state's server not to restart what is about to be stopped."""
    (state / STOP_MARKER).write_text(f"{os.getpid()}\n")


def stop_requested(state: Path) -> bool:
    return (state / STOP_MARKER).exists()


__all__ = ["StateLock", "StateLocked", "acquire", "held", "request_stop", "stop_requested"]
