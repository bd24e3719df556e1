"""`ExportedModel`: an export directory's tokenizer, search and stores around a backend that runs its two graphs.

Texts in, texts out as zoo.evaluation does it (same truncation, same batches, the search of `search_loop.py`), plus
n-best lists with scores and teacher-forced scoring. Where the graphs run is the backend's business (`backend.py`):
in-process onnxruntime sessions (`loading.load`), or other Triton models (serve/triton/bls_model.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .backend import Backend
from .device_state import DeviceState
from .errors import ExportedModelError
from .manifest import ALIGNMENT_OUTPUT, NEXT_PREFIX, Manifest
from .manifest_checks import open_regular
from .replicas import Replicas
from .scoring import teacher_forced
from .search import (
    DEFAULT_MAX_SENTENCES,
    DEFAULT_MAX_TOKENS,
    Hypothesis,
    RowLimits,
    Scored,
    Search,
    SearchError,
    Translation,
    check_num_hypotheses,
    check_pairs,
    check_targets,
    length_batches,
    max_lengths,
    normalised,
    row_limits,
    search_setting,
    truncate_sources,
    truncate_targets,
)
from .search_loop import (
    Given,
    SearchVocab,
    beam,
    beam_first_rows,
    check_prefixes,
    given_for,
    greedy,
    sample_rows,
    samples_by_sentence,
)
from .shortlist import Shortlist
from .stepper import HostState, Stepper, cross_rows
from .stores import StorePool
from .tokenizer import SentencePieceTokenizer, SharedVocabTokenizer, load_tokenizer


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
        self._vocab = SearchVocab(self.vocab_size, self.pad_id, self.bos_id, self.eos_id)
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
        """src [B, S] int64 (pad-right) → memory_pad_mask [B, S] and every cross cache (+ memory)."""
        names = (["memory"] if with_memory else []) + ["memory_pad_mask", *self.cross_names]
        out = self.backend.encode(names, np.ascontiguousarray(src, dtype=np.int64))
        return dict(zip(names, out, strict=True))

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
            raise SearchError(f"alignments: {self.name} has no cross-attention weights to align with: {info['reason']}")
        if info is None or ALIGNMENT_OUTPUT not in self.manifest["graphs"]["decoder"].get("outputs", []):
            raise SearchError(
                f"alignments: {self.name} was exported without the decoder's alignment output (an export older than "
                "alignments); re-export it with `python -m export checkpoint=<its checkpoint>`"
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

    # ------------------------------------------------------------------ search
    def greedy_search(
        self, src: np.ndarray, search: Search | None = None, limits: RowLimits | None = None
    ) -> list[list[int]]:
        """Argmax decoding of src [B, S]; token ids per sentence (no bos/eos)."""
        return [h.tokens for h in self._greedy(src, search or self.search, limits)]

    def _limits(self, src: np.ndarray, search: Search, limits: RowLimits | None) -> RowLimits:
        """Each sentence's length bounds: the given ones, else what `search` sets for src [B, S]."""
        if limits is None:
            return row_limits((src != self.pad_id).sum(1), search, self.max_positions)
        if len(limits.max_len) != src.shape[0]:
            raise SearchError(f"got length bounds for {len(limits.max_len)} sentences but {src.shape[0]} sources")
        return limits

    def _greedy(
        self,
        src: np.ndarray,
        search: Search,
        limits: RowLimits | None = None,
        given: Given | None = None,
        alignments: bool = False,
    ) -> list[Hypothesis]:
        """Argmax decoding (or sampling) of src [B, S]: one hypothesis per sentence, scored as beam search scores."""
        limits = self._limits(src, search, limits)
        step = self.decoding(
            src,
            steps=int(limits.max_len.max()),
            vocab_rows=self.candidates(src, search),
            alignments=alignments,
        )
        return greedy(step, limits, search, self._vocab, given)

    def beam_search(
        self, src: np.ndarray, search: Search | None = None, limits: RowLimits | None = None
    ) -> list[list[int]]:
        """Batched beam search of src [B, S]; best hypothesis per sentence."""
        return [hyps[0].tokens if hyps else [] for hyps in self._beam(src, search or self.search, limits)]

    def _beam(
        self,
        src: np.ndarray,
        search: Search,
        limits: RowLimits | None = None,
        given: Given | None = None,
        alignments: bool = False,
    ) -> list[list[Hypothesis]]:
        """Beam search of src [B, S]: every finished hypothesis per sentence, best first (search.beam)."""
        b = src.shape[0]
        limits = self._limits(src, search, limits)
        vocab_rows = self.candidates(src, search)
        width = self.vocab_size if vocab_rows is None else len(vocab_rows)  # tokens a step scores
        g = beam_first_rows(search.beam_size, width)  # rows per sentence of the first step
        rows = np.repeat(np.arange(b, dtype=np.int64), g)  # [B*g]
        step = self.decoding(
            src,
            rows,
            steps=int(limits.max_len.max()),
            slots=b * search.beam_size,
            vocab_rows=vocab_rows,
            alignments=alignments,
        )
        return beam(step, g, limits, search, self._vocab, given)

    def generate(
        self, src: np.ndarray, search: Search | None = None, limits: RowLimits | None = None
    ) -> list[list[int]]:
        """Greedy when beam_size <= 1, else beam search (the search zoo.generate runs too). `limits`: each sentence's
        length bounds (e.g. `forced_limits`) in place of the ones search's min_len/max_len_a/max_len_b set."""
        search = search or self.search
        if search.beam_size <= 1:
            return self.greedy_search(src, search, limits)
        return self.beam_search(src, search, limits)

    def generate_nbest(
        self,
        src: np.ndarray,
        search: Search | None = None,
        num_hypotheses: int = 1,
        limits: RowLimits | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
        alignments: bool = False,
    ) -> list[list[Hypothesis]]:
        """The `num_hypotheses` best hypotheses per source of src [B, S] with their scores, best first (greedy
        when beam_size <= 1: its one hypothesis; with sampling, that many draws), as zoo.generate.generate_nbest
        (the same loop). The first is always `generate`'s output; fewer than asked only when the search finished
        fewer (a length limit of 1 token leaves the empty hypothesis alone). `prefixes`: per source the token ids
        its output starts with (processing.py). SearchError for num_hypotheses outside 1 … most_hypotheses."""
        search = search or self.search
        n = check_num_hypotheses(num_hypotheses, search.most_hypotheses, bool(search.sampling))
        return self._nbest(src, search, n, limits, prefixes, alignments=alignments)

    def _nbest(
        self,
        src: np.ndarray,
        search: Search,
        n: int,
        limits: RowLimits | None,
        prefixes: Sequence[Sequence[int]] | None = None,
        keys: Sequence[int] | None = None,
        alignments: bool = False,
    ) -> list[list[Hypothesis]]:
        """`generate_nbest` with `n` already checked — once per call, where the value came in, not per batch.
        `prefixes`: each sentence's given first output tokens; `keys`: each sentence's sampling key (its index in
        the caller's call, so that its samples do not depend on the batch it fell in)."""
        limits = self._limits(src, search, limits)
        if prefixes is not None:
            check_prefixes(prefixes, limits, self._vocab)
        if search.sampling:
            rows, row_keys = sample_rows(src.shape[0], n, keys)
            given = given_for(len(rows), search, None if prefixes is None else [prefixes[i] for i in rows], row_keys)
            return samples_by_sentence(self._greedy(src[rows], search, limits.take(rows), given, alignments), n)
        given = given_for(src.shape[0], search, prefixes)
        if search.beam_size <= 1:
            return [[h] for h in self._greedy(src, search, limits, given, alignments)]
        return [hyps[:n] for hyps in self._beam(src, search, limits, given, alignments)]

    # ------------------------------------------------------------------ text in, text out
    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, truncated to half the position limit (as zoo's translate_texts)."""
        return truncate_sources(self.tokenizer.encode_sources(texts), self.max_positions, self.unk_id)

    def decode_ids(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def pad(self, encoded: Sequence[Sequence[int]]) -> np.ndarray:
        """Right-padded [B, S] int64 batch."""
        src = np.full((len(encoded), max(len(e) for e in encoded)), self.pad_id, dtype=np.int64)
        for row, ids in enumerate(encoded):
            src[row, : len(ids)] = ids
        return src

    def search_settings(self, **given: Any) -> Search:
        """The manifest's search defaults with the given (non-None) settings, validated (SearchError; also for
        shortlist=1 on an export without a shortlist)."""
        search = replace(self.search, **{k: v for k, v in given.items() if v is not None})
        self._shortlisted(search)
        return search

    def request_cost(self, lengths: Sequence[int], search: Search, hypotheses: int = 1) -> int:
        """rows × beam × maximum output tokens of a batch of sources with these token lengths: the bound on
        decoder row-steps a server charges a request against its budget, before running anything. With sampling
        each source runs `hypotheses` rows (one per sample) in place of its beams."""
        if not lengths:
            return 0
        limits = max_lengths(np.asarray(lengths, dtype=np.int64), search, self.max_positions)
        return int(limits.sum()) * (int(hypotheses) if search.sampling else int(search.beam_size))

    def _batches(self, lengths: Sequence[int], max_tokens: int | None, max_sentences: int | None) -> list[list[int]]:
        return length_batches(lengths, max_tokens or self.max_tokens, max_sentences or self.max_sentences)

    def translate_encoded(
        self,
        encoded: Sequence[Sequence[int]],
        search: Search,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[str]:
        """Token ids per source (as `encode_texts` gives them) → output strings in input order."""
        nbest = self.translate_encoded_nbest(encoded, search, 1, max_tokens, max_sentences)
        return [hyps[0].text if hyps else "" for hyps in nbest]

    def translate_encoded_nbest(
        self,
        encoded: Sequence[Sequence[int]],
        search: Search,
        num_hypotheses: int = 1,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        limits: RowLimits | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
        keys: Sequence[int] | None = None,
        alignments: bool = False,
    ) -> list[list[Translation]]:
        """Token ids per source → per source its `num_hypotheses` best `Translation(text, score, tokens)`, best
        first, in input order (the first text is `translate_encoded`'s output). `limits`: each source's length
        bounds in place of search's (a server batching requests whose length settings differ); `prefixes`: per
        source the target token ids its output starts with (`encode_prefixes`); `keys`: per source its sampling
        key (default: its index here; a server batching several requests gives each source its index in its
        own request, so a request's samples do not depend on its neighbours). SearchError for num_hypotheses
        outside 1 … most_hypotheses or a prefix the search cannot take, raised before anything runs. `alignments`:
        each Translation carries its alignment (per token a source piece index; SearchError if the export has none)."""
        n = check_num_hypotheses(num_hypotheses, search.most_hypotheses, bool(search.sampling))
        if limits is not None and len(limits.max_len) != len(encoded):
            raise SearchError(f"got length bounds for {len(limits.max_len)} sentences but {len(encoded)} sources")
        if keys is not None and len(keys) != len(encoded):
            raise SearchError(f"got {len(keys)} sampling keys for {len(encoded)} sources")
        if prefixes is not None:
            lengths = np.array([len(e) for e in encoded], dtype=np.int64)
            check_prefixes(prefixes, limits or row_limits(lengths, search, self.max_positions), self._vocab)
        if alignments:
            self.check_alignments()
        return self._translate_nbest(encoded, search, n, max_tokens, max_sentences, limits, prefixes, keys, alignments)

    def _translate_nbest(
        self,
        encoded: Sequence[Sequence[int]],
        search: Search,
        n: int,
        max_tokens: int | None,
        max_sentences: int | None,
        limits: RowLimits | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
        keys: Sequence[int] | None = None,
        alignments: bool = False,
    ) -> list[list[Translation]]:
        """`translate_encoded_nbest` with its arguments already checked (by it, or by `translate`)."""
        outputs: list[list[Translation]] = [[] for _ in encoded]

        def run(model: ExportedModel, idx: list[int]) -> list[list[Hypothesis]]:
            part = None if limits is None else limits.take(idx)
            given = None if prefixes is None else [prefixes[i] for i in idx]
            named = idx if keys is None else [keys[i] for i in idx]
            return model._nbest(model.pad([encoded[i] for i in idx]), search, n, part, given, named, alignments)

        batches = self._batches([len(e) for e in encoded], max_tokens, max_sentences)
        for idx, nbest in zip(batches, self.replicas.map(run, batches), strict=True):
            for i, hyps in zip(idx, nbest, strict=True):
                outputs[i] = [Translation(self.decode_ids(h.tokens), h.score, h.tokens, h.alignment) for h in hyps]
        return outputs

    def translate(
        self,
        texts: str | Sequence[str],
        beam_size: int | None = None,
        len_penalty: float | None = None,
        max_len_a: float | None = None,
        max_len_b: int | None = None,
        min_len: int | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        num_hypotheses: int | None = None,
        return_scores: bool = False,
        shortlist: int | None = None,
        target_prefix: str | Sequence[str] | None = None,
        no_repeat_ngram_size: int | None = None,
        repetition_penalty: float | None = None,
        sampling: int | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        return_alignments: bool = False,
    ) -> list[str] | list[list[Translation]]:
        """Source strings → output strings in input order (unset options: the manifest's defaults; a setting
        outside SEARCH_LIMITS raises SearchError naming the allowed range).

        With `num_hypotheses` (an integer 1 … beam_size, else SearchError naming them) or `return_scores`, per
        source a list of `Translation(text, score, tokens)` instead: the num_hypotheses (default 1) best
        hypotheses, best first, scored as the search ranks them. The first text is always what the plain call
        returns. `shortlist=1` decodes over the export's vocabulary shortlist (shortlist.py; SearchError if it has
        none), 0 over the whole vocabulary.

        `target_prefix`: per source a target text its output starts with (tokenised as targets are: it ends at a
        piece boundary; "" = none; the output text includes it). `no_repeat_ngram_size`, `repetition_penalty`,
        and `sampling=1` with `top_k`, `top_p`, `temperature`, `seed` (num_hypotheses then draws that many
        samples): processing.py. `return_alignments`: Translation lists whose `alignment` gives, per output token,
        the source piece (index into `encode_texts`' ids of the source) it attended to most — pieces, not words:
        `export.runtime.alignment` maps them to words (SearchError if the export has no alignment output)."""
        if isinstance(texts, str):
            texts = [texts]
        search = self.search_settings(
            beam_size=beam_size,
            len_penalty=len_penalty,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            min_len=min_len,
            shortlist=shortlist,
            no_repeat_ngram_size=no_repeat_ngram_size,
            repetition_penalty=repetition_penalty,
            sampling=sampling,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            seed=seed,
        )
        prefixes = None if target_prefix is None else self.encode_prefixes(texts, target_prefix)
        wanted = 1 if num_hypotheses is None else num_hypotheses
        n = check_num_hypotheses(wanted, search.most_hypotheses, bool(search.sampling))
        nbest = self.translate_encoded_nbest(
            self.encode_texts(texts),
            search,
            n,
            max_tokens,
            max_sentences,
            prefixes=prefixes,
            alignments=return_alignments,
        )
        if num_hypotheses is None and not return_scores and not return_alignments:
            return [hyps[0].text if hyps else "" for hyps in nbest]
        return nbest

    def encode_prefixes(self, texts: Sequence[str], target_prefix: str | Sequence[str]) -> list[list[int]]:
        """Per source the token ids of its target prefix text (one per source; a str for a single source)."""
        given = [target_prefix] if isinstance(target_prefix, str) else list(target_prefix)
        if len(given) != len(texts):
            raise SearchError(f"got {len(given)} target prefixes for {len(texts)} sources; give one per source")
        return self.tokenizer.encode_targets(given)

    # ------------------------------------------------------------------ forced decoding
    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per target text to score, truncated to what the search can produce (as zoo's)."""
        return truncate_targets(self.tokenizer.encode_targets(texts), self.max_positions)

    def check_targets(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> None:
        """ScoreError unless `score_encoded` can run these: one target per source, each at most max_positions - 2
        ids in the vocabulary."""
        check_targets(targets, len(sources), self.vocab_size, self.max_positions)

    def score_cost(self, targets: Sequence[Sequence[int]]) -> int:
        """Decoder row-steps of scoring these targets (tokens + eos each): `request_cost`'s unit, for budgets."""
        return sum(len(t) + 1 for t in targets)

    def score_encoded(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        len_penalty: float | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[Scored]:
        """Token ids per source (as `encode_texts` gives them) and per target (as `encode_targets`) → per pair
        `Scored(tokens, token_logprobs, score)` in input order: the teacher-forced log-prob of each target token
        and of eos, and the sentence score normalised with `len_penalty` (default: the manifest's) as beam
        search ranks hypotheses — equal to zoo.generate.score_targets to 1e-4. Batched by source length as
        `translate_encoded`. ScoreError (`check_targets`) or SearchError (len_penalty) before anything runs."""
        self.check_targets(sources, targets)
        penalty = float(search_setting("len_penalty", self.search.len_penalty if len_penalty is None else len_penalty))
        out: list[Scored | None] = [None] * len(sources)
        for idx in self._batches([len(s) for s in sources], max_tokens, max_sentences):
            scored = teacher_forced(self, self.pad([sources[i] for i in idx]), [targets[i] for i in idx])
            for i, (ids, token_lp) in zip(idx, scored, strict=True):
                total = float(np.sum(token_lp, dtype=np.float32))
                out[i] = Scored(ids, token_lp.tolist(), normalised(total, len(ids), penalty))
        return [s for s in out if s is not None]

    def score(
        self,
        sources: str | Sequence[str],
        targets: str | Sequence[str],
        len_penalty: float | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[Scored]:
        """Forced decoding of text pairs: per (source, target) the target's `Scored(tokens, token_logprobs,
        score)` (see `score_encoded`) — for reranking, filtering, quality estimation. Sources are truncated as
        `translate` truncates them, targets to max_positions - 2 tokens (`encode_targets`); an empty target
        scores eos alone. Scoring a hypothesis `translate` returned gives back its score to 1e-4 unless the search
        forced eos at its length limit or its text re-tokenises to other ids (`score_encoded` its `tokens` for
        the exact score). ScoreError unless there is one target per source."""
        if isinstance(sources, str):
            sources = [sources]
        if isinstance(targets, str):
            targets = [targets]
        check_pairs(len(sources), len(targets))
        return self.score_encoded(
            self.encode_texts(sources), self.encode_targets(targets), len_penalty, max_tokens, max_sentences
        )
