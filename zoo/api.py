"""Python API mirroring the commands: `zoo.load(checkpoint).translate([...])`, and `.score(sources, targets)`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from export.runtime.search import Scored, Search
from zoo.checkpoint import CheckpointPayload, load_checkpoint, model_from_checkpoint
from zoo.data import TextTokenizer, load_tokenizer
from zoo.evaluation import Translation, score_texts, translate_texts_nbest
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

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, device: str = "cpu") -> Translator:
        payload = load_checkpoint(checkpoint)
        model = model_from_checkpoint(payload).to(device)
        return cls(model, load_tokenizer(payload["tokenizer"]), payload)

    def translate(
        self,
        texts: str | Sequence[str],
        beam_size: int | None = None,
        len_penalty: float | None = None,
        max_len_a: float | None = None,
        max_len_b: int | None = None,
        min_len: int | None = None,
        num_hypotheses: int | None = None,
        return_scores: bool = False,
        target_prefix: str | Sequence[str] | None = None,
        no_repeat_ngram_size: int | None = None,
        repetition_penalty: float | None = None,
        sampling: int | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> list[str] | list[list[Translation]]:
        """Source strings → output strings in input order (unset settings: `self.search`, the checkpoint's
        defaults as an export of it has them) — the same call, options and outputs as `export.load(...).translate`.

        With `num_hypotheses` (an integer 1 … most_hypotheses, else SearchError naming them) or
        `return_scores`, per source a list of `Translation(text, score, tokens)` instead: the num_hypotheses
        (default 1) best hypotheses, best first, scored as the search ranks them (summed token log-probs, eos
        included, / length ** len_penalty). The first text is always what the plain call returns.
        `target_prefix` (per source a target text the output starts with), the repetition options and sampling:
        export/runtime/processing.py."""
        if isinstance(texts, str):
            texts = [texts]
        search = self.search_settings(
            beam_size=beam_size,
            len_penalty=len_penalty,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            min_len=min_len,
            no_repeat_ngram_size=no_repeat_ngram_size,
            repetition_penalty=repetition_penalty,
            sampling=sampling,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            seed=seed,
        )
        prefixes = None
        if target_prefix is not None:
            prefixes = [target_prefix] if isinstance(target_prefix, str) else list(target_prefix)
        with torch.inference_mode():
            n = 1 if num_hypotheses is None else num_hypotheses
            nbest = translate_texts_nbest(self.model, self.tokenizer, list(texts), search, n, target_prefixes=prefixes)
        if num_hypotheses is None and not return_scores:
            return [hyps[0].text if hyps else "" for hyps in nbest]
        return nbest

    def search_settings(self, **given: Any) -> Search:
        """The checkpoint's search defaults with the given (non-None) settings, validated (SearchError), as
        ExportedModel.search_settings gives its manifest's."""
        return checkpoint_search(self.payload, given)

    def score(
        self, sources: str | Sequence[str], targets: str | Sequence[str], len_penalty: float | None = None
    ) -> list[Scored]:
        """Forced decoding: per (source, target) pair the target's `Scored(tokens, token_logprobs, score)` — the
        log-probability of each target token and of eos, and the sentence score normalised as `translate` ranks
        hypotheses, so scoring a returned hypothesis gives back its score to 1e-4. Two exceptions: the search
        forced eos at its length limit (it counts that eos as log-prob 0, this its real log-prob), or the
        hypothesis text re-tokenises differently from the ids the search produced (score those with
        zoo.evaluation.score_ids). Sources are truncated as `translate` truncates them, targets to
        max_positions - 2 tokens (the longest output the search can produce); an empty target scores eos
        alone. `len_penalty`: default the checkpoint's (`self.search`). ScoreError unless there is one target per
        source."""
        if isinstance(sources, str):
            sources = [sources]
        if isinstance(targets, str):
            targets = [targets]
        penalty = self.search_settings(len_penalty=len_penalty).len_penalty
        return score_texts(self.model, self.tokenizer, list(sources), list(targets), penalty)
