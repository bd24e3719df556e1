"""Batched greedy and beam search over the incremental decoder cache.

`use_cache=False` recomputes the whole prefix every step through the same search code: it is the
reference the cached path is tested against (identical hypotheses), not a user-facing mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from zoo.model import Transformer


@dataclass(frozen=True)
class SearchConfig:
    beam_size: int = 5
    len_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1

    @classmethod
    def from_generation(cls, g: Mapping[str, Any]) -> SearchConfig:
        """The one conversion of a config's `generation` node (train, evaluate, export) into search settings;
        keys the node lacks (train/evaluate have no `min_len`) keep their defaults."""
        return cls(
            beam_size=int(g["beam_size"]),
            len_penalty=float(g["len_penalty"]),
            max_len_a=float(g["max_len_a"]),
            max_len_b=int(g["max_len_b"]),
            min_len=int(g.get("min_len", cls.min_len)),
        )


class _Stepper:
    """Produces next-token log-probs for the live hypotheses, cached or by full recompute."""

    def __init__(self, model: Transformer, memory: Tensor, pad_mask: Tensor, use_cache: bool) -> None:
        self.model, self.memory, self.pad_mask = model, memory, pad_mask
        self.state = model.init_state() if use_cache else None

    def __call__(self, tokens: Tensor) -> Tensor:
        # tokens [N, t] (bos + generated so far) -> log-probs [N, V] for position t
        if self.state is not None:
            logits = self.model.decode(tokens[:, -1:], self.memory, self.pad_mask, self.state, tokens.shape[1] - 1)
        else:
            logits = self.model.decode(tokens, self.memory, self.pad_mask)
        return torch.log_softmax(logits[:, -1].float(), dim=-1)

    def select(self, order: Tensor) -> None:
        """Keep rows `order` of the memory and of the cache (beam reordering / dropping finished)."""
        self.memory = self.memory.index_select(0, order)
        self.pad_mask = self.pad_mask.index_select(0, order)
        if self.state is not None:
            self.model.reorder_state(self.state, order)


def _max_lengths(src: Tensor, pad_id: int, cfg: SearchConfig, limit: int) -> Tensor:
    src_len = src.ne(pad_id).sum(1)
    return (cfg.max_len_a * src_len + cfg.max_len_b).long().clamp(min=1, max=limit - 1)  # [B]


@torch.inference_mode()
def greedy_search(
    model: Transformer, src: Tensor, cfg: SearchConfig = SearchConfig(), use_cache: bool = True
) -> list[list[int]]:
    """Argmax decoding; returns token ids per source sentence (no bos/eos)."""
    mcfg = model.cfg
    memory, pad_mask = model.encode(src)
    step = _Stepper(model, memory, pad_mask, use_cache)
    b = src.shape[0]
    max_len = _max_lengths(src, mcfg.pad_id, cfg, mcfg.max_positions)  # [B]
    tokens = torch.full((b, 1), mcfg.bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)
    for t in range(int(max_len.max())):
        lprobs = step(tokens)
        lprobs[:, [mcfg.pad_id, mcfg.bos_id]] = -torch.inf
        if t < cfg.min_len:
            lprobs[:, mcfg.eos_id] = -torch.inf
        at_limit = max_len.le(t + 1)
        lprobs[at_limit] = torch.where(torch.arange(lprobs.shape[1], device=src.device) == mcfg.eos_id, 0.0, -torch.inf)
        nxt = lprobs.argmax(-1).masked_fill(finished, mcfg.pad_id)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        finished |= nxt.eq(mcfg.eos_id)
        if finished.all():
            break
    return [_strip(row[1:].tolist(), mcfg.eos_id, mcfg.pad_id) for row in tokens]


def _strip(ids: list[int], eos: int, pad: int) -> list[int]:
    out = []
    for i in ids:
        if i in (eos, pad):
            break
        out.append(i)
    return out


@torch.inference_mode()
def beam_search(
    model: Transformer, src: Tensor, cfg: SearchConfig = SearchConfig(), use_cache: bool = True
) -> list[list[int]]:
    """Batched beam search with length-normalised scores (score / length**len_penalty, length
    counting eos, as fairseq). A sentence stops when `beam_size` hypotheses have finished;
    finished sentences leave the batch, so their cache rows stop costing time."""
    mcfg = model.cfg
    k = cfg.beam_size
    device = src.device
    b = src.shape[0]
    memory, pad_mask = model.encode(src)
    expand = torch.arange(b, device=device).repeat_interleave(k)  # [B*K]
    step = _Stepper(model, memory.index_select(0, expand), pad_mask.index_select(0, expand), use_cache)
    max_len = _max_lengths(src, mcfg.pad_id, cfg, mcfg.max_positions)  # [B]

    active = torch.arange(b, device=device)  # original sentence ids still searching
    tokens = torch.full((b * k, 1), mcfg.bos_id, dtype=torch.long, device=device)
    scores = torch.full((b, k), -torch.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step yields distinct ones
    finals: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]

    for t in range(int(max_len.max())):
        n = active.numel()
        lprobs = step(tokens)  # [n*K, V]
        vocab = lprobs.shape[1]
        lprobs[:, [mcfg.pad_id, mcfg.bos_id]] = -torch.inf
        if t < cfg.min_len:
            lprobs[:, mcfg.eos_id] = -torch.inf
        at_limit = max_len[active].le(t + 1).repeat_interleave(k)  # [n*K]
        if at_limit.any():
            forced = torch.full((vocab,), -torch.inf, device=device)
            forced[mcfg.eos_id] = 0.0
            lprobs[at_limit] = forced
        cand = (scores.view(-1, 1) + lprobs).view(n, k * vocab)
        top_scores, top_idx = cand.topk(2 * k, dim=1)  # [n, 2K], sorted
        beam_idx = top_idx // vocab
        token_idx = top_idx % vocab
        is_eos = token_idx.eq(mcfg.eos_id) & top_scores.gt(-torch.inf)

        done = torch.zeros(n, dtype=torch.bool, device=device)
        if is_eos.any():
            norm = float(t + 1) ** cfg.len_penalty
            rows, cols = is_eos.nonzero(as_tuple=True)
            prefix = tokens.view(n, k, -1)
            for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
                bucket = finals[int(active[r])]
                if len(bucket) < k and c < k:  # only eos among the top K counts, as fairseq
                    hyp = prefix[r, beam_idx[r, c], 1:].tolist()
                    bucket.append((float(top_scores[r, c]) / norm, hyp))
            done = torch.tensor([len(finals[int(s)]) >= k for s in active.tolist()], device=device)

        # continue with the best K non-eos candidates of every live sentence
        rank = torch.arange(2 * k, device=device).expand(n, -1) + is_eos.long() * (2 * k)
        keep = rank.argsort(dim=1)[:, :k]  # [n, K] positions of the K best non-eos candidates
        new_scores = top_scores.gather(1, keep)
        new_beams = beam_idx.gather(1, keep)
        new_tokens = token_idx.gather(1, keep)
        live = (~done).nonzero(as_tuple=True)[0]
        if live.numel() == 0:
            break
        rows = (live[:, None] * k + new_beams[live]).view(-1)  # rows of tokens/cache to continue
        tokens = torch.cat([tokens.index_select(0, rows), new_tokens[live].view(-1, 1)], dim=1)
        scores = new_scores[live]
        active = active[live]
        step.select(rows)

    out = []
    for i in range(b):
        if not finals[i]:
            out.append([])
            continue
        best = max(finals[i], key=lambda item: item[0])  # first max wins ties: deterministic
        out.append(_strip(best[1], mcfg.eos_id, mcfg.pad_id))
    return out


def generate(
    model: Transformer, src: Tensor, cfg: SearchConfig = SearchConfig(), use_cache: bool = True
) -> list[list[int]]:
    """Greedy when beam_size == 1, else beam search."""
    if cfg.beam_size <= 1:
        return greedy_search(model, src, cfg, use_cache)
    return beam_search(model, src, cfg, use_cache)
