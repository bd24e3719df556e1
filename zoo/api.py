"""Python API mirroring the commands: `zoo.load(checkpoint).translate([...])`, and `.score(sources, targets)`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from zoo.checkpoint import CheckpointPayload, load_checkpoint, model_from_checkpoint
from zoo.data import TextTokenizer, load_tokenizer
from zoo.evaluation import Translation, score_texts, translate_texts, translate_texts_nbest
from zoo.generate import Scored, Search
from zoo.model import Transformer


class Translator:
    """A trained model with its tokenizer: strings in, strings out (translation or summary).

    The export runtime (`export.load(dir)`) has the same `translate` and `score` and returns the same results
    (hypotheses identical, scores equal to 1e-4), without torch."""

    def __init__(self, model: Transformer, tokenizer: TextTokenizer, payload: CheckpointPayload) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.entry: str = payload.get("entry", "unknown")
        self.task: str = payload.get("task", "translation")
        self.payload = payload

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, device: str = "cpu") -> Translator:
        payload = load_checkpoint(checkpoint)
        model = model_from_checkpoint(payload).to(device)
        return cls(model, load_tokenizer(payload["tokenizer"]), payload)

    def translate(
        self,
        texts: str | Sequence[str],
        beam_size: int = 5,
        len_penalty: float = 1.0,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
        min_len: int = 1,
        num_hypotheses: int | None = None,
        return_scores: bool = False,
    ) -> list[str] | list[list[Translation]]:
        """Source strings → output strings in input order.

        With `num_hypotheses` (an integer 1 … beam_size, else SearchError naming them) or
        `return_scores`, per source a list of `Translation(text, score, tokens)` instead: the num_hypotheses
        (default 1) best hypotheses, best first, scored as the search ranks them (summed token log-probs, eos
        included, / length ** len_penalty). The first text is always what the plain call returns."""
        if isinstance(texts, str):
            texts = [texts]
        search = Search(
            beam_size=beam_size, len_penalty=len_penalty, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len
        )
        with torch.inference_mode():
            if num_hypotheses is None and not return_scores:
                return translate_texts(self.model, self.tokenizer, list(texts), search)
            n = 1 if num_hypotheses is None else num_hypotheses
            return translate_texts_nbest(self.model, self.tokenizer, list(texts), search, n)

    def score(
        self, sources: str | Sequence[str], targets: str | Sequence[str], len_penalty: float = 1.0
    ) -> list[Scored]:
        """Forced decoding: per (source, target) pair the target's `Scored(tokens, token_logprobs, score)` — the
        log-probability of each target token and of eos, and the sentence score normalised as `translate` ranks
        hypotheses, so scoring a returned hypothesis gives back its score to 1e-4. Two exceptions: the search
        forced eos at its length limit (it counts that eos as log-prob 0, this its real log-prob), or the
        hypothesis text re-tokenises differently from the ids the search produced (score those with
        zoo.evaluation.score_ids). Sources are truncated as `translate` truncates them, targets to
        max_positions - 2 tokens (the longest output the search can produce); an empty target scores eos
        alone. ScoreError unless there is one target per source."""
        if isinstance(sources, str):
            sources = [sources]
        if isinstance(targets, str):
            targets = [targets]
        return score_texts(self.model, self.tokenizer, list(sources), list(targets), len_penalty)
