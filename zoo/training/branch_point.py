"""A branch point: a run's whole state at one update, from which another run goes on as if it had trained those
updates itself (GHT-PS from a GHT run at its vote, zoo/ght/branch.py).

Why a folder and not last.pt: last.pt moves on with the run, and so do best.pt (a later validation beats it) and
the kept interval checkpoints the end averages (the oldest are deleted). The folder keeps, at that update: the state
(`state.pt`, written before the update's after-update work: the branch does that work itself, as its own procedure
would), best.pt and the kept checkpoints, and the run's text logs (metrics.csv, the procedures' *.jsonl).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.checkpoint import load_checkpoint, save_checkpoint
from zoo.training import distributed as dist

if TYPE_CHECKING:
    from zoo.training.trainer import Trainer

FOLDER = "branch_point"  # a run's branch point, in its checkpoints/ (a run keeps one: GHT where GHT-PS votes)
STATE = "state.pt"


def save(trainer: Trainer, folder: Path) -> None:
    """Keep `trainer`'s run at its current update in `folder` (inside its checkpoints)."""
    if not dist.is_main():
        return
    folder.mkdir(parents=True, exist_ok=True)
    trainer.save_last(folder / STATE, pending=True)
    for name in ["best.pt", *trainer.state.kept_checkpoints]:
        if (trainer.ckpt_dir / name).is_file():
            shutil.copyfile(trainer.ckpt_dir / name, folder / name)
    for log in [trainer.run_dir / "metrics.csv", *trainer.run_dir.rglob("*.jsonl")]:
        if log.is_file() and trainer.ckpt_dir not in log.parents:
            (folder / "logs" / log.relative_to(trainer.run_dir)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, folder / "logs" / log.relative_to(trainer.run_dir))


def load(trainer: Trainer, folder: Path) -> None:
    """Start `trainer`'s new run from `folder`: its logs and checkpoints (carrying this run's entry, tokenizer and
    data description, as if this run had written them), then its state. Refused when the branch point's tokenizer
    is not this run's (its embeddings would mean other tokens)."""
    state = load_checkpoint(folder / STATE)
    if bytes(state["tokenizer"]) != bytes(trainer.payload["tokenizer"]):
        raise ValueError(f"{folder}: its run's tokenizer differs from this run's; branch from the same seed and data")
    if dist.is_main():
        for log in sorted((folder / "logs").rglob("*")):
            if log.is_file():
                target = trainer.run_dir / log.relative_to(folder / "logs")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, target)
        for kept in sorted(folder.glob("*.pt")):
            if kept.name != STATE:
                stored = {k: v for k, v in load_checkpoint(kept).items() if k != "path"}  # path: set by the reader
                save_checkpoint(trainer.ckpt_dir / kept.name, {**stored, **trainer.payload})
    trainer.load_resume(folder / STATE, state)
