"""`Stepper`: one decoding state of an `ExportedModel` — the search loop's `Step` over the exported decoder graph.

It feeds the graph the last tokens, fetches only the outputs a search needs (the in-graph top k, or the whole
distribution for the options of processing.py), and follows beam reordering and sentences leaving. Where the state
between steps lives is its `DecodingState`'s business: `HostState` here (numpy cross inputs and the host-owned
`SelfCache`), or device_state.py's `DeviceState` (everything on the execution device, through I/O binding).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .errors import ExportRuntimeError
from .manifest import ALIGNMENT_OUTPUT, CacheEntry
from .stores import SelfCache, StorePool

EVERY_TOKEN = np.zeros(0, dtype=np.int64)  # vocab_rows of a step over the whole vocabulary (no shortlist)


def cross_rows(sentence: np.ndarray, per_source: bool) -> np.ndarray:
    """The source of every cross-cache row the decoder needs for decoder rows whose sources are `sentence` [N]:
    one row per decoder row, or with `per_source` one per source — the rows then come in equal consecutive
    groups of one source each, as every search makes them (a sentence's beams; one row per sentence)."""
    n = len(sentence)
    if not per_source or n == 0:
        return sentence
    changes = np.flatnonzero(sentence[1:] != sentence[:-1])
    group = int(changes[0]) + 1 if changes.size else n
    sources = sentence[::group]
    if n % group or not np.array_equal(sentence, np.repeat(sources, group)):
        raise ExportRuntimeError(f"decoder rows of sources {sentence.tolist()} are not equal groups of one source")
    return sources


class DecoderGraph(Protocol):
    """What a decoding state needs of a model (an `ExportedModel`): where its graphs run (a backend.py `Backend`),
    its caches and the decoder's outputs — not the whole model, so this module does not import it."""

    backend: Any
    cross_names: list[str]
    next_names: list[str]  # the decoder's outputs of each self cache's new position
    self_specs: list[CacheEntry]
    store_pool: StorePool
    cross_per_source: bool  # one cross-cache row per source sentence (else one per decoder row)
    vocab_size: int

    def check_alignments(self) -> None: ...


class DecodingState(Protocol):
    """What a `Stepper` keeps between decoder runs and how it runs one."""

    def run(self, host: dict[str, np.ndarray], fetch: list[str]) -> list[np.ndarray]:
        """One decoder run on `host` inputs (tokens, step, topk, vocab_rows) and the kept state: the outputs
        `fetch` as host arrays, in order; what the step adds to the self-attention state is kept."""
        ...

    def select(self, rows: np.ndarray, cross_keep: np.ndarray | None) -> None:
        """Continue from rows `rows` of the last run; `cross_keep`: the cross rows to keep, in order, when the set
        of sources changed (None: unchanged)."""
        ...


class HostState:
    """The state on the host: the cross-attention inputs as numpy arrays (re-sliced only when the set of sources
    changes) and the self-attention store in a host-owned `SelfCache` (stores.py says why)."""

    def __init__(
        self,
        model: DecoderGraph,
        encoded: dict[str, np.ndarray],
        sources: np.ndarray,
        rows: int,
        steps: int,
        slots: int,
    ) -> None:
        self.m = model
        # every source once, in order (beam search and greedy over a fresh batch): the encoder's own arrays. A copy
        # would hold the cross caches twice while it is made and leave that much freed but resident heap behind
        # for the rest of the search. Measured: results/runtime/docstring_figures.md
        whole = np.array_equal(sources, np.arange(len(encoded["memory_pad_mask"])))
        self.cross = {
            name: np.ascontiguousarray(encoded[name] if whole else encoded[name][sources])
            for name in [*model.cross_names, "memory_pad_mask"]
        }
        self.cache = SelfCache(model.self_specs, rows, steps, slots, model.store_pool)

    def run(self, host: dict[str, np.ndarray], fetch: list[str]) -> list[np.ndarray]:
        used = self.m.backend.decoder_inputs
        feeds = {n: v for n, v in {**host, **self.cross, **self.cache.feeds()}.items() if n in used}
        out = self.m.backend.decode([*fetch, *self.m.next_names], feeds)
        self.cache.update(out[len(fetch) :])
        return out[: len(fetch)]

    def select(self, rows: np.ndarray, cross_keep: np.ndarray | None) -> None:
        if cross_keep is not None:
            self.cross = {k: np.ascontiguousarray(v[cross_keep]) for k, v in self.cross.items()}
        self.cache.select(rows)


class Stepper:
    """A decoding state over the live rows: per-row best tokens from the backend's decoder, the state between
    steps in `state` (a `DecodingState`). Exports whose cross caches are per source (manifest shape "sources") get
    one cross row per sentence, shared by its beams."""

    def __init__(
        self,
        model: DecoderGraph,
        state: DecodingState,
        rows: np.ndarray,
        sources: np.ndarray,
        full: bool = False,
        vocab_rows: np.ndarray | None = None,
        alignments: bool = False,
    ) -> None:
        self.m = model
        self.state = state
        self.sentence = rows  # [N] source row of every decoder row
        self.cross_sources = sources  # [sources or N] source of every cross row (`cross_rows`)
        self.fetch_full = full  # not `self.full`: that is the method the options of processing.py step with
        self.logits: np.ndarray | None = None  # [N, V] (or [N, C] over a shortlist) of the last step when `full`
        self.log_probs: np.ndarray | None = None
        # a shortlist's sorted token ids [C]: the graph computes their logits alone and returns positions in it
        self.vocab_rows = vocab_rows
        self.width = model.vocab_size if vocab_rows is None else len(vocab_rows)  # tokens a step scores
        # alignments: every decoder run also fetches the `alignment` output (SearchError here where the export has
        # none); `attention` [N, S] f32 is the last run's, rows in the current order. Off: not fetched
        if alignments:
            model.check_alignments()
        self.alignments = alignments
        self.attention: np.ndarray | None = None

    def __call__(self, last: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """last [N] int64 tokens at position t → the k best (log-prob [N, k] f32, token [N, k] int64)
        of every row, descending (writable arrays)."""
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
        each column (the shortlist's ids; None over the whole vocabulary): the search's options that reshape a
        distribution (processing.py) need all of it; its top-k outputs are not fetched."""
        logits, log_probs = self._run(last, t, 1, ["logits", "log_probs"])
        return logits, log_probs, self.vocab_rows

    def distribution(self, last: np.ndarray, t: int) -> np.ndarray:
        """last [N] int64 tokens at position t → every row's full next-token log-probs [N, V] f32 (scoring:
        the graph's `log_probs` output; its top-k outputs are not fetched)."""
        return self._run(last, t, 1, ["log_probs"])[0]

    def _run(self, last: np.ndarray, t: int, k: int, names: list[str]) -> list[np.ndarray]:
        """One decoder step fetching outputs `names`; with `alignments` its `alignment` output to `attention`."""
        host = {
            "tokens": np.ascontiguousarray(last, dtype=np.int64).reshape(-1, 1),
            "step": np.array([t], dtype=np.int64),
            "topk": np.array([min(k, self.width)], dtype=np.int64),
            "vocab_rows": EVERY_TOKEN if self.vocab_rows is None else self.vocab_rows,
        }
        out = self.state.run(host, [*names, *([ALIGNMENT_OUTPUT] if self.alignments else [])])
        if self.alignments:  # [sources, G, S] → [N, S]: the graph's G rows per source are consecutive rows
            self.attention = out[len(names)].reshape(-1, out[len(names)].shape[-1])
        return out[: len(names)]

    def select(self, rows: np.ndarray) -> None:
        """Continue from rows `rows` of the last step (beam reordering / finished sentences leaving)."""
        rows = np.asarray(rows, dtype=np.int64)
        self.sentence = self.sentence[rows]
        sources = cross_rows(self.sentence, self.m.cross_per_source)
        keep = None
        if sources.shape != self.cross_sources.shape or not np.array_equal(sources, self.cross_sources):
            position = {int(s): i for i, s in enumerate(self.cross_sources)}  # every kept source has a row now
            keep = np.array([position[int(s)] for s in sources], dtype=np.int64)
            self.cross_sources = sources
        self.state.select(rows, keep)
