"""Reading a transformers `save_pretrained` directory offline, without transformers: config.json and the weights.

Weights are `model.safetensors` (read here: an 8-byte header length, a JSON header of name → dtype, shape and byte
range, then the raw little-endian data), sharded safetensors (`model.safetensors.index.json`), or
`pytorch_model.bin`, loaded only with `torch.load(weights_only=True)` so that a downloaded file cannot run code.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo.errors import ZooError

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class ConvertError(ZooError):
    """A pretrained model that cannot be converted exactly; the message names the file or field and the fix."""


def read_json(path: Path) -> Any:
    """A JSON file of the directory, or ConvertError naming it."""
    if not path.is_file():
        raise ConvertError(f"{path} is missing; pass a directory written by transformers' save_pretrained")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConvertError(f"cannot read {path}: {exc}") from exc


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of a .safetensors file (copied out of the file's bytes)."""
    data = path.read_bytes()
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length].decode("utf-8"))
    except (struct.error, ValueError) as exc:
        raise ConvertError(f"{path} is not a safetensors file ({exc})") from exc
    start = 8 + length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
        begin, end = info["data_offsets"]
        if dtype is None or not 0 <= begin <= end <= len(data) - start:
            raise ConvertError(
                f"{path}: tensor {name!r} has dtype {info.get('dtype')!r} or a byte range this reader "
                "does not take; re-save the model with save_pretrained"
            )
        raw = bytearray(data[start + begin : start + end])  # writable: torch.frombuffer shares the buffer
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    return tensors


def read_weights(directory: Path) -> dict[str, Tensor]:
    """The model's weights from model.safetensors, its shards, or pytorch_model.bin (weights_only)."""
    single = directory / "model.safetensors"
    if single.is_file():
        return read_safetensors(single)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index)["weight_map"].values()))
        return {name: t for shard in shards for name, t in read_safetensors(directory / shard).items()}
    binary = directory / "pytorch_model.bin"
    if binary.is_file():
        try:
            state = torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as exc:  # a pickle that needs code, or a corrupt file
            raise ConvertError(f"cannot read {binary} with torch.load(weights_only=True): {exc}") from exc
        if not isinstance(state, dict):
            raise ConvertError(f"{binary} does not hold a state dict")
        return dict(state)
    raise ConvertError(
        f"no weights in {directory} (looked for model.safetensors, model.safetensors.index.json, pytorch_model.bin)"
    )
