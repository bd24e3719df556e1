"""Shared helpers for tests: compose configs the way the entry points do, build tiny models."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from zoo.entries import CONF_DIR, entry_model_config, list_entries
from zoo.model import ModelConfig, Transformer, build_model

ENTRIES = list_entries()
REPO = Path(__file__).resolve().parent.parent


def compose_train(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=False)


def tiny_model_config(entry: str, vocab_size: int = 64, **changes) -> ModelConfig:
    return entry_model_config(compose_train([f"+model={entry}", "size=tiny"]).model, vocab_size=vocab_size, **changes)


def tiny_model(entry: str, seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return build_model(tiny_model_config(entry, **changes)).eval()


def random_batch(
    vocab: int = 64, b: int = 3, s: int = 7, t: int = 6, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Source with some right padding, target prefix; ids ≥ 4 avoid the special tokens."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    src[0, s - 2 :] = 0
    tgt = torch.randint(4, vocab, (b, t), generator=g)
    tgt[:, 0] = 2
    return src, tgt
