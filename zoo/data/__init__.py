"""Data layer: corpus builders, the joint tokenizer and length-bucketed batching.

Typical use by the trainer::

    splits = build_splits(cfg.data)                      # cached Debian corpora or user files
    tok = Tokenizer.train((t for ex in splits.train for t in (ex.src, ex.tgt)), cfg.data.vocab_size)
    pairs, dropped = encode_examples(splits.train, tok, cfg.data.max_len)
    sampler = TokenBatchSampler.from_pairs(pairs, max_tokens=4096, seed=cfg.seed)
    for idx in sampler.batches(epoch):
        batch = collate([pairs[i] for i in idx], tok.pad_id, tok.bos_id, tok.eos_id)

The names above load their module on first use (PEP 562), so importing a submodule runs no torch import:
serving fetches nginx and perf_analyzer's libb64 through `zoo.data.debian` (and its cache and types) on hosts
that need no torch; only `batching` imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoo.data.batching import Batch, TokenBatchSampler, collate, encode_examples
    from zoo.data.build import build_splits
    from zoo.data.text import remove_bpe
    from zoo.data.tokenizer import Tokenizer
    from zoo.data.types import DataError, Example, Splits

_HOMES = {  # exported name -> the module defining it
    "Batch": "zoo.data.batching",
    "TokenBatchSampler": "zoo.data.batching",
    "collate": "zoo.data.batching",
    "encode_examples": "zoo.data.batching",
    "build_splits": "zoo.data.build",
    "remove_bpe": "zoo.data.text",
    "Tokenizer": "zoo.data.tokenizer",
    "DataError": "zoo.data.types",
    "Example": "zoo.data.types",
    "Splits": "zoo.data.types",
}


def __getattr__(name: str) -> Any:
    """An exported name, imported from its module on first use and then kept in this module's namespace."""
    home = _HOMES.get(name)
    if home is None:  # also how `from zoo.data import build` falls back to importing the submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "Batch",
    "DataError",
    "Example",
    "Splits",
    "TokenBatchSampler",
    "Tokenizer",
    "build_splits",
    "collate",
    "encode_examples",
    "remove_bpe",
]
