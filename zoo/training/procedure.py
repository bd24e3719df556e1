"""`Procedure`: the hooks a training procedure implements around the plain updates of `zoo.training.trainer.Trainer`.

Kept apart from the loop so that a procedure (zoo.ght.procedure) is written against these hooks alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from zoo.data.batching import Batch


class Trainer(Protocol):
    """What a procedure reads of the trainer it belongs to (zoo.training.trainer.Trainer): not the class itself, so the
    trainer can import its hooks and no module imports the other back."""

    bare: nn.Module  # the model, unwrapped
    state: Any  # zoo.training.trainer.TrainState: update, epoch, …
    cfg: DictConfig
    device: torch.device
    tokenizer: Any
    run_dir: Path
    ckpt_dir: Path
    world: int
    train_pairs: Any
    valid_pairs: Any

    def model_payload(self, weights: dict[str, Tensor] | None = None) -> dict[str, Any]: ...


class Procedure:
    """What happens around plain updates: auxiliary losses, stage changes, frozen parameters.

    The default is plain training. GHT/GHT-PS (zoo.ght.procedure) overrides these hooks; its
    state travels in `last.pt` so a resumed run continues in the right stage. Every hook receives the
    trainer (its `bare` model, state, config and checkpoint methods), never a part of it.
    """

    def bind(self, trainer: Trainer) -> None:
        """Called once by the trainer it belongs to."""
        self.trainer = trainer

    def on_start(self, trainer: Trainer) -> None:
        """Called when the update loop starts (also after a resume)."""

    def aux_loss(self, trainer: Trainer, batch: Batch) -> tuple[Tensor | None, dict[str, float]]:
        """Extra loss for this batch (called right after the forward pass), and scalars to log."""
        return None, {}

    def after_optimizer_step(self, trainer: Trainer) -> None:
        """E.g. restore parameters that must stay frozen."""

    def after_update(self, trainer: Trainer) -> None:
        """Called after every update (before the validation check): stage transitions."""

    def stop_reason(self, trainer: Trainer) -> str:
        """A non-empty reason ends training (checked with the trainer's own limits)."""
        return ""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()` output."""
