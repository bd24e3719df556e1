"""Self-contained checkpoints (zoo/DESIGN.md §3b): everything needed to translate, evaluate, export or
resume travels in one `.pt` file of plain tensors/containers, loadable with `weights_only=True`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, TypedDict

import torch

from zoo.errors import ZooError
from zoo.model import ModelConfig, Transformer, build_model

FORMAT_VERSION = 1


class CheckpointError(ZooError):
    """A checkpoint that cannot be found, read or understood; the message says what to do."""


class HeldOut(TypedDict):
    """Parallel test sentences kept in the checkpoint, so an export verifies without the corpus."""

    src: list[str]
    tgt: list[str]


class StoredKeys(TypedDict):
    """The keys every checkpoint holds: what every writer (zoo.train, zoo.convert, zoo.report's speed rebuilds)
    has stored since format 1 and some reader needs; `load_checkpoint` refuses a file lacking one."""

    format_version: int
    path: str  # not stored: the file load_checkpoint read it from
    model: dict[str, torch.Tensor]  # the state dict
    model_config: dict[str, Any]  # ModelConfig.to_dict(), with its head plan
    entry: str  # conf/model/<entry>, or the name zoo.convert gave a pretrained model
    task: str  # "translation" | "summarization"
    tokenizer: bytes  # zoo.data.load_tokenizer's input: a sentencepiece model or a tokenizer document
    data_config: dict[str, Any]  # the composed data node (build_splits rebuilds the corpus from it)
    heldout: HeldOut  # may be empty: a converted model given no --heldout


class CheckpointPayload(StoredKeys, total=False):
    """What a checkpoint file holds, written down once (the twin of the export's export.runtime.Manifest) and
    read only through `load_checkpoint`. The keys below may be absent, and absence means:
      size, data_stats       informational: nothing that loads a checkpoint reads them
      step                   a converted model (never trained here)
      target_lengths         a run saved before issue 64: a summarizer's export keeps translation's length
                             defaults (export.exporter.search_settings warns)
      generation             the zoo's search defaults (converted models, and runs started from one, carry their
                             author's)
      converted_from         trained here, not converted (python -m export wants an entry of this code or a name=)
      initialised_from       trained from scratch (or from init_from= voting weights)
      averaged               not avg.pt
      rebuilt_from           not a speed rebuild (zoo.report.speed_models: random weights)
      optimizer … rng        not last.pt: nothing to resume from
      procedure              not last.pt, or a last.pt saved before procedures had state: resumes with {}
    """

    size: dict[str, Any]  # zoo.flops.size_summary
    data_stats: dict[str, Any]
    step: int
    target_lengths: dict[str, int]  # p50, p99, max of the training targets, in pieces
    generation: dict[str, Any]  # a converted model's search defaults in the zoo's names (beam_size, len_penalty)
    converted_from: dict[str, Any]  # format, directory, sha256 of every file read
    initialised_from: dict[str, Any]  # init=: the path, entry (and converted_from, generation) started from
    averaged: list[str]  # the interval checkpoints avg.pt is the mean of
    rebuilt_from: str
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    train_state: dict[str, Any]  # zoo.training.trainer.TrainState as a dict
    rng: dict[str, torch.Tensor]
    procedure: dict[str, Any]  # the training procedure's state (GHT's stage)


# the keys a checkpoint file must hold, in the order the loader names them: StoredKeys less `path` (the loader's)
REQUIRED_KEYS = tuple(key for key in StoredKeys.__annotations__ if key != "path")


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Atomically write `payload` (+ format_version): a crash mid-write never leaves a truncated
    file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format_version": FORMAT_VERSION, **payload}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def resolve_checkpoint(location: str | Path) -> Path:
    """`<run dir>` → its avg.pt if averaging ran, else best.pt, else last.pt; a file as given."""
    p = Path(location).expanduser()
    if p.is_dir():
        for name in ("avg.pt", "best.pt", "last.pt"):
            for candidate in (p / "checkpoints" / name, p / name):
                if candidate.is_file():
                    return candidate
        raise CheckpointError(f"no checkpoint in run directory {p} (looked for checkpoints/avg.pt, best.pt, last.pt)")
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} does not exist; pass a run directory or a .pt file")
    return p


def load_checkpoint(location: str | Path) -> CheckpointPayload:
    """The one reader of checkpoint files: the payload with its required keys checked once, here, and `path` set
    to the file read (a run directory resolves as `resolve_checkpoint` says)."""
    path = resolve_checkpoint(location)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated or not a torch file
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}. Is the file complete?") from exc
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(
            f"{path} is not an attention-zoo checkpoint (no format_version); was it written by zoo.train or "
            "zoo.convert?"
        )
    if payload["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {payload['format_version']}, newer than this code "
            f"({FORMAT_VERSION}); upgrade the attention zoo"
        )
    missing = [key for key in REQUIRED_KEYS if key not in payload]
    if missing:
        raise CheckpointError(
            f"{path} is not an attention-zoo checkpoint: missing {', '.join(repr(k) for k in missing)}; was it "
            "written by zoo.train or zoo.convert?"
        )
    payload["path"] = str(path)
    return payload  # type: ignore[return-value]  # its required keys checked above


def model_from_checkpoint(payload: CheckpointPayload) -> Transformer:
    """Rebuild the model from its config alone and load its weights."""
    cfg = ModelConfig.from_dict(dict(payload["model_config"]))
    try:
        model = build_model(cfg)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {payload.get('path')} names a model this code cannot build: {exc}") from exc
    model.load_state_dict(payload["model"])
    return model.eval()


def average_weights(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the model weights of several checkpoints (fairseq's average_checkpoints)."""
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        state = load_checkpoint(path)["model"]
        for name, value in state.items():
            if name not in total:
                total[name] = value.clone().double() if value.is_floating_point() else value.clone()
            elif value.is_floating_point():
                total[name] += value.double()
    return {
        name: (value / len(paths)).to(torch.float32) if value.is_floating_point() else value
        for name, value in total.items()
    }
