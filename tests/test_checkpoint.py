"""Issue 67: the checkpoint payload is typed once (zoo.checkpoint.CheckpointPayload) and read through one loader,
which refuses what is not a checkpoint with the file and the fix, and still loads one saved before the optional
keys existed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo.checkpoint import (
    REQUIRED_KEYS,
    CheckpointError,
    CheckpointPayload,
    average_weights,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from zoo.model import ModelConfig, build_model


def _oldest_payload() -> dict:
    """The keys a format-1 checkpoint of the first trainer held that anything reads: the required ones only."""
    cfg = ModelConfig(vocab_size=32, d_model=16, encoder_layers=1, decoder_layers=1, num_heads=2, ffn_dim=32)
    torch.manual_seed(0)
    return {
        "model": build_model(cfg).state_dict(),
        "model_config": cfg.to_dict(),
        "entry": "transformer",
        "task": "translation",
        "tokenizer": b"not read by the loader",
        "data_config": {"name": "toy", "task": "translation"},
        "heldout": {"src": ["a b"], "tgt": ["b a"]},
    }


def test_required_keys_are_the_typed_payload_s() -> None:
    assert set(REQUIRED_KEYS) == CheckpointPayload.__required_keys__ - {"path"}
    assert not set(REQUIRED_KEYS) & CheckpointPayload.__optional_keys__


def test_a_payload_without_the_optional_keys_still_loads(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "old.pt", _oldest_payload())
    payload = load_checkpoint(tmp_path / "old.pt")
    assert payload["path"] == str(tmp_path / "old.pt") and payload["format_version"] == 1
    assert not set(payload) & CheckpointPayload.__optional_keys__
    assert model_from_checkpoint(payload).cfg.num_heads == 2
    averaged = average_weights([tmp_path / "old.pt", tmp_path / "old.pt"])
    assert all(torch.equal(averaged[k], v) for k, v in payload["model"].items() if v.is_floating_point())


@pytest.mark.parametrize("missing", ["model_config", "tokenizer", "heldout"])
def test_a_payload_missing_a_required_key_is_refused_with_the_file_and_the_fix(tmp_path: Path, missing: str) -> None:
    payload = _oldest_payload()
    del payload[missing]
    save_checkpoint(tmp_path / "partial.pt", payload)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path / "partial.pt")
    message = str(caught.value)
    assert str(tmp_path / "partial.pt") in message and f"missing '{missing}'" in message
    assert "was it written by zoo.train or zoo.convert?" in message


def test_a_torch_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    for i, content in enumerate(({"weights": torch.zeros(2)}, [1, 2], torch.zeros(3))):
        torch.save(content, tmp_path / f"other{i}.pt")
        with pytest.raises(CheckpointError, match=r"not an attention-zoo checkpoint .*zoo\.train or zoo\.convert"):
            load_checkpoint(tmp_path / f"other{i}.pt")
