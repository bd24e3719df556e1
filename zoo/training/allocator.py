"""How freed CPU tensors' memory is kept: glibc's malloc gives every block above its mmap threshold (≤ 32 MB) its
own mmap and returns it to the system when freed, so a training update that allocates and frees the same large
tensors every time — the [tokens, vocabulary] logits and their gradients, 64 MB at 2k tokens × 8k pieces — pays a
page fault per 4 kB page of each of them again on every update. `retain` keeps freed memory in the heap for the
next update (the process keeps its high-water mark, which every update reaches anyway); `system` is glibc's own
behaviour. Only glibc's malloc is tuned (mallopt); elsewhere this is a no-op (CPU_ALLOCATORS)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("zoo.training.allocator")

CPU_ALLOCATORS = ("retain", "system")

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: trim only when 2 GB at the heap's top are free
_GLIBC_DEFAULTS = {_M_MMAP_MAX: 65536, _M_MMAP_THRESHOLD: 128 * 1024, _M_TRIM_THRESHOLD: 128 * 1024}


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return None  # not glibc (musl, macOS): nothing to tune
    return libc


def tunable() -> bool:
    """Whether this process's malloc is glibc's, the one `set_cpu_allocator` tunes."""
    return _libc() is not None


def set_cpu_allocator(mode: str) -> bool:
    """Apply `mode` (CPU_ALLOCATORS) to this process's malloc; returns whether it could (glibc only). `system`
    after `retain` restores glibc's default thresholds (its dynamic mmap threshold then stays at the default)."""
    if mode not in CPU_ALLOCATORS:
        raise ValueError(f"cpu allocator {mode!r}: use one of {', '.join(CPU_ALLOCATORS)}")
    libc = _libc()
    if libc is None:
        return False
    settings = {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: _NEVER_TRIM} if mode == "retain" else _GLIBC_DEFAULTS
    return all(libc.mallopt(param, value) == 1 for param, value in settings.items())


@contextmanager
def cpu_allocator(mode: str) -> Iterator[None]:
    """`mode` while the block runs, glibc's defaults afterwards (an in-process caller such as a test goes on as
    before)."""
    applied = set_cpu_allocator(mode)
    if not applied and mode != "system":
        log.info("trainer.cpu_allocator=%s: not glibc's malloc here, left as it is", mode)
    try:
        yield
    finally:
        if applied and mode != "system":
            set_cpu_allocator("system")
