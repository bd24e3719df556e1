"""`BoundStepper`: the search loop's `Step` over the exported decoder graph with the whole decoding state on the
execution device (device_state.py says why), run through onnxruntime's I/O binding.

The same contract as stepper.py's `Stepper` — the k best tokens per row, or the whole distribution for the options of
processing.py, beam reordering and sentences leaving — so the search loop cannot tell them apart; tests hold their
hypotheses, scores and n-best lists equal. What crosses to the host per step: the last tokens, `step`, `topk`, the
shortlist's ids and the cell lists in; the outputs the search reads (and `alignment` when asked) out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .device_state import Bound, DeviceCache
from .manifest import ALIGNMENT_OUTPUT
from .stepper import EVERY_TOKEN, cross_rows

if TYPE_CHECKING:
    from .backend import OrtBackend
    from .model import ExportedModel


class BoundStepper:
    """A decoding state over the live rows whose encoder outputs, cross-attention inputs and self-attention stores
    stay on the device of `model`'s backend (an `OrtBackend` made with state="device")."""

    def __init__(
        self,
        model: ExportedModel,
        src: np.ndarray,
        rows: np.ndarray | None = None,
        full: bool = False,
        steps: int = 0,
        slots: int = 0,
        vocab_rows: np.ndarray | None = None,
        alignments: bool = False,
    ) -> None:
        self.m = model
        backend: OrtBackend = model.backend  # type: ignore[assignment]
        assert backend.device is not None, "BoundStepper needs a backend with state='device'"
        self.backend, self.device = backend, backend.device
        names = ["memory_pad_mask", *model.cross_names]
        encoded = dict(zip(names, backend.encode_bound(names, np.ascontiguousarray(src, dtype=np.int64)), strict=True))
        rows = np.arange(src.shape[0], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        self.sentence = rows  # [N] source row of every decoder row
        self.cross_sources = cross_rows(rows, model.cross_per_source)  # [sources or N] source of every cross row
        whole = np.array_equal(self.cross_sources, np.arange(src.shape[0]))  # a fresh batch: the encoder's own
        self.cross = {n: v if whole else self.device.gather(v, self.cross_sources) for n, v in encoded.items()}
        self.cache = DeviceCache(model.self_specs, len(rows), self.device, steps, slots)
        self.binding = backend.decoder.io_binding()
        self.fetch_full = full  # not `self.full`: that is the method the options of processing.py step with
        self.logits: np.ndarray | None = None  # [N, V] (or [N, C] over a shortlist) of the last step when `full`
        self.log_probs: np.ndarray | None = None
        self.vocab_rows = vocab_rows  # a shortlist's sorted token ids [C] (the graph returns positions in it)
        self.width = model.vocab_size if vocab_rows is None else len(vocab_rows)  # tokens a step scores
        if alignments:
            model.check_alignments()
        self.alignments = alignments
        self.attention: np.ndarray | None = None  # [N, S] f32 of the last run, rows in the current order

    def __call__(self, last: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """last [N] int64 tokens at position t → the k best (log-prob [N, k] f32, token [N, k] int64) of every
        row, descending (writable arrays)."""
        names = (["logits", "log_probs"] if self.fetch_full else []) + ["top_log_probs", "top_tokens"]
        out = self._run(last, t, k, names)
        if self.fetch_full:
            self.logits, self.log_probs = out[0], out[1]
            out = out[2:]
        if self.vocab_rows is not None:
            return out[0], self.vocab_rows[out[1]]  # positions in the shortlist → token ids
        return out[0], out[1]

    def full(self, last: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """last [N] int64 tokens at position t → every row's (logits [N, W], log-probs [N, W]) and the token id of
        each column (the shortlist's ids; None over the whole vocabulary)."""
        logits, log_probs = self._run(last, t, 1, ["logits", "log_probs"])
        return logits, log_probs, self.vocab_rows

    def distribution(self, last: np.ndarray, t: int) -> np.ndarray:
        """last [N] int64 tokens at position t → every row's full next-token log-probs [N, V] f32 (scoring)."""
        return self._run(last, t, 1, ["log_probs"])[0]

    def select(self, rows: np.ndarray) -> None:
        """Continue from rows `rows` of the last step (beam reordering / finished sentences leaving): the cell
        lists on the host, the cross-attention inputs gathered on the device when the set of sources changes."""
        rows = np.asarray(rows, dtype=np.int64)
        self.sentence = self.sentence[rows]
        sources = cross_rows(self.sentence, self.m.cross_per_source)
        if sources.shape != self.cross_sources.shape or not np.array_equal(sources, self.cross_sources):
            position = {int(s): i for i, s in enumerate(self.cross_sources)}  # every kept source has a row now
            keep = np.array([position[int(s)] for s in sources], dtype=np.int64)
            self.cross = {name: self.device.gather(value, keep) for name, value in self.cross.items()}
            self.cross_sources = sources
        self.cache.select(rows)

    def _run(self, last: np.ndarray, t: int, k: int, names: list[str]) -> list[np.ndarray]:
        """One decoder step fetching outputs `names` to the host (with `alignments` also `alignment` into
        `attention`); its new positions are written into the device stores by the graph itself."""
        binding, used, rows = self.binding, self.backend.decoder_inputs, len(last)
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        host = {
            "tokens": np.ascontiguousarray(last, dtype=np.int64).reshape(-1, 1),
            "step": np.array([t], dtype=np.int64),
            "topk": np.array([min(k, self.width)], dtype=np.int64),
            "vocab_rows": EVERY_TOKEN if self.vocab_rows is None else self.vocab_rows,
        }
        for name, value in host.items():
            if name in used:
                binding.bind_cpu_input(name, value)
        for name, bound in self.cross.items():
            if name in used:
                self.device.bind_input(binding, name, bound)
        fetched = [*names, *([ALIGNMENT_OUTPUT] if self.alignments else [])]
        for name in fetched:
            binding.bind_output(name, "cpu")
        self.cache.bind(binding, rows, used, self.m.next_names)
        self.backend.run_bound(binding)
        outputs = binding.get_outputs()
        host_out = [value.numpy() for value in outputs[: len(fetched)]]
        sums = [Bound.of(outputs[len(fetched) + i]) for i, store in enumerate(self.cache.stores) if store is None]
        self.cache.take_step(sums, rows)
        if self.alignments:  # [sources, G, S] → [N, S]: the graph's G rows per source are consecutive rows
            self.attention = host_out[len(names)].reshape(-1, host_out[len(names)].shape[-1])
        return host_out[: len(names)]
