"""`ExportedModel`: an export directory's tokenizer, search and stores around a backend that runs its two graphs.

Texts in, texts out as zoo.decoding.evaluation does it (same truncation, same batches, the search of `search_loop.py`),
plus
n-best lists with scores and teacher-forced scoring. Where the graphs run is the backend's business (`backend.py`):
in-process onnxruntime sessions (`loading.load`), or other Triton models (serve/triton/bls_model.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from . import generation
from .backend import Backend
from .device_state import DeviceState
from .errors import ExportedModelError
from .manifest import ALIGNMENT_OUTPUT, NEXT_PREFIX, Manifest
from .manifest_checks import open_regular
from .replicas import Replicas
from .search import (
    DEFAULT_MAX_SENTENCES,
    DEFAULT_MAX_TOKENS,
    Scored,
    Search,
    SearchError,
    Translation,
    max_lengths,
    normalised,
)
from .search_loop import SearchVocab
from .shortlist import Shortlist
from .stepper import HostState, Stepper, cross_rows
from .stores import StorePool
from .tokenizer import SentencePieceTokenizer, SharedVocabTokenizer, load_tokenizer

T = TypeVar("T")
# The most bytes one encoder call's attention scores [rows, heads, S, S] float32 may take: a batch of long sources is
# encoded a few rows at a time (`encoder_rows`). Why: onnxruntime's arena keeps a call's largest transients, about
# five score-sized tensors at once (scores, mask, softmax), so encoding 32 sources of 256 tokens in one call raised
# the peak RSS by 336 MB for a 67 MB score tensor. The encoder runs once per batch, and a few rows of a long source
# still make large matmuls. Measured: results/runtime/fast_defaults.md
ENCODER_SCORE_BYTES = 8 << 20


class ExportedModel:
    """An export directory (its manifest read by `read_manifest`) with its tokenizer (tokenizer.py), searching over the
    graphs that `backend` runs. `load` builds one with onnxruntime sessions."""

    def __init__(self, directory: str | os.PathLike[str], manifest: Manifest, backend: Backend) -> None:
        self.directory = Path(directory)
        self.manifest = m = manifest
        self.backend = backend
        vocab = m["vocab"]
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            vocab[k] for k in ("pad_id", "unk_id", "bos_id", "eos_id")
        )
        self.vocab_size: int = vocab["size"]
        self.max_positions: int = m["max_positions"]
        self.name: str = m["name"]
        self.self_specs = [c for c in m["caches"] if c["kind"] == "self"]
        self.self_names = [c["name"] for c in self.self_specs]
        self.next_names = [NEXT_PREFIX + n for n in self.self_names]
        self.cross_names = [c["name"] for c in m["caches"] if c["kind"] == "cross"]
        kept = [len(h["kept"]) for name, h in m.get("heads", {}).items() if name.startswith("encoder.")]
        self.encoder_heads: int = max(kept, default=0) or int(m["model_config"].get("num_heads", 1))
        # the graph's cross caches are per source (batch axis "sources": exports since it was introduced) and the
        # backend feeds them so (the BLS decoder model's Triton config has one batch axis: a row per hypothesis)
        self.cross_per_source = (
            backend.per_source_cross
            and bool(self.cross_names)
            and all(c["shape"][0] == "sources" for c in m["caches"] if c["kind"] == "cross")
        )
        gen = m.get("generation", {})
        self.search = Search.from_generation(gen)
        self.max_tokens: int = gen.get("max_tokens", DEFAULT_MAX_TOKENS)
        self.max_sentences: int = gen.get("max_sentences", DEFAULT_MAX_SENTENCES)
        # a joint sentencepiece model or source and target models sharing one vocabulary (tokenizer.py)
        with open_regular(self.directory / m["tokenizer"]) as fh:  # a regular file, as read_manifest checked
            self.tokenizer: SentencePieceTokenizer | SharedVocabTokenizer = load_tokenizer(fh.read())
        self.vocab = SearchVocab(self.vocab_size, self.pad_id, self.bos_id, self.eos_id)
        self.store_pool = StorePool()  # self-attention store memory reused from search to search
        shortlist = m.get("shortlist")
        self.shortlist = (
            None if shortlist is None else Shortlist.load(self.directory / shortlist["file"], self.vocab_size)
        )
        self.replicas: Replicas[ExportedModel] = Replicas([self])  # throughput mode adds copies (`load`)
        required = {*self.self_names, "tokens", "step", "topk"} | ({"vocab_rows"} if self.shortlist else set())
        missing = sorted(required - backend.decoder_inputs)
        if missing:
            raise ExportedModelError(f"{m['graphs']['decoder']['file']} lacks inputs {missing}; re-export the model")

    # ------------------------------------------------------------------ building blocks
    def encode(self, src: np.ndarray, with_memory: bool = False) -> dict[str, np.ndarray]:
        """src [B, S] int64 (pad-right) → memory_pad_mask [B, S] and every cross cache (+ memory), each batch-first:
        encoded `encoder_rows` rows at a time into arrays of the whole batch (`ENCODER_SCORE_BYTES`)."""
        names = (["memory"] if with_memory else []) + ["memory_pad_mask", *self.cross_names]
        src = np.ascontiguousarray(src, dtype=np.int64)
        rows = encoder_rows(self.encoder_heads, src.shape[1])
        if rows >= len(src):
            return dict(zip(names, self.backend.encode(names, src), strict=True))
        whole: list[np.ndarray] = []
        for start in range(0, len(src), rows):
            part = self.backend.encode(names, src[start : start + rows])
            if not whole:
                whole = [np.empty((len(src), *p.shape[1:]), dtype=p.dtype) for p in part]
            for array, p in zip(whole, part, strict=True):
                array[start : start + len(p)] = p
        return dict(zip(names, whole, strict=True))

    def stepper(
        self,
        encoded: dict[str, np.ndarray],
        rows: np.ndarray | None = None,
        full: bool = False,
        steps: int = 0,
        slots: int = 0,
        vocab_rows: np.ndarray | None = None,
        alignments: bool = False,
    ) -> Stepper:
        """A decoding state over source rows `rows` (default: every row once); `full` also fetches
        the [N, V] logits and log-probs of every step (verification); `steps`: the most steps expected and
        `slots` the most rows a step will have (the self-attention store is sized for them and grows if a caller
        goes beyond); `vocab_rows`: the sorted token ids [C] of a shortlist to decode over (`candidates`);
        `alignments`: every step also fetches the `alignment` output into the stepper's `attention` [N, S]
        (SearchError if the export has none: `check_alignments`)."""
        rows = np.arange(len(encoded["memory_pad_mask"])) if rows is None else rows
        rows = np.asarray(rows, dtype=np.int64)
        sources = cross_rows(rows, self.cross_per_source)
        state = HostState(self, encoded, sources, len(rows), steps, slots)
        return Stepper(self, state, rows, sources, full, vocab_rows, alignments)

    def decoding(
        self,
        src: np.ndarray,
        rows: np.ndarray | None = None,
        steps: int = 0,
        slots: int = 0,
        vocab_rows: np.ndarray | None = None,
        alignments: bool = False,
    ) -> Stepper:
        """A search's decoding state over src [B, S] (`stepper`'s arguments): on the backend's device when it keeps
        the state there (backend.py `STATES`: device_state.py), else host-owned after encoding on the host."""
        if getattr(self.backend, "device", None) is None:
            return self.stepper(self.encode(src), rows, False, steps, slots, vocab_rows, alignments)
        rows = np.arange(src.shape[0], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        sources = cross_rows(rows, self.cross_per_source)
        state = DeviceState(self, src, sources, len(rows), steps, slots)
        return Stepper(self, state, rows, sources, False, vocab_rows, alignments)

    def check_alignments(self) -> None:
        """SearchError (one line) unless the decoder graph returns alignments (export/graph.py's `alignment`): not
        for a mechanism without cross-attention weights (the manifest says why), nor an export made before them."""
        info = self.manifest.get("alignment")
        if info is not None and info["output"] is None:
            raise SearchError(
                f"return_alignments: {self.name} has no cross-attention weights to align with: {info['reason']}"
            )
        if info is None or ALIGNMENT_OUTPUT not in self.manifest["graphs"]["decoder"].get("outputs", []):
            raise SearchError(
                f"return_alignments: {self.name} was exported without the decoder's alignment output (an export "
                "older than alignments); re-export it with `python -m export checkpoint=<its checkpoint>`"
            )

    @property
    def alignment_layer(self) -> int | None:
        """The decoder layer whose cross-attention the alignments are (None: the export has none)."""
        info = self.manifest.get("alignment")
        return None if info is None else info["layer"]

    def candidates(self, src: np.ndarray, search: Search) -> np.ndarray | None:
        """The token ids [C] a batch src [B, S] decodes over when `search.shortlist` is on (None: all of them);
        SearchError when the export has no shortlist or its decoder graph cannot take one."""
        if not self._shortlisted(search):
            return None
        assert self.shortlist is not None
        return self.shortlist.candidates(src, required=(self.eos_id,))

    def _shortlisted(self, search: Search) -> bool:
        """Whether `search` decodes over the shortlist; SearchError if it asks for one this export lacks."""
        if search.shortlist and self.shortlist is None:
            raise SearchError(
                f"shortlist=1, but {self.name} was exported without a vocabulary shortlist; re-export it with "
                "`python -m export … shortlist.build=true`, or search with shortlist=0"
            )
        return bool(search.shortlist)

    # ------------------------------------------------------------------ the driver's engine (generation.py)
    def open(self, src: np.ndarray, search: Search) -> _Batch:
        """src [B, S] encoded, on this model, for `search` (its shortlist and alignments)."""
        return _Batch(self, src, self.candidates(src, search), search.return_alignments)

    def map(self, run: Callable[[ExportedModel, list[int]], T], batches: list[list[int]]) -> Iterable[T]:
        """Each batch run on this model or, in throughput mode, on one of its copies (replicas.py)."""
        return self.replicas.map(run, batches)

    # ------------------------------------------------------------------ text in, text out
    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, truncated to half the position limit (as zoo's)."""
        return generation.encode_texts(self, texts)

    def search_settings(self, search: Search | None = None, **overrides: Any) -> Search:
        """`search` (default: the manifest's) with the given (non-None) options, validated once (SearchError; also
        for shortlist=1 on an export without a shortlist, or alignments on an export without them)."""
        search = replace(search or self.search, **{k: v for k, v in overrides.items() if v is not None})
        self._shortlisted(search)
        if search.return_alignments:
            self.check_alignments()
        return search

    def request_cost(self, lengths: Sequence[int], search: Search) -> int:
        """rows × beam × maximum output tokens of a batch of sources with these token lengths: the bound on
        decoder row-steps a server charges a request against its budget, before running anything. With sampling
        each source runs num_hypotheses rows (one per sample) in place of its beams."""
        if not lengths:
            return 0
        limits = max_lengths(np.asarray(lengths, dtype=np.int64), search, self.max_positions)
        return int(limits.sum()) * (search.num_hypotheses if search.sampling else search.beam_size)

    def translate(
        self,
        texts: str | Sequence[str],
        search: Search | None = None,
        target_prefix: str | Sequence[str] | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        **overrides: Any,
    ) -> list[str] | list[list[Translation]]:
        """Source strings → output strings in input order. `search`: every decoding option as one value (default:
        the manifest's); `overrides`: any of its fields by name (None: unset), e.g. `beam_size=4` — a setting
        outside SEARCH_LIMITS raises SearchError naming the allowed range, before anything runs.

        With `num_hypotheses` (an integer 1 … beam_size), `return_scores` or `return_alignments`, per source a
        list of `Translation(text, score, tokens, alignment)` instead: the num_hypotheses best hypotheses, best
        first, scored as the search ranks them; the first text is always what the plain call returns.
        `shortlist=1` decodes over the export's vocabulary shortlist (shortlist.py), 0 over the whole vocabulary.
        `target_prefix`: per source a target text its output starts with (tokenised as targets are: it ends at a
        piece boundary; "" = none; the output text includes it). `no_repeat_ngram_size`, `repetition_penalty`,
        and `sampling=1` with `top_k`, `top_p`, `temperature`, `seed` (num_hypotheses then draws that many
        samples): processing.py. An alignment gives, per output token, the source piece (index into
        `encode_texts`' ids of the source) it attended to most — pieces, not words: `export.runtime.alignment` maps
        them to words. `max_tokens`/`max_sentences`: the decoding batches (default: the manifest's)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        search = self.search_settings(search, **overrides)
        nbest = generation.translate(self, texts, search, target_prefix, max_tokens, max_sentences)
        return generation.shaped(nbest, generation.asks_for_lists(search, overrides))

    # ------------------------------------------------------------------ forced decoding
    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per target text to score, truncated to what the search can produce (as zoo's)."""
        return generation.encode_targets(self, texts)

    def score_cost(self, targets: Sequence[Sequence[int]]) -> int:
        """Decoder row-steps of scoring these targets (tokens + eos each): `request_cost`'s unit, for budgets."""
        return sum(len(t) + 1 for t in targets)

    def teacher_forced(self, src: np.ndarray, targets: list[list[int]], len_penalty: float) -> list[Scored]:
        """The driver's `Engine.teacher_forced` over this export's own decoder graph: bos + target fed one step at
        a time, each next token's log-prob read from the full `log_probs` output; rows leave once eos is scored."""
        b = src.shape[0]
        lengths = np.array([len(t) + 1 for t in targets])  # [B] scored positions: tokens + eos
        width = int(lengths.max())
        feed = np.full((b, width), self.pad_id, dtype=np.int64)  # [B, T] bos + target
        want = np.full((b, width), self.pad_id, dtype=np.int64)  # [B, T] target + eos
        for row, ids in enumerate(targets):
            feed[row, : lengths[row]] = [self.bos_id, *ids]
            want[row, : lengths[row]] = [*ids, self.eos_id]
        lp = np.zeros((b, width), dtype=np.float32)  # [B, T]
        step = self.decoding(src, steps=width)
        live = np.arange(b)  # rows of the batch still being scored, in stepper order
        for t in range(width):
            dist = step.distribution(feed[live, t], t)  # [n, V]
            lp[live, t] = dist[np.arange(live.size), want[live, t]]
            keep = np.nonzero(lengths[live] > t + 1)[0]
            if keep.size == 0:
                break
            if keep.size < live.size:
                step.select(keep)
                live = live[keep]
        out = []
        for row, n in enumerate(lengths.tolist()):
            total = float(np.sum(lp[row, :n], dtype=np.float32))
            out.append(Scored(want[row, :n].tolist(), lp[row, :n].tolist(), normalised(total, n, len_penalty)))
        return out

    def score(
        self,
        sources: str | Sequence[str],
        targets: str | Sequence[str],
        len_penalty: float | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[Scored]:
        """Forced decoding of text pairs: per (source, target) the target's `Scored(tokens, token_logprobs,
        score)` — generation.py's `score_texts` (`len_penalty`: default the manifest's); equal to zoo's to 1e-4."""
        penalty = self.search.len_penalty if len_penalty is None else len_penalty
        return generation.score_texts(self, sources, targets, penalty, max_tokens, max_sentences)


class _Batch:
    """A batch of sources for one search on an `ExportedModel` (generation.py's `Batch`): its shortlist's
    candidates once, a decoding state per `step` call."""

    def __init__(self, model: ExportedModel, src: np.ndarray, vocab_rows: np.ndarray | None, alignments: bool) -> None:
        self.model, self.src, self.vocab_rows, self.alignments = model, src, vocab_rows, alignments
        self.width = model.vocab_size if vocab_rows is None else len(vocab_rows)

    def step(self, rows: np.ndarray, steps: int, slots: int) -> Stepper:
        return self.model.decoding(self.src, rows, steps, slots, self.vocab_rows, self.alignments)


def encoder_rows(heads: int, length: int) -> int:
    """Sources per encoder call: as many as keep one attention-score tensor [rows, heads, length, length] float32
    within `ENCODER_SCORE_BYTES`, at least one."""
    return max(1, ENCODER_SCORE_BYTES // (4 * max(heads, 1) * max(length, 1) ** 2))
