"""Python API mirroring the commands: `zoo.load(checkpoint).translate([...])`, and `.score(sources, targets)`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from export.runtime import generation
from export.runtime.search import Scored, Search, Translation
from zoo.checkpoint import CheckpointPayload, load_checkpoint, model_from_checkpoint
from zoo.data import TextTokenizer, load_tokenizer
from zoo.decoding.generate import TorchEngine
from zoo.model import Transformer

SUMMARY_LENGTH_MARGIN = 1.1  # a summarizer's max_len_b: this × the 99th percentile of its training summaries


def task_length_defaults(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A summarizer's length bound from its training summaries: max_len_b = ⌈1.1 × their 99th percentile⌉ pieces,
    independent of the document (max_len_a = 0) — translation's 1.2 · source + 10 lets a summary of a 500-token
    document run to 610 tokens. A translator (or a checkpoint saved before the lengths were stored) gets {}: the
    zoo's defaults."""
    lengths = payload.get("target_lengths")
    if payload.get("task") != "summarization" or not lengths:
        return {}
    return {"max_len_a": 0.0, "max_len_b": max(1, math.ceil(SUMMARY_LENGTH_MARGIN * lengths["p99"]))}


def checkpoint_search(payload: Mapping[str, Any], given: Mapping[str, Any]) -> Search:
    """A checkpoint's search, one rule for `zoo.load(...).translate` and `python -m export`'s manifest (so both
    APIs decode alike): the given (non-None) settings, else the checkpoint's own `generation` (a converted model's
    num_beams and length_penalty), else the task's (`task_length_defaults`), else Search's defaults."""
    chosen = {key: value for key, value in given.items() if value is not None}
    return Search.from_generation({**task_length_defaults(payload), **payload.get("generation", {}), **chosen})


class Translator:
    """A trained model with its tokenizer: strings in, strings out (translation or summary).

    The export runtime (`export.load(dir)`) has the same `translate` and `score`, with the same search defaults
    (`checkpoint_search`, which its manifest holds), and returns the same results (hypotheses identical, scores
    equal to 1e-4), without torch."""

    def __init__(self, model: Transformer, tokenizer: TextTokenizer, payload: CheckpointPayload) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.entry: str = payload.get("entry", "unknown")
        self.task: str = payload.get("task", "translation")
        self.payload = payload
        self.search = checkpoint_search(payload, {})  # unset settings of translate/score take these
        self.engine = TorchEngine(model, tokenizer)  # what the runtime's decoding driver runs over

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, device: str = "cpu") -> Translator:
        payload = load_checkpoint(checkpoint)
        model = model_from_checkpoint(payload).to(device)
        return cls(model, load_tokenizer(payload["tokenizer"]), payload)

    def translate(
        self,
        texts: str | Sequence[str],
        search: Search | None = None,
        target_prefix: str | Sequence[str] | None = None,
        **overrides: Any,
    ) -> list[str] | list[list[Translation]]:
        """Source strings → output strings in input order (unset options: `self.search`, the checkpoint's
        defaults as an export of it has them) — the same call, options, driver and outputs as
        `export.load(...).translate` (`search`: every option as one value; `overrides`: its fields by name).

        With `num_hypotheses` (an integer 1 … most_hypotheses, else SearchError naming them), `return_scores` or
        `return_alignments`, per source a list of `Translation(text, score, tokens, alignment)` instead: the
        num_hypotheses best hypotheses, best first, scored as the search ranks them (summed token log-probs, eos
        included, / length ** len_penalty). The first text is always what the plain call returns.
        `target_prefix` (per source a target text the output starts with), the repetition options and sampling:
        export/runtime/processing.py."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        search = self.search_settings(search, **overrides)
        nbest = generation.translate(self.engine, texts, search, target_prefix)
        return generation.shaped(nbest, generation.asks_for_lists(search, overrides))

    def search_settings(self, search: Search | None = None, **overrides: Any) -> Search:
        """`search` (default: the checkpoint's) with the given (non-None) options, validated (SearchError), as
        ExportedModel.search_settings gives its manifest's."""
        if search is None:
            search = checkpoint_search(self.payload, overrides)
        else:
            search = replace(search, **{k: v for k, v in overrides.items() if v is not None})
        if search.return_alignments:
            self.engine.check_alignments()
        return search

    def score(
        self, sources: str | Sequence[str], targets: str | Sequence[str], len_penalty: float | None = None
    ) -> list[Scored]:
        """Forced decoding: per (source, target) pair the target's `Scored(tokens, token_logprobs, score)` — the
        log-probability of each target token and of eos, and the sentence score normalised as `translate` ranks
        hypotheses, so scoring a returned hypothesis gives back its score to 1e-4. Two exceptions: the search
        forced eos at its length limit (it counts that eos as log-prob 0, this its real log-prob), or the
        hypothesis text re-tokenises differently from the ids the search produced (score those with
        export.runtime.generation.score). Sources are truncated as `translate` truncates them, targets to
        max_positions - 2 tokens (the longest output the search can produce); an empty target scores eos
        alone. `len_penalty`: default the checkpoint's (`self.search`). ScoreError unless there is one target per
        source."""
        penalty = self.search_settings(len_penalty=len_penalty).len_penalty
        return generation.score_texts(self.engine, sources, targets, penalty)
