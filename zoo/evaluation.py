"""Decode a list of texts with a model and score them — shared by training, `zoo.evaluate`,
`zoo.translate` and the Python API, so every number comes from the same generator."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from zoo.data import Example, Tokenizer
from zoo.data import remove_bpe as strip_bpe
from zoo.generate import SearchConfig, generate
from zoo.metrics import quality_report, tokenized_bleu
from zoo.model import Transformer


def _batches(lengths: Sequence[int], max_tokens: int, max_sentences: int) -> list[list[int]]:
    """Indices grouped by similar length (longest first), each group ≤ max_tokens padded source
    tokens and ≤ max_sentences sentences: padding is what makes beam search slow on CPU."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current, longest = [], [], 0
    for i in order:
        width = max(longest, lengths[i])
        if current and (width * (len(current) + 1) > max_tokens or len(current) >= max_sentences):
            batches.append(current)
            current, width = [], lengths[i]
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


@torch.inference_mode()
def translate_texts(
    model: Transformer,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    search: SearchConfig = SearchConfig(),
    max_tokens: int = 6000,
    max_sentences: int = 128,
    progress: bool = False,
) -> list[str]:
    """Source strings → output strings, in input order. Inputs longer than the model's position
    limit are truncated (the generator also needs room for the output)."""
    model.eval()
    device = next(model.parameters()).device
    limit = max(1, model.cfg.max_positions // 2)
    encoded = [tokenizer.encode(t)[:limit] or [tokenizer.unk_id] for t in texts]
    outputs: list[str] = [""] * len(texts)
    batches = _batches([len(e) for e in encoded], max_tokens, max_sentences)
    iterator = batches
    if progress:
        iterator = tqdm(batches, desc="decode", unit="batch", leave=False)
    for idx in iterator:
        width = max(len(encoded[i]) for i in idx)
        src = torch.full((len(idx), width), model.cfg.pad_id, dtype=torch.long)
        for row, i in enumerate(idx):
            src[row, : len(encoded[i])] = torch.tensor(encoded[i])
        hyps = generate(model, src.to(device), search)
        for i, hyp in zip(idx, hyps, strict=True):
            outputs[i] = tokenizer.decode(hyp)
    return outputs


def evaluate_examples(
    model: Transformer,
    tokenizer: Tokenizer,
    examples: Sequence[Example],
    task: str,
    search: SearchConfig = SearchConfig(),
    remove_bpe: str | None = None,
    progress: bool = False,
    **batching: Any,
) -> dict[str, Any]:
    """Metrics (+ per data source), hypotheses and decoding speed on `examples`."""
    start = time.perf_counter()
    hyps = translate_texts(model, tokenizer, [e.src for e in examples], search, progress=progress, **batching)
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
    return {"metrics": report, "hypotheses": hyps}
