"""Decode a list of texts with a model and score them — shared by training, `zoo.evaluate`,
`zoo.translate` and the Python API, so every number comes from the same generator."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from export.runtime.generation import padded, translate
from export.runtime.search import (
    DEFAULT_MAX_SENTENCES,
    DEFAULT_MAX_TOKENS,
    Scored,
    Search,
    Translation,
    check_pairs,
    check_targets,
    length_batches,
    truncate_sources,
    truncate_targets,
)
from zoo.data import Example, TextTokenizer
from zoo.data import remove_bpe as strip_bpe
from zoo.generate import TorchEngine, score_targets
from zoo.metrics import quality_report, tokenized_bleu
from zoo.model import Transformer

DEFAULT_SEARCH = Search()  # the search settings' one home, for the defaults of the functions below


def encode_sources(tokenizer: TextTokenizer, texts: Sequence[str], max_positions: int) -> list[list[int]]:
    """Token ids per source, truncated as the runtime truncates them (search.truncate_sources)."""
    return truncate_sources(tokenizer.encode_sources(texts), max_positions, tokenizer.unk_id)


def encode_targets(tokenizer: TextTokenizer, texts: Sequence[str], max_positions: int) -> list[list[int]]:
    """Token ids per target to score, truncated to what the search can produce (search.truncate_targets)."""
    return truncate_targets(tokenizer.encode_targets(texts), max_positions)


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


@torch.inference_mode()
def score_ids(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    len_penalty: float = DEFAULT_SEARCH.len_penalty,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
) -> list[Scored]:
    """Teacher-forced scores of token-id targets given token-id sources (zoo.generate.score_targets), in input
    order, batched by source length as the search is. ScoreError when the counts differ or a target is too long
    (max_positions - 2 tokens) or holds ids outside the vocabulary."""
    model.eval()
    device = next(model.parameters()).device
    check_targets(targets, len(sources), model.cfg.vocab_size, model.cfg.max_positions)  # before running anything
    out: list[Scored | None] = [None] * len(sources)
    for idx in length_batches([len(s) for s in sources], max_tokens, max_sentences):
        src = torch.from_numpy(padded([sources[i] for i in idx], model.cfg.pad_id)).to(device)
        for i, scored in zip(idx, score_targets(model, src, [targets[i] for i in idx], len_penalty), strict=True):
            out[i] = scored
    return [s for s in out if s is not None]


def score_texts(
    model: Transformer,
    tokenizer: TextTokenizer,
    sources: Sequence[str],
    targets: Sequence[str],
    len_penalty: float = DEFAULT_SEARCH.len_penalty,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
) -> list[Scored]:
    """Per (source, target) text pair the target's per-token log-probs and sentence score (forced decoding: for
    reranking, filtering, quality estimation). Sources are truncated as `translate_texts` does, targets to what
    the search can produce (`encode_targets`); an empty target scores eos alone. ScoreError when the counts
    differ."""
    check_pairs(len(sources), len(targets))
    limit = model.cfg.max_positions
    return score_ids(
        model,
        encode_sources(tokenizer, sources, limit),
        encode_targets(tokenizer, targets, limit),
        len_penalty,
        max_tokens,
        max_sentences,
    )


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
