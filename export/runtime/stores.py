"""Host memory of a search: the self-attention store (`SelfCache`) and its pool, the pages under it, and the
onnxruntime CPU arena the sessions share.

Why the host owns the self-attention state: the decoder graph returns only each step's new position, which the host
writes once into its cell and never moves; beam reordering reorders each hypothesis' list of cells (`history`,
[rows, steps] ints), and the graph gathers every row's past from the store itself — so the cache is held once and
copied once per step (the gather), where returning it grown and reordering it would hold it twice and copy it
twice (export/graph.py has the graph's side). Per step the host touches only small arrays.
Measured: results/runtime/docstring_figures.md.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort


def release_free_heap() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim): glibc keeps the pages of a parsed graph file after
    a session is loaded, and every later peak would sit on top of them. A no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_SHARED_ARENA_TRIED = False  # whether use_shared_cpu_arena registered the arena in this process


def use_shared_cpu_arena(options: ort.SessionOptions) -> None:
    """Let a session allocate from the CPU arena this process' onnxruntime environment shares between sessions
    (registered by the first session this runtime makes).

    Why: per step onnxruntime allocates only the step's transients (the growing state is the host's); from glibc's
    heap they left holes that later, larger ones grew around, so peak RSS changed from run to run. The arena
    reuses its blocks, and one arena for both graphs reuses the encoder's for the decoder's.
    Measured: results/runtime/docstring_figures.md."""
    global _SHARED_ARENA_TRIED
    if not _SHARED_ARENA_TRIED:
        _SHARED_ARENA_TRIED = True
        import onnxruntime as ort  # here, not at the top: zoo imports the runtime and must not load onnxruntime

        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        try:  # arguments: no memory limit, grow by powers of two (default), default first chunk and dead bytes
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 0, -1, -1))
        except RuntimeError:  # an onnxruntime that refuses it: each session keeps an arena of its own
            pass
    options.add_session_config_entry("session.use_env_allocators", "1")


def mapped_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero array in an anonymous memory mapping of its own, with transparent huge pages asked for.

    For the self-attention store, a beam search's largest buffer, which every step extends by a position and
    gathers from at random cells: with huge pages a step faults in a few pages instead of hundreds, and a freed
    mapping goes back to the system at once (a malloc'ed store stayed in the heap). Where huge pages are not
    available (madvise unsupported, THP off) the mapping has ordinary pages.
    Measured: results/runtime/docstring_figures.md."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    # private and anonymous: zero-filled, resident only once touched (a shared mapping would be shmem, no THP)
    buffer = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buffer.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


class StorePool:
    """Memory for self-attention stores, kept by a model between its searches and handed out again.

    Why: fresh memory is paid for page by page as a search first writes it, which made a new store per search a
    measurable share of a beam search. A finished search's buffers come back here (`SelfCache` gives them back when
    it is freed) and the next search takes the smallest that is big enough. A search that needs more than any free
    buffer drops the smallest free one for each new buffer it makes, so the pool holds about what the latest
    searches used; like onnxruntime's arena, it keeps that between requests. Buffers are not cleared: a store cell
    is always written before any history refers to it. Measured: results/runtime/docstring_figures.md."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []  # flat uint8 buffers (mapped_zeros), each owned by nobody
        self._lock = threading.Lock()  # searches of one model may run in several threads

    def take(self, nbytes: int) -> np.ndarray:
        """A flat uint8 buffer of at least `nbytes` bytes, no longer in the pool."""
        with self._lock:
            by_size = sorted(range(len(self._free)), key=lambda i: self._free[i].nbytes)
            fit = next((i for i in by_size if self._free[i].nbytes >= nbytes), None)
            if fit is not None:
                return self._free.pop(fit)
            if by_size:
                del self._free[by_size[0]]  # superseded: a search needs more than it holds
        return mapped_zeros((max(nbytes, 1),), np.uint8)

    def give(self, buffers: Sequence[np.ndarray | None]) -> None:
        """Buffers back into the pool (their arrays must no longer be used)."""
        with self._lock:
            self._free.extend(b for b in buffers if b is not None)

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._free)


class CacheLayout(NamedTuple):
    """The self-attention state's tensors as both state owners (`SelfCache`, device_state.DeviceCache) store them."""

    names: list[str]
    dtypes: list[np.dtype]
    axes: list[int | None]  # per tensor its position axis ("steps"); None: a running sum
    cells: list[tuple[int, ...]]  # per tensor a store cell's split (a, b), or a running sum's row shape
    shapes: list[list[int | str]]  # per tensor the manifest's shape (names for the dynamic axes)


def cache_layout(specs: Sequence[dict[str, Any]]) -> CacheLayout:
    """The manifest's self-cache specs → their `CacheLayout`: a cache [batch, a..., steps, b...] is stored as cells
    of a rows of b values; one without a position axis is a running sum [batch, ...]."""
    axes: list[int | None] = []
    cells: list[tuple[int, ...]] = []
    for spec in specs:
        shape = spec["shape"]
        axis = shape.index("steps") if "steps" in shape else None
        axes.append(axis)
        if axis is None:
            cells.append(tuple(int(s) for s in shape[1:]))
        else:
            cells.append((math.prod(int(s) for s in shape[1:axis]), math.prod(int(s) for s in shape[axis + 1 :])))
    names = [spec["name"] for spec in specs]
    return CacheLayout(
        names, [np.dtype(spec["dtype"]) for spec in specs], axes, cells, [spec["shape"] for spec in specs]
    )


class SelfCache:
    """The decoder's self-attention state between steps, owned by the host (export/graph.py has the why).

    A growing cache (one with a position axis, [rows, a..., steps, b...]) is a store [cells·a, b]: position j
    of the hypothesis in row s at step j is cell j·W + s (its a store rows from a·(j·W + s) on), written once by
    `update` and never moved (W slots per position: the most rows a step has had). `history` [rows, steps]
    lists each row's cells; `select(rows)` — beam reordering, finished sentences leaving — picks rows of it,
    not of the store. Running sums (no position axis, MLK) are replaced by every step's output and reordered on
    the host. `feeds()` is what the next step reads: contiguous arrays (the stores' filled prefixes are views),
    so onnxruntime takes them without a copy.
    """

    def __init__(
        self,
        specs: Sequence[dict[str, Any]],
        rows: int,
        steps: int = 0,
        slots: int = 0,
        pool: StorePool | None = None,
    ) -> None:
        self.pool = pool if pool is not None else StorePool()
        self.buffers: list[np.ndarray | None] = [None] * len(specs)  # the pool's buffer under each store
        weakref.finalize(self, self.pool.give, self.buffers)  # back to the pool when this cache is freed
        self.names, self.dtypes, self.axes, self.cells, _ = cache_layout(specs)
        self.width = max(rows, slots, 1)  # W: slots per position (`slots`: the most rows a step will have)
        self.capacity = max(steps, 1)  # positions the stores hold before they grow
        self.stores: list[np.ndarray | None] = [
            self._store(i, (self.capacity * self.width * cell[0], cell[1])) if axis is not None else None
            for i, (axis, cell) in enumerate(zip(self.axes, self.cells, strict=True))
        ]
        self.sums = [
            np.zeros((rows, *cell), dtype) if axis is None else None
            for axis, cell, dtype in zip(self.axes, self.cells, self.dtypes, strict=True)
        ]
        self.history = np.zeros((rows, 0), dtype=np.int64)  # [rows, steps] each row's cell per position
        self.order = np.arange(rows, dtype=np.int64)  # running sums: rows of the last step to continue, in order

    @property
    def steps(self) -> int:
        return self.history.shape[1]

    def feeds(self) -> dict[str, np.ndarray]:
        """The state the next step reads, by graph input name (plus `history`)."""
        for i, value in enumerate(self.sums):
            if value is None or (len(value) == len(self.order) and (self.order == np.arange(len(value))).all()):
                continue  # no running sums, or the same rows in the same order
            self.sums[i] = np.take(value, self.order, axis=0)
        self.order = np.arange(len(self.order), dtype=np.int64)
        filled = self.steps * self.width
        out = {"history": self.history}
        for name, store, value, cell in zip(self.names, self.stores, self.sums, self.cells, strict=True):
            out[name] = store[: filled * cell[0]] if store is not None else value
        return out

    def update(self, added: Sequence[np.ndarray]) -> None:
        """Take a step's `next.*` outputs (in `names` order) for the rows the step ran on: growing caches' new
        position [rows, a..., 1, b...] into their cells, running sums [rows, ...] as they are."""
        rows, t = len(self.history), self.steps
        if rows > self.width:
            self._widen(rows)
        if t >= self.capacity:
            self._grow(max(2 * self.capacity, t + 1))
        first = t * self.width
        for i, value in enumerate(added):
            store = self.stores[i]
            if store is None:
                self.sums[i] = value
            else:
                a, b = self.cells[i]
                store[first * a : (first + rows) * a] = value.reshape(rows * a, b)
        cells = np.arange(first, first + rows, dtype=np.int64)[:, None]
        self.history = np.concatenate([self.history, cells], axis=1)
        self.order = np.arange(rows, dtype=np.int64)

    def select(self, rows: np.ndarray) -> None:
        """Continue from rows `rows` (of the last step's rows) at the next step."""
        self.history = self.history[rows]  # a fresh contiguous array
        self.order = self.order[rows]

    def _grow(self, capacity: int) -> None:
        """Room for `capacity` positions (the stores keep their filled cells)."""
        for i, store in enumerate(self.stores):
            if store is not None:
                old = self.buffers[i]
                grown = self._store(i, (capacity * self.width * self.cells[i][0], store.shape[1]))
                grown[: len(store)] = store
                self.stores[i] = grown
                self.pool.give([old])
        self.capacity = capacity

    def _widen(self, width: int) -> None:
        """`width` slots per position: a step has more rows than any before it (cells renumbered)."""
        for i, store in enumerate(self.stores):
            if store is not None:
                a, b = self.cells[i]
                old = self.buffers[i]
                wide = self._store(i, (self.capacity, width, a * b))
                wide[:, : self.width] = store.reshape(self.capacity, self.width, a * b)
                self.stores[i] = wide.reshape(self.capacity * width * a, b)
                self.pool.give([old])
        self.history = self.history // self.width * width + self.history % self.width
        self.width = width

    def _store(self, i: int, shape: tuple[int, ...]) -> np.ndarray:
        """An uncleared array of `shape` for store i, on a buffer from the pool (recorded to give back)."""
        dtype = self.dtypes[i]
        nbytes = math.prod(shape) * dtype.itemsize
        self.buffers[i] = buffer = self.pool.take(nbytes)
        return buffer[:nbytes].view(dtype).reshape(shape)
