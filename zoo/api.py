"""Python API mirroring the commands: `zoo.load(checkpoint).translate([...])`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.data import Tokenizer
from zoo.evaluation import translate_texts
from zoo.generate import SearchConfig
from zoo.model import Transformer


class Translator:
    """A trained model with its tokenizer: strings in, strings out (translation or summary)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, payload: dict[str, Any]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.entry: str = payload.get("entry", "unknown")
        self.task: str = payload.get("task", "translation")
        self.payload = payload

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, device: str = "cpu") -> Translator:
        payload = load_checkpoint(checkpoint)
        model = model_from_checkpoint(payload).to(device)
        return cls(model, Tokenizer.from_bytes(payload["tokenizer"]), payload)

    def translate(
        self,
        texts: Sequence[str],
        beam_size: int = 5,
        len_penalty: float = 1.0,
        max_len_a: float = 1.2,
        max_len_b: int = 10,
    ) -> list[str]:
        if isinstance(texts, str):
            texts = [texts]
        search = SearchConfig(beam_size=beam_size, len_penalty=len_penalty, max_len_a=max_len_a, max_len_b=max_len_b)
        with torch.inference_mode():
            return translate_texts(self.model, self.tokenizer, list(texts), search)
