"""A decoding state that stays where the graphs run: `DeviceState` (stepper.py's `DecodingState` through I/O
binding) over `Device` (memory and row gathers on an execution provider's device) and `DeviceCache` (the
self-attention stores there).

Why: with provider=cuda the host-owned state (stores.py) crossed the bus twice per decoder step — every row's past
to the GPU and the new position back — so a GPU decoded at CPU speed. Here the stores are device buffers of the
layout `SelfCache` documents (cells j·W + s written once, `history` picking each row's), the decoder writes each
step's new positions straight into their cells through I/O binding (its `next.*` outputs are bound to the cells'
addresses), and choosing rows happens on the device (row_gather.py). Per step the host sends the last tokens and
the cell lists (`history`, 8 bytes per row and position) and reads back what the search decides with (the top-k
or the distribution). The same code runs on the CPU provider, where the device is host memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .row_gather import DATA, OUT, ROWS, gather_model
from .stepper import DecoderGraph
from .stores import cache_layout

if TYPE_CHECKING:
    import onnxruntime as ort

ORT_DEVICES = {"cpu": "cpu", "cuda": "cuda"}  # runtime provider → onnxruntime's device name for OrtValues/bindings


class Device:
    """An execution provider's device as the decoding state sees it: OrtValues allocated there and a row gather
    (`Gather(data, rows, axis=0)`, one session per element type, made on first use) run there."""

    def __init__(self, provider: str, device_id: int, options: ort.SessionOptions, providers: list[Any]) -> None:
        self.name = ORT_DEVICES[provider]
        self.id = int(device_id)
        self._options, self._providers = options, providers
        self._gathers: dict[np.dtype, ort.InferenceSession] = {}

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> ort.OrtValue:
        """An uninitialised OrtValue of `shape` on the device."""
        import onnxruntime as ort  # here, not at the top: zoo imports the runtime and must not load onnxruntime

        return ort.OrtValue.ortvalue_from_shape_and_type(
            [int(s) for s in shape], np.dtype(dtype).type, self.name, self.id
        )

    def bind_input(self, binding: ort.IOBinding, name: str, value: Bound) -> None:
        """Bind device tensor `value` as input `name`."""
        binding.bind_input(name, self.name, self.id, value.dtype.type, list(value.shape), value.ptr)

    def bind_into(self, binding: ort.IOBinding, name: str, value: Bound) -> None:
        """Bind output `name` to device memory `value` (the graph writes it there; its shape must be the output's)."""
        binding.bind_output(name, self.name, self.id, value.dtype.type, list(value.shape), value.ptr)

    def gather(self, data: Bound, rows: np.ndarray, into: Bound | None = None) -> Bound:
        """Rows `rows` [k] (int64, host) of device tensor `data` [n, ...] → [k, ...] on the device: a new tensor,
        or written into `into` (its shape [k, ...])."""
        session = self._gather(data.dtype)
        width = math.prod(data.shape[1:])
        binding = session.io_binding()
        binding.bind_input(DATA, self.name, self.id, data.dtype.type, [data.shape[0], width], data.ptr)
        binding.bind_cpu_input(ROWS, np.ascontiguousarray(rows, dtype=np.int64))
        shape = (len(rows), *data.shape[1:])
        if into is None:
            binding.bind_output(OUT, self.name, self.id)
        else:
            binding.bind_output(OUT, self.name, self.id, data.dtype.type, [len(rows), width], into.ptr)
        session.run_with_iobinding(binding)
        return into if into is not None else Bound.of(binding.get_outputs()[0], shape)

    def _gather(self, dtype: np.dtype) -> ort.InferenceSession:
        """The row gather's session for `dtype`, made once."""
        import onnxruntime as ort  # here, not at the top: see `empty`

        dtype = np.dtype(dtype)
        if dtype not in self._gathers:
            self._gathers[dtype] = ort.InferenceSession(gather_model(dtype), self._options, providers=self._providers)
        return self._gathers[dtype]


class Bound:
    """A tensor in device memory seen with a shape of our choosing: the OrtValue that owns the memory (kept alive
    here), a byte offset into it, dtype and shape. Bindings address it by pointer, so a store's filled prefix or one
    step's cells are views, not copies."""

    __slots__ = ("dtype", "offset", "owner", "shape")

    def __init__(self, owner: ort.OrtValue, dtype: np.dtype, shape: tuple[int, ...], offset: int = 0) -> None:
        self.owner, self.dtype, self.shape, self.offset = owner, np.dtype(dtype), tuple(shape), offset

    @classmethod
    def of(cls, value: ort.OrtValue, shape: Sequence[int] | None = None) -> Bound:
        """All of OrtValue `value`, as `shape` (default: its own)."""
        dtype = np.dtype(_NUMPY_OF_ORT[value.data_type()])
        return cls(value, dtype, tuple(value.shape()) if shape is None else tuple(shape))

    @property
    def ptr(self) -> int:
        return self.owner.data_ptr() + self.offset

    def view(self, first: int, shape: Sequence[int]) -> Bound:
        """Elements from `first` on (along the flat layout) as `shape`."""
        return Bound(self.owner, self.dtype, tuple(shape), self.offset + first * self.dtype.itemsize)


# OrtValue.data_type() strings → numpy dtypes
_NUMPY_OF_ORT = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(bool)": np.bool_,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(uint8)": np.uint8,
}


class DeviceCache:
    """`SelfCache`'s state (stores.py: cells j·W + s written once, `history` [rows, steps] each row's cells, running
    sums replaced each step) with the stores and sums on `device`. The stores are sized for `steps` positions of
    `slots` rows up front (a search knows both) and regrown on the device if a caller goes beyond."""

    def __init__(self, specs: Sequence[dict[str, Any]], rows: int, device: Device, steps: int = 0, slots: int = 0):
        self.device = device
        self.names, self.dtypes, self.axes, self.cells, self.shapes = cache_layout(specs)
        self.width = max(rows, slots, 1)  # W: slots per position
        self.capacity = max(steps, 1)  # positions the stores hold before they grow
        self.stores: list[Bound | None] = [
            self._store(i, self.capacity * self.width) if axis is not None else None for i, axis in enumerate(self.axes)
        ]
        self.sums: list[Bound | None] = [
            self._zeros(rows, cell, dtype) if axis is None else None
            for axis, cell, dtype in zip(self.axes, self.cells, self.dtypes, strict=True)
        ]
        self.history = np.zeros((rows, 0), dtype=np.int64)  # [rows, steps] each row's cell per position
        self.order = np.arange(rows, dtype=np.int64)  # running sums: rows of the last step to continue, in order

    @property
    def steps(self) -> int:
        return self.history.shape[1]

    def bind(self, binding: ort.IOBinding, rows: int, used: frozenset[str], next_names: Sequence[str]) -> None:
        """Bind a step over `rows` rows: room for its cells first (a regrow moves the stores), then what it reads
        (`used`: the graph's inputs) and where its `next.*` outputs go."""
        if rows > self.width:
            self._regrow(self.capacity, rows)
        if self.steps >= self.capacity:
            self._regrow(max(2 * self.capacity, self.steps + 1), self.width)
        self._bind_inputs(binding, used)
        self._bind_outputs(binding, rows, next_names)

    def _bind_inputs(self, binding: ort.IOBinding, used: frozenset[str]) -> None:
        """Bind what the next step reads: `history` (host) and every store's filled cells / running sum."""
        if "history" in used:
            binding.bind_cpu_input("history", self.history)
        self._reorder_sums()
        filled = self.steps * self.width
        for name, store, value, cell in zip(self.names, self.stores, self.sums, self.cells, strict=True):
            if store is not None:
                self.device.bind_input(binding, name, store.view(0, (filled * cell[0], cell[1])))
            else:
                assert value is not None
                self.device.bind_input(binding, name, value)

    def _bind_outputs(self, binding: ort.IOBinding, rows: int, next_names: Sequence[str]) -> None:
        """Bind the step's `next.*` outputs for `rows` rows: a growing cache's new position [rows, a..., 1, b...]
        straight into its cells, a running sum to fresh device memory (`take_step` keeps it)."""
        first = self.steps * self.width
        for i, name in enumerate(next_names):
            store, axis = self.stores[i], self.axes[i]
            if store is None:
                binding.bind_output(name, self.device.name, self.device.id)
                continue
            assert axis is not None
            a, b = self.cells[i]
            shape = self._position_shape(i, rows)
            self.device.bind_into(binding, name, store.view(first * a * b, shape))

    def take_step(self, sums: Sequence[Bound], rows: int) -> None:
        """After the step: its running sums (in `names` order, those without a position axis) and its cells."""
        found = iter(sums)
        for i, store in enumerate(self.stores):
            if store is None:
                self.sums[i] = next(found)
        first = self.steps * self.width
        cells = np.arange(first, first + rows, dtype=np.int64)[:, None]
        self.history = np.concatenate([self.history, cells], axis=1)
        self.order = np.arange(rows, dtype=np.int64)

    def select(self, rows: np.ndarray) -> None:
        """Continue from rows `rows` (of the last step's rows) at the next step."""
        self.history = self.history[rows]
        self.order = self.order[rows]

    def _reorder_sums(self) -> None:
        """Running sums in the order `select` asked for (one device gather each), before a step reads them."""
        if len(self.order) == 0 or all(s is None for s in self.sums):
            return
        identity = np.array_equal(self.order, np.arange(len(self.order)))
        for i, value in enumerate(self.sums):
            if value is not None and not (identity and value.shape[0] == len(self.order)):
                self.sums[i] = self.device.gather(value, self.order)
        self.order = np.arange(len(self.order), dtype=np.int64)

    def _position_shape(self, i: int, rows: int) -> tuple[int, ...]:
        """The shape of cache i's `next.*` output for `rows` rows: [rows, a..., 1, b...] (the spec's own axes)."""
        spec_shape = self.shapes[i]
        axis = self.axes[i]
        assert axis is not None
        return (rows, *spec_shape[1:axis], 1, *spec_shape[axis + 1 :])

    def _store(self, i: int, cells: int) -> Bound:
        """An uninitialised store of `cells` cells for cache i, as [cells·a, b]."""
        a, b = self.cells[i]
        return Bound.of(self.device.empty((cells * a, b), self.dtypes[i]))

    def _zeros(self, rows: int, cell: tuple[int, ...], dtype: np.dtype) -> Bound:
        """A zero running sum [rows, *cell] on the device (the state before the first step)."""
        import onnxruntime as ort  # here, not at the top: see Device.empty

        zeros = np.zeros((rows, *cell), dtype)
        return Bound.of(ort.OrtValue.ortvalue_from_numpy(zeros, self.device.name, self.device.id))

    def _regrow(self, capacity: int, width: int) -> None:
        """Stores of `capacity` positions × `width` slots, the filled cells gathered into their new places on the
        device (cell j·W + s becomes j·width + s)."""
        old_width = self.width
        positions = np.arange(capacity, dtype=np.int64)[:, None]
        slots = np.arange(width, dtype=np.int64)[None, :]
        # every new cell's old cell; new cells with no old one copy cell 0 (never read before written)
        source = np.where((positions < self.capacity) & (slots < old_width), positions * old_width + slots, 0)
        for i, store in enumerate(self.stores):
            if store is None:
                continue
            a, b = self.cells[i]
            grown = self._store(i, capacity * width)
            self.device.gather(
                store.view(0, (self.capacity * old_width, a * b)),
                source.reshape(-1),
                grown.view(0, (capacity * width, a * b)),
            )
            self.stores[i] = grown
        self.history = self.history // old_width * width + self.history % old_width
        self.capacity, self.width = capacity, width


class DeviceState:
    """stepper.py's `DecodingState` on `model`'s backend device (an `OrtBackend` made with state="device"): the
    encoder's outputs stay there as the cross-attention inputs (gathered there when sources leave), the
    self-attention stores are a `DeviceCache`, and each run binds host inputs, device tensors and the outputs the
    search reads (to the host) to one reused I/O binding."""

    def __init__(
        self, model: DecoderGraph, src: np.ndarray, sources: np.ndarray, rows: int, steps: int, slots: int
    ) -> None:
        self.m = model
        backend = model.backend  # backend.py's OrtBackend, made with state="device"
        assert backend.device is not None, "DeviceState needs a backend made with state='device'"
        self.backend, self.device = backend, backend.device
        names = ["memory_pad_mask", *model.cross_names]
        encoded = dict(zip(names, backend.encode_bound(names, np.ascontiguousarray(src, dtype=np.int64)), strict=True))
        whole = np.array_equal(sources, np.arange(src.shape[0]))  # a fresh batch: the encoder's own tensors
        self.cross = {n: v if whole else self.device.gather(v, sources) for n, v in encoded.items()}
        self.cache = DeviceCache(model.self_specs, rows, self.device, steps, slots)
        self.binding = backend.decoder.io_binding()

    def run(self, host: dict[str, np.ndarray], fetch: list[str]) -> list[np.ndarray]:
        """One decoder run: `host` inputs and `fetch` outputs cross; the new positions are written into the device
        stores by the graph itself."""
        binding, used, rows = self.binding, self.backend.decoder_inputs, len(host["tokens"])
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        for name, value in host.items():
            if name in used:
                binding.bind_cpu_input(name, value)
        for name, bound in self.cross.items():
            if name in used:
                self.device.bind_input(binding, name, bound)
        for name in fetch:
            binding.bind_output(name, "cpu")
        self.cache.bind(binding, rows, used, self.m.next_names)
        self.backend.run_bound(binding)
        outputs = binding.get_outputs()
        sums = [Bound.of(outputs[len(fetch) + i]) for i, store in enumerate(self.cache.stores) if store is None]
        self.cache.take_step(sums, rows)
        return [value.numpy() for value in outputs[: len(fetch)]]

    def select(self, rows: np.ndarray, cross_keep: np.ndarray | None) -> None:
        """The cell lists on the host; the cross-attention inputs gathered on the device when sources left."""
        if cross_keep is not None:
            self.cross = {name: self.device.gather(value, cross_keep) for name, value in self.cross.items()}
        self.cache.select(rows)
