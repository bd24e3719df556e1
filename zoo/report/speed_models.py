"""What the speed stage times, rebuilt from the committed records alone (no checkpoint, no retraining).

Decoding speed is a property of the architecture, the head plan and how many tokens are produced — not of the
trained weights. So each record's stored config gives a random-initialised model of the same shape (its stored
head plan removes the same heads at export), and the suite *baseline's* stored test hypotheses give, per sentence,
how many tokens to produce: every entry's timed search is forced to produce exactly that many (export.runtime's
`forced_limits`), so every entry does the same work and a ratio of sentences/s is a ratio of tokens/s — an entry
that writes shorter outputs is not counted faster for it (measure.py). Sources and hypotheses are tokenized by the
tokenizer training builds from the (reproducible) corpus cache with the speed seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from zoo.checkpoint import save_checkpoint
from zoo.data import DataError, Tokenizer, build_splits, train_run_tokenizer
from zoo.entries import entry_model_config
from zoo.errors import ZooError
from zoo.flops import size_summary
from zoo.model import build_model

HELDOUT = 32  # test pairs stored in a rebuilt checkpoint: what the export verifies ORT against torch on
INIT_SEED = 0  # the random weights' seed: any value times the same


class SpeedInputError(ZooError):
    """A record the speed stage cannot rebuild a model or workload from; the message names the file and the fix."""


@dataclass(frozen=True)
class SpeedCorpus:
    """The sources every entry decodes and the tokenizer that counts their tokens (one per suite and seed)."""

    texts: list[str]  # the first `sentences` test sources
    tokenizer: Tokenizer
    data_config: dict[str, Any]
    heldout: dict[str, list[str]]  # {"src": [...], "tgt": [...]}: the export's verification pairs


def speed_corpus(record: dict[str, Any], label: str, sentences: int, cache_dir: Path) -> SpeedCorpus:
    """The test sources and the tokenizer of a record's data config and seed; the tokenizer is trained once, as
    zoo.train trains it, and kept in `cache_dir`."""
    try:
        data_cfg = dict(record["config"]["data"])
        seed = int(record["config"]["trainer"]["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SpeedInputError(f"{label}: no data config and seed in the record ({exc}); re-record the run") from exc
    try:
        splits = build_splits(data_cfg)
    except (DataError, OSError) as exc:
        raise SpeedInputError(f"{label}: its corpus cannot be rebuilt here: {exc}") from exc
    cache = cache_dir / f"tokenizer-seed{seed}.model"
    if cache.is_file():
        tokenizer = Tokenizer.from_bytes(cache.read_bytes())
    else:
        tokenizer = train_run_tokenizer(splits.train, data_cfg, seed)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(tokenizer.model_bytes)
    test = splits.test
    return SpeedCorpus(
        texts=[e.src.replace("\n", " ") for e in test[:sentences]],
        tokenizer=tokenizer,
        data_config=data_cfg,
        heldout={"src": [e.src for e in test[:HELDOUT]], "tgt": [e.tgt for e in test[:HELDOUT]]},
    )


def forced_lengths(record: dict[str, Any], label: str, corpus: SpeedCorpus) -> list[int]:
    """Tokens per stored hypothesis of the decoded sentences (without eos): what each sentence is forced to (the
    speed stage takes them from the baseline's record, for every entry)."""
    hypotheses = record.get("hypotheses") or []
    if len(hypotheses) < len(corpus.texts):
        raise SpeedInputError(
            f"{label}: {len(hypotheses)} stored hypotheses, the speed stage decodes {len(corpus.texts)} sentences; "
            "lower suite speed.sentences"
        )
    return [len(ids) for ids in corpus.tokenizer.encode_batch(hypotheses[: len(corpus.texts)])]


def head_plan(record: dict[str, Any]) -> dict[str, list[int]]:
    """The record's kept heads per module ({} when none were removed)."""
    return {str(k): [int(h) for h in v] for k, v in (record.get("head_plan") or {}).items()}


def _distinct(model: torch.nn.Module) -> None:
    """Jitter the vectors a fresh model initialises to constants (biases 0, norms 1): the ONNX exporter shares
    equal initializers between modules, which a trained model never has, so the graph would not be the one a
    trained model exports."""
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.02)  # [n]


def rebuild_checkpoint(record: dict[str, Any], label: str, corpus: SpeedCorpus, out: Path) -> Path:
    """A zoo checkpoint of the record's architecture with random weights, which `python -m export` reads like a
    trained one. SpeedInputError (one line, naming the record) when this code cannot build the config."""
    tok = corpus.tokenizer
    try:
        node = OmegaConf.create(record["config"]["model"])
        cfg = entry_model_config(
            node, vocab_size=tok.vocab_size, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id
        )
        torch.manual_seed(INIT_SEED)
        model = build_model(cfg).eval()
        _distinct(model)
    except (KeyError, TypeError, ValueError) as exc:
        raise SpeedInputError(
            f"{label}: its model config cannot be rebuilt by this code ({type(exc).__name__}: {exc}); "
            "re-train the entry with this code or check out the commit named in its git_sha"
        ) from exc
    save_checkpoint(
        out,
        {
            "entry": record["entry"],
            "task": corpus.data_config.get("task", "translation"),
            "tokenizer": tok.model_bytes,
            "data_config": corpus.data_config,
            "heldout": corpus.heldout,
            "size": size_summary(model),
            "model": model.state_dict(),
            "model_config": cfg.to_dict(),
            "step": 0,
            "rebuilt_from": label,
        },
    )
    return out


def write_plan(plan: dict[str, list[int]], out: Path) -> Path:
    """The head plan as the JSON file `python -m export head_plan=` reads."""
    out.write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    return out


__all__ = [
    "SpeedCorpus",
    "SpeedInputError",
    "forced_lengths",
    "head_plan",
    "rebuild_checkpoint",
    "speed_corpus",
    "write_plan",
]
