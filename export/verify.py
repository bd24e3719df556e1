"""Parity checks run at the end of every export (and reusable from tests and the bench).

Why: an export is only as good as its proof that the ONNX graphs compute what the checkpoint
computes. On real held-out sentences we check that (1) the physically pruned torch model equals the
gated one, (2) ORT's encoder outputs and per-step decoder logits equal torch's at several batch
sizes and source lengths, with in-graph beam reordering and shrinking batches exercised — and so does the decoder's
`alignment` output, where it has one (zoo.decoding.alignment's head-averaged cross-attention weights) — and (3)
the numpy/ORT runtime's greedy and beam search produce exactly the hypotheses of `zoo.decoding.generate`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from export.graph import ExportError, cross_caches
from export.runtime import ExportedModel, Search
from export.runtime.generation import best_tokens, search_batch, shaped
from export.runtime.search import truncate_sources
from zoo.data import TextTokenizer
from zoo.decoding.alignment import CrossAttentionWeights
from zoo.decoding.evaluation import translate_texts
from zoo.decoding.generate import generate
from zoo.model import Transformer


@contextlib.contextmanager
def ort_errors(which: str) -> Iterator[None]:
    """onnxruntime failing to load or run a graph is a failed verification, not a crash."""
    try:
        yield
    except ExportError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "onnxruntime":
            raise
        reason = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"verification failed: onnxruntime cannot run the exported {which} graphs: {reason}") from exc


def _pad(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out


def encode_pairs(
    tokenizer: TextTokenizer, srcs: Sequence[str], tgts: Sequence[str], max_positions: int, max_target_tokens: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Source ids as the runtime truncates them; target ids capped for teacher forcing."""
    src = truncate_sources(tokenizer.encode_sources(srcs), max_positions, tokenizer.unk_id)
    cap = min(max_target_tokens, max_positions - 1)
    tgt = [ids[: cap - 1] for ids in tokenizer.encode_targets(tgts)]
    return src, tgt


def _max_diff(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else a
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
    if a.shape != b.shape:
        raise ExportError(f"ORT output shape {a.shape} differs from torch's {b.shape}")
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0


@torch.no_grad()
def pruned_vs_gated(pruned: Transformer, gated: Transformer, src: torch.Tensor, tgt_in: torch.Tensor) -> float:
    """Max |logit difference| of the teacher-forced forward pass."""
    return _max_diff(pruned(src, tgt_in), gated(src, tgt_in))


@torch.no_grad()
def graph_parity(
    runtime: ExportedModel, model: Transformer, src: torch.Tensor, tgt_in: torch.Tensor, reorder: bool = True
) -> dict[str, float]:
    """ORT vs torch on one batch: encoder outputs, then teacher-forced decoder steps.

    With `reorder`, step 2 reverses the rows (beam reordering: the self caches' `history` plus host
    re-slicing of the cross caches) and step 4 drops the last row (a finished sentence leaving). The store
    starts with room for 2 positions, so later steps also exercise its growth. An export with an `alignment`
    output has it compared with torch's weights of the same layer ("alignment", max |difference|).
    """
    enc = runtime.encode(src.numpy(), with_memory=True)
    memory, pad = model.encode(src)
    diffs = {"encoder": _max_diff(enc["memory"], memory), "cross_cache_rel": 0.0}
    if not np.array_equal(enc["memory_pad_mask"], pad.numpy()):
        raise ExportError("ORT's memory_pad_mask differs from torch's")
    per_layer = cross_caches(model, memory, pad)
    for spec in runtime.manifest["caches"]:
        if spec["kind"] == "cross":
            # relative to the tensor's scale: running sums (MLK) grow with the source length
            ref = per_layer[spec["layer"]][spec["key"]]
            scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
            diffs["cross_cache_rel"] = max(diffs["cross_cache_rel"], _max_diff(enc[spec["name"]], ref) / scale)
    align = runtime.manifest.get("alignment")
    weights = CrossAttentionWeights(model, align["layer"]) if align and align["output"] else None
    step = runtime.stepper(enc, full=True, steps=2, alignments=weights is not None)
    state = model.init_state()
    rows = torch.arange(src.shape[0])
    logits_diff = lprobs_diff = align_diff = 0.0
    for t in range(tgt_in.shape[1]):
        if reorder and t in (2, 4) and rows.numel() > 1:
            order = torch.arange(rows.numel() - 1, -1, -1) if t == 2 else torch.arange(rows.numel() - 1)
            model.reorder_state(state, order)
            memory, pad, rows = memory[order], pad[order], rows[order]
            step.select(order.numpy())
        tokens = tgt_in[rows, t : t + 1]  # [N, 1]
        with contextlib.nullcontext() if weights is None else weights.recording(fed=1):
            ref = model.decode(tokens, memory, pad, state, t)[:, -1]  # [N, V]
        step(tokens[:, 0].numpy(), t, 1)
        assert step.logits is not None and step.log_probs is not None
        logits_diff = max(logits_diff, _max_diff(step.logits, ref))
        lprobs_diff = max(lprobs_diff, _max_diff(step.log_probs, torch.log_softmax(ref, -1)))
        if weights is not None:
            assert step.attention is not None and weights.last is not None
            align_diff = max(align_diff, _max_diff(step.attention, weights.last))  # [N, S]
    diffs.update(logits=logits_diff, log_probs=lprobs_diff)
    if weights is not None:
        diffs["alignment"] = align_diff
    return diffs


@torch.no_grad()
def shortlist_parity(runtime: ExportedModel, model: Transformer, src: torch.Tensor, tgt_in: torch.Tensor) -> float:
    """ORT's shortlist branch vs torch: teacher-forced decoder steps over every third token id (eos included),
    max |logit difference| against the same ids' logits of the full torch step."""
    cfg = model.cfg
    rows = np.union1d(np.arange(0, cfg.vocab_size, 3), [cfg.eos_id]).astype(np.int64)  # [C] sorted
    memory, pad = model.encode(src)
    state = model.init_state()
    step = runtime.stepper(runtime.encode(src.numpy()), full=True, steps=2, vocab_rows=rows)
    worst = 0.0
    for t in range(tgt_in.shape[1]):
        tokens = tgt_in[:, t : t + 1]  # [N, 1]
        ref = model.decode(tokens, memory, pad, state, t)[:, -1, torch.from_numpy(rows)]  # [N, C]
        step(tokens[:, 0].numpy(), t, 1)
        assert step.logits is not None
        worst = max(worst, _max_diff(step.logits, ref))
    return worst


def _shapes(src_ids: list[list[int]]) -> list[list[int]]:
    """Row subsets giving different batch sizes and padded lengths: all, a middle third, one short row."""
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    subsets = [list(range(len(src_ids)))]
    if len(order) >= 6:
        third = len(order) // 3
        subsets.append(order[third : 2 * third])
    subsets.append(order[:1])
    return subsets


def verify_export(
    runtime: ExportedModel,
    pruned: Transformer,
    gated: Transformer,
    tokenizer: TextTokenizer,
    srcs: Sequence[str],
    tgts: Sequence[str],
    search: Search,
    tolerance: float,
    max_target_tokens: int = 64,
    strict: bool = True,
) -> dict[str, Any]:
    """The export's parity report; raises ExportError when `strict` and anything is off."""
    if not srcs:
        raise ExportError("the checkpoint has no held-out sentences to verify the export on")
    src_ids, tgt_ids = encode_pairs(tokenizer, srcs, tgts, pruned.cfg.max_positions, max_target_tokens)
    cfg = pruned.cfg
    tgt_rows = [[cfg.bos_id, *t] for t in tgt_ids]
    report: dict[str, Any] = {"sentences": len(srcs), "tolerance": tolerance, "shapes": []}
    src_all, tgt_all = _pad(src_ids, cfg.pad_id), _pad(tgt_rows, cfg.pad_id)
    report["pruned_vs_gated"] = pruned_vs_gated(pruned, gated, src_all, tgt_all)
    worst = {"encoder": 0.0, "cross_cache_rel": 0.0, "logits": 0.0, "log_probs": 0.0}
    for subset in _shapes(src_ids):
        src = _pad([src_ids[i] for i in subset], cfg.pad_id)
        tgt = _pad([tgt_rows[i] for i in subset], cfg.pad_id)
        diffs = graph_parity(runtime, pruned, src, tgt)
        report["shapes"].append({"batch": src.shape[0], "src_len": src.shape[1], "steps": tgt.shape[1]})
        worst = {k: max(worst.get(k, 0.0), v) for k, v in diffs.items()}  # "alignment" where the export has it
    report.update({f"max_abs_{k}_diff": v for k, v in worst.items()})
    if "vocab_rows" in runtime.backend.decoder_inputs:  # the decoder's shortlist branch (exports since format 3)
        report["max_abs_shortlist_logits_diff"] = shortlist_parity(runtime, pruned, src_all, tgt_all)

    for label, s in (("beam", search), ("greedy", replace(search, beam_size=1))):
        ref = best_tokens(generate(gated, src_all, s))
        got = best_tokens(search_batch(runtime, src_all.numpy(), s))
        same = sum(a == b for a, b in zip(ref, got, strict=True))
        report[label] = {"beam_size": s.beam_size, "identical": same, "total": len(ref)}
    ref_text = shaped(
        translate_texts(
            gated, tokenizer, list(srcs), search, max_tokens=runtime.max_tokens, max_sentences=runtime.max_sentences
        ),
        lists=False,
    )
    got_text = runtime.translate(list(srcs), search)
    report["translate_identical"] = sum(a == b for a, b in zip(ref_text, got_text, strict=True))
    problems = []
    if report["pruned_vs_gated"] > tolerance:
        problems.append(f"pruned vs gated torch logits differ by {report['pruned_vs_gated']:.3g}")
    if max(worst["logits"], worst["encoder"], worst["cross_cache_rel"]) > tolerance:
        problems.append(
            f"ORT vs torch: max |Δlogits| {worst['logits']:.3g}, max |Δencoder states| "
            f"{worst['encoder']:.3g}, max relative |Δcross caches| {worst['cross_cache_rel']:.3g}"
        )
    if worst.get("alignment", 0.0) > tolerance:
        problems.append(f"ORT's alignment output vs torch's cross-attention weights: max |Δ| {worst['alignment']:.3g}")
    if report.get("max_abs_shortlist_logits_diff", 0.0) > tolerance:
        problems.append(f"ORT's shortlist branch vs torch: max |Δlogits| {report['max_abs_shortlist_logits_diff']:.3g}")
    for label in ("beam", "greedy"):
        if report[label]["identical"] != report[label]["total"]:
            problems.append(
                f"{label} search: {report[label]['identical']}/{report[label]['total']} hypotheses "
                "identical to zoo.decoding.generate"
            )
    if report["translate_identical"] != len(srcs):
        problems.append(f"translate(): {report['translate_identical']}/{len(srcs)} outputs identical")
    report["passed"] = not problems
    if problems and strict:
        raise ExportError(f"verification failed (tolerance {tolerance:g}): " + "; ".join(problems))
    report["problems"] = problems
    return report
