"""Data layer: corpus builders, the joint tokenizer and length-bucketed batching.

Typical use by the trainer::

    splits = build_splits(cfg.data)                      # cached Debian corpora or user files
    tok = Tokenizer.train((t for ex in splits.train for t in (ex.src, ex.tgt)), cfg.data.vocab_size)
    pairs, dropped = encode_examples(splits.train, tok, cfg.data.max_len)   # from zoo.data.batching
    sampler = TokenBatchSampler([len(s) for s, _ in pairs], [len(t) for _, t in pairs], max_tokens=4096)
    for idx in sampler.batches(epoch):
        batch = collate([pairs[i] for i in idx], tok.pad_id, tok.bos_id, tok.eos_id)

The batching names (`Batch`, `TokenBatchSampler`, `collate`, `encode_examples`) are imported from
`zoo.data.batching`, the one module here that needs torch: the package itself imports none, because serving
fetches nginx and perf_analyzer's libb64 through `zoo.data.debian` on hosts that need no torch.
"""

from export.runtime.tokenizer import SharedVocabTokenizer, TextTokenizer
from zoo.data.build import build_splits
from zoo.data.text import remove_bpe
from zoo.data.tokenizer import Tokenizer, load_tokenizer, train_run_tokenizer
from zoo.data.types import DataError, Example, Splits

__all__ = [
    "DataError",
    "Example",
    "SharedVocabTokenizer",
    "Splits",
    "TextTokenizer",
    "Tokenizer",
    "build_splits",
    "load_tokenizer",
    "remove_bpe",
    "train_run_tokenizer",
]
