"""Decode a list of texts with a model and score them — shared by training, `zoo.evaluate`,
`zoo.translate` and the Python API, so every number comes from the same generator."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from export.runtime.search import (
    DEFAULT_MAX_SENTENCES,
    DEFAULT_MAX_TOKENS,
    Scored,
    Search,
    SearchError,
    Translation,
    check_num_hypotheses,
    check_pairs,
    check_targets,
    length_batches,
    truncate_sources,
    truncate_targets,
)
from zoo.data import Example, TextTokenizer
from zoo.data import remove_bpe as strip_bpe
from zoo.generate import generate_nbest, score_targets
from zoo.metrics import quality_report, tokenized_bleu
from zoo.model import Transformer

DEFAULT_SEARCH = Search()  # the search settings' one home, for the defaults of the functions below


def encode_sources(tokenizer: TextTokenizer, texts: Sequence[str], max_positions: int) -> list[list[int]]:
    """Token ids per source, truncated as the runtime truncates them (search.truncate_sources)."""
    return truncate_sources(tokenizer.encode_sources(texts), max_positions, tokenizer.unk_id)


def encode_targets(tokenizer: TextTokenizer, texts: Sequence[str], max_positions: int) -> list[list[int]]:
    """Token ids per target to score, truncated to what the search can produce (search.truncate_targets)."""
    return truncate_targets(tokenizer.encode_targets(texts), max_positions)


def _padded(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    """Right-padded [B, S] long batch."""
    src = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, ids in enumerate(rows):
        src[i, : len(ids)] = torch.tensor(ids)
    return src.to(device)


@torch.inference_mode()
def translate_texts(
    model: Transformer,
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    search: Search = DEFAULT_SEARCH,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
    progress: bool = False,
) -> list[str]:
    """Source strings → output strings, in input order. Inputs longer than the model's position
    limit are truncated (the generator also needs room for the output)."""
    nbest = translate_texts_nbest(model, tokenizer, texts, search, 1, max_tokens, max_sentences, progress)
    return [hyps[0].text if hyps else "" for hyps in nbest]


@torch.inference_mode()
def translate_texts_nbest(
    model: Transformer,
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    search: Search = DEFAULT_SEARCH,
    num_hypotheses: int = 1,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
    progress: bool = False,
    target_prefixes: Sequence[str] | None = None,
) -> list[list[Translation]]:
    """Source strings → per source its `num_hypotheses` best outputs with scores, best first, in input order
    (batched and truncated as `translate_texts`, whose output is always each list's first text; with sampling,
    that many draws, keyed by the source's index here as the runtime keys them). `target_prefixes`: per source a
    target text its output starts with (the runtime's `translate(target_prefix=…)`). SearchError unless
    num_hypotheses is an integer 1 … most_hypotheses, or for a prefix the search cannot take."""
    num_hypotheses = check_num_hypotheses(num_hypotheses, search.most_hypotheses, bool(search.sampling))  # no texts too
    model.eval()
    device = next(model.parameters()).device
    encoded = encode_sources(tokenizer, texts, model.cfg.max_positions)
    prefixes = None
    if target_prefixes is not None:
        if len(target_prefixes) != len(texts):
            raise SearchError(
                f"got {len(target_prefixes)} target prefixes for {len(texts)} sources; give one per source"
            )
        prefixes = tokenizer.encode_targets(list(target_prefixes))
    outputs: list[list[Translation]] = [[] for _ in texts]
    for idx in _decode_batches(encoded, max_tokens, max_sentences, progress):
        src = _padded([encoded[i] for i in idx], model.cfg.pad_id, device)
        given = None if prefixes is None else [prefixes[i] for i in idx]
        nbest = generate_nbest(model, src, search, num_hypotheses, prefixes=given, keys=idx)
        for i, hyps in zip(idx, nbest, strict=True):
            outputs[i] = [Translation(tokenizer.decode(h.tokens), h.score, h.tokens) for h in hyps]
    return outputs


def _decode_batches(encoded: Sequence[Sequence[int]], max_tokens: int, max_sentences: int, progress: bool) -> Any:
    batches = length_batches([len(e) for e in encoded], max_tokens, max_sentences)
    return tqdm(batches, desc="decode", unit="batch", leave=False) if progress else batches


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
        src = _padded([sources[i] for i in idx], model.cfg.pad_id, device)
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
    sources = [e.src for e in examples]
    if nbest is None:
        hyps = translate_texts(model, tokenizer, sources, search, progress=progress, **batching)
        lists = None
    else:
        lists = translate_texts_nbest(model, tokenizer, sources, search, nbest, progress=progress, **batching)
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
    if lists is not None:
        result["nbest"] = lists
    return result
