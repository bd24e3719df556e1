"""Self-contained checkpoints (zoo/DESIGN.md §3b): everything needed to translate, evaluate, export or
resume travels in one `.pt` file of plain tensors/containers, loadable with `weights_only=True`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from zoo.errors import ZooError
from zoo.model import ModelConfig, Transformer, build_model

FORMAT_VERSION = 1


class CheckpointError(ZooError):
    """A checkpoint that cannot be found, read or understood; the message says what to do."""


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


def load_checkpoint(location: str | Path) -> dict[str, Any]:
    path = resolve_checkpoint(location)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated or not a torch file
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}. Is the file complete?") from exc
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"{path} is not an attention-zoo checkpoint (no format_version)")
    if payload["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {payload['format_version']}, newer than this code "
            f"({FORMAT_VERSION}); upgrade the attention zoo"
        )
    for key in ("model", "model_config"):
        if key not in payload:
            raise CheckpointError(f"{path} lacks '{key}'; it was not written by zoo.train")
    payload["path"] = str(path)
    return payload


def model_from_checkpoint(payload: dict[str, Any]) -> Transformer:
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
        state = torch.load(path, map_location="cpu", weights_only=True)["model"]
        for name, value in state.items():
            if name not in total:
                total[name] = value.clone().double() if value.is_floating_point() else value.clone()
            elif value.is_floating_point():
                total[name] += value.double()
    return {
        name: (value / len(paths)).to(torch.float32) if value.is_floating_point() else value
        for name, value in total.items()
    }
