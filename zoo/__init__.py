"""The attention zoo: multi-head-attention variants trained, pruned, exported and served."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import OmegaConf

# `${div:${model.d_model},8}` lets an entry say "the 8-head baseline's head size" whatever the size preset.
OmegaConf.register_new_resolver("div", lambda a, b: int(a) // int(b), replace=True)

if TYPE_CHECKING:
    from zoo.api import Translator


def load(checkpoint: str, device: str = "cpu") -> Translator:
    """`zoo.load(run_dir_or_pt).translate(["Guten Morgen."])` — see zoo.api.Translator."""
    # imported here: every zoo.* import runs this file first, and zoo.api loads torch and the whole model stack
    from zoo.api import Translator

    return Translator.from_checkpoint(checkpoint, device=device)


__all__ = ["load"]
