"""The Python backend's shared-memory regions in /dev/shm: each server started here gets its own region prefix, so
exactly its regions — and its stubs — are removed when it stops, and those crashed servers left are cleaned.

Why apart from the server (serve/server.py): the regions outlive the processes that made them, so `serve.stop` and
a fresh start clean them without a Server object.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PYTHON_BACKEND_SHM = "triton_python_backend_shm_region"  # the python backend's default region prefix
OUR_SHM = "zoo_triton_"  # prefix of the regions of servers started here (+ a random id per server)


def _mapped_shm() -> set[str]:
    """/dev/shm files mapped by any process we can inspect (in use: never remove those)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                if "/dev/shm/" in line:
                    mapped.add(line.split("/dev/shm/", 1)[1].split(" (deleted)")[0].strip())
    return mapped


def kill_stubs(prefix: str) -> list[int]:
    """SIGKILL the Python-backend stubs of a server's shm `prefix` (their region argument starts with it): a
    stub whose tritonserver died usually exits by itself, but one was seen running 40 minutes after its server
    was gone, holding 135 MB and its shm region. Returns the pids killed."""
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (
                argv
                and argv[0].endswith(b"triton_python_backend_stub")
                and any(a.startswith(prefix.encode()) for a in argv[1:])
            ):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def remove_unmapped_shm(prefix: str) -> list[str]:
    """Remove this prefix's regions that no process maps (a dead server's; its stubs may still hold some)."""
    mapped = _mapped_shm()
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        if path.name not in mapped:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
    return removed


def remove_shm(prefix: str) -> list[str]:
    """Remove this server's regions (it has exited, so nothing maps them any more)."""
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed


def clean_stale_shm(min_age_s: float = 30.0) -> list[str]:
    """Remove Python-backend regions left by crashed servers: ours (uid), unmapped, older than `min_age_s`."""
    mapped = _mapped_shm()
    removed = []
    now = time.time()
    for pattern in (f"{PYTHON_BACKEND_SHM}*", f"{OUR_SHM}*"):
        for path in SHM_DIR.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                if st.st_uid == os.getuid() and path.name not in mapped and now - st.st_mtime > min_age_s:
                    path.unlink()
                    removed.append(path.name)
    return removed
