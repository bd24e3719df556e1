"""Decode a list of texts with a model and score them — shared by training, `zoo.evaluate`,
`zoo.translate` and the Python API, so every number comes from the same generator."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from export.runtime.generation import translate
from export.runtime.search import (
    DEFAULT_MAX_SENTENCES,
    DEFAULT_MAX_TOKENS,
    Search,
    Translation,
)
from zoo.data import Example, TextTokenizer
from zoo.data import remove_bpe as strip_bpe
from zoo.decoding.generate import TorchEngine
from zoo.metrics import quality_report, tokenized_bleu
from zoo.model import Transformer

DEFAULT_SEARCH = Search()  # the search settings' one home, for the defaults of the functions below


def translate_texts(
    model: Transformer,
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    search: Search = DEFAULT_SEARCH,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
    progress: bool = False,
) -> list[list[Translation]]:
    """Source strings → per source its `search.num_hypotheses` best outputs with scores, best first, in input
    order: the runtime's decoding driver over this model (inputs longer than the position limit are truncated)."""
    engine = TorchEngine(model, tokenizer, progress=progress, max_tokens=max_tokens, max_sentences=max_sentences)
    return translate(engine, texts, search)


def evaluate_examples(
    model: Transformer,
    tokenizer: TextTokenizer,
    examples: Sequence[Example],
    task: str,
    search: Search = DEFAULT_SEARCH,
    remove_bpe: str | None = None,
    progress: bool = False,
    nbest: int | None = None,
    **batching: Any,
) -> dict[str, Any]:
    """Metrics (+ per data source), hypotheses and decoding speed on `examples`. With `nbest` also the `nbest`
    best hypotheses per example with their scores (key "nbest"); the metrics are those of the best, which are
    exactly the hypotheses without `nbest`."""
    start = time.perf_counter()
    asked = search if nbest is None else replace(search, num_hypotheses=nbest)
    lists = translate_texts(model, tokenizer, [e.src for e in examples], asked, progress=progress, **batching)
    hyps = [h[0].text if h else "" for h in lists]
    seconds = time.perf_counter() - start
    refs = [e.tgt for e in examples]
    scored_hyps = hyps
    if remove_bpe:
        scored_hyps = [strip_bpe(h, remove_bpe) for h in hyps]
        refs = [strip_bpe(r, remove_bpe) for r in refs]
    report = quality_report(task, scored_hyps, refs, [e.origin for e in examples])
    if remove_bpe and task == "translation":
        # fairseq-prepared data is already tokenized: report fairseq-generate's tokenized BLEU too
        report["tokenized_bleu"] = tokenized_bleu(scored_hyps, refs)
    report.update(
        sentences=len(examples),
        seconds=round(seconds, 3),
        sentences_per_s=round(len(examples) / max(seconds, 1e-9), 2),
        beam_size=search.beam_size,
    )
    result: dict[str, Any] = {"metrics": report, "hypotheses": hyps}
    if nbest is not None:
        result["nbest"] = lists
    return result
