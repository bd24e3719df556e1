"""Batched greedy and beam search over the incremental decoder cache, and teacher-forced scoring.

`use_cache=False` recomputes the whole prefix every step through the same search code: it is the
reference the cached path is tested against (identical hypotheses), not a user-facing mode.

Scores, one definition everywhere (what fairseq and Marian report): a hypothesis' score is the sum of its
tokens' log-probabilities, eos included, divided by its length (tokens + eos) ** len_penalty. It is what beam
search ranks finished hypotheses by, what `generate_nbest` returns, and what `score_targets` computes for a given
target with the teacher-forced decoder — so scoring the beam's best hypothesis gives back its beam score, except
where the search forced eos at the length limit: there the search counts that eos as log-prob 0 (it had no
choice), the teacher-forced decoder counts the model's real log-prob of eos. `export.runtime` mirrors all of this
without torch, to 1e-4.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from export.runtime.search import (
    Hypothesis,
    Scored,
    ScoreError,
    Search,
    SearchError,
    check_num_hypotheses,
    check_targets,
    greedy_hypotheses,
    max_lengths,
    never_emitted,
    normalised,
    strip,
)
from zoo.model import Transformer

# The search's settings, results, errors and helpers are the torch-free runtime's (export/runtime/search.py): one
# class each for both engines, so an `except SearchError` catches either engine's, and a Search is checked once.
__all__ = [
    "Hypothesis",
    "ScoreError",
    "Scored",
    "Search",
    "SearchError",
    "beam_search",
    "check_num_hypotheses",
    "check_targets",
    "generate",
    "generate_nbest",
    "greedy_search",
    "score_targets",
]


class _Stepper:
    """Produces next-token log-probs for the live hypotheses, cached or by full recompute; with a vocabulary
    shortlist (`outside` [V]: True for the tokens it leaves out) those tokens get -inf before the softmax, so the
    others are normalised among themselves — what the runtime's shortlist computes by gathering their rows."""

    def __init__(
        self, model: Transformer, memory: Tensor, pad_mask: Tensor, use_cache: bool, outside: Tensor | None = None
    ) -> None:
        self.model, self.memory, self.pad_mask = model, memory, pad_mask
        self.state = model.init_state() if use_cache else None
        self.outside = outside

    def __call__(self, tokens: Tensor) -> Tensor:
        # tokens [N, t] (bos + generated so far) -> log-probs [N, V] for position t
        if self.state is not None:
            logits = self.model.decode(tokens[:, -1:], self.memory, self.pad_mask, self.state, tokens.shape[1] - 1)
        else:
            logits = self.model.decode(tokens, self.memory, self.pad_mask)
        logits = logits[:, -1].float()  # [N, V]
        if self.outside is not None:
            logits = logits.masked_fill(self.outside, -torch.inf)
        return torch.log_softmax(logits, dim=-1)

    def select(self, order: Tensor) -> None:
        """Keep rows `order` of the memory and of the cache (beam reordering / dropping finished)."""
        self.memory = self.memory.index_select(0, order)
        self.pad_mask = self.pad_mask.index_select(0, order)
        if self.state is not None:
            self.model.reorder_state(self.state, order)


def _outside(model: Transformer, cfg: Search, vocab_rows: Tensor | None, device: torch.device) -> Tensor | None:
    """[V] True at the tokens a shortlisted search (`cfg.shortlist`) may not produce: all but `vocab_rows` and
    eos; None without a shortlist. SearchError when shortlist=1 comes without the token ids."""
    if not cfg.shortlist:
        return None
    if vocab_rows is None:
        raise SearchError("shortlist=1: give the shortlist's token ids (vocab_rows) to the torch search")
    outside = torch.ones(model.cfg.vocab_size, dtype=torch.bool, device=device)
    outside[vocab_rows.to(device)] = False
    outside[model.cfg.eos_id] = False
    return outside


def _max_lengths(src: Tensor, pad_id: int, cfg: Search, limit: int) -> Tensor:
    """Per-sentence output limits [B] of src [B, S]: the runtime's `max_lengths`, on src's device."""
    lengths = src.ne(pad_id).sum(1).cpu().numpy()  # [B]
    return torch.from_numpy(max_lengths(lengths, cfg, limit)).to(src.device)


def greedy_search(
    model: Transformer,
    src: Tensor,
    cfg: Search = Search(),
    use_cache: bool = True,
    vocab_rows: Tensor | None = None,
) -> list[list[int]]:
    """Argmax decoding; returns token ids per source sentence (no bos/eos). `vocab_rows`: with cfg.shortlist, the
    token ids [C] the search may produce (eos always)."""
    return [h.tokens for h in _greedy(model, src, cfg, use_cache, vocab_rows)]


@torch.inference_mode()
def _greedy(
    model: Transformer, src: Tensor, cfg: Search, use_cache: bool, vocab_rows: Tensor | None = None
) -> list[Hypothesis]:
    """Argmax decoding of src [B, S]: one hypothesis per sentence, scored as beam search scores."""
    mcfg = model.cfg
    memory, pad_mask = model.encode(src)
    step = _Stepper(model, memory, pad_mask, use_cache, _outside(model, cfg, vocab_rows, src.device))
    b = src.shape[0]
    max_len = _max_lengths(src, mcfg.pad_id, cfg, mcfg.max_positions)  # [B]
    tokens = torch.full((b, 1), mcfg.bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)
    total = torch.zeros(b, device=src.device)  # [B] summed log-probs of the emitted tokens, eos included
    for t in range(int(max_len.max())):
        lprobs = step(tokens)
        lprobs[:, never_emitted(mcfg.pad_id, mcfg.bos_id, mcfg.eos_id)] = -torch.inf
        if t < cfg.min_len:
            lprobs[:, mcfg.eos_id] = -torch.inf
        at_limit = max_len.le(t + 1)
        lprobs[at_limit] = torch.where(torch.arange(lprobs.shape[1], device=src.device) == mcfg.eos_id, 0.0, -torch.inf)
        nxt = lprobs.argmax(-1)  # [B]
        total += lprobs.gather(1, nxt[:, None]).squeeze(1).masked_fill(finished, 0.0)
        nxt = nxt.masked_fill(finished, mcfg.pad_id)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        finished |= nxt.eq(mcfg.eos_id)
        if finished.all():
            break
    return greedy_hypotheses(tokens.tolist(), total.tolist(), cfg.len_penalty, mcfg.eos_id, mcfg.pad_id)


def beam_search(
    model: Transformer,
    src: Tensor,
    cfg: Search = Search(),
    use_cache: bool = True,
    vocab_rows: Tensor | None = None,
) -> list[list[int]]:
    """Batched beam search; the best hypothesis' token ids per source sentence (no bos/eos)."""
    return [hyps[0].tokens if hyps else [] for hyps in _beam(model, src, cfg, use_cache, vocab_rows)]


@torch.inference_mode()
def _beam(
    model: Transformer, src: Tensor, cfg: Search, use_cache: bool, vocab_rows: Tensor | None = None
) -> list[list[Hypothesis]]:
    """Batched beam search of src [B, S] with length-normalised scores (score / length**len_penalty, length
    counting eos, as fairseq). A sentence stops when `beam_size` hypotheses have finished; finished
    sentences leave the batch, so their cache rows stop costing time. Returns every finished hypothesis
    per sentence (beam_size of them; fewer only when the length limit is 1 token), best first — the
    first finished wins ties, so the first is the single best today's callers have always got."""
    mcfg = model.cfg
    k = cfg.beam_size
    device = src.device
    b = src.shape[0]
    memory, pad_mask = model.encode(src)
    expand = torch.arange(b, device=device).repeat_interleave(k)  # [B*K]
    outside = _outside(model, cfg, vocab_rows, device)
    step = _Stepper(model, memory.index_select(0, expand), pad_mask.index_select(0, expand), use_cache, outside)
    max_len = _max_lengths(src, mcfg.pad_id, cfg, mcfg.max_positions)  # [B]

    active = torch.arange(b, device=device)  # original sentence ids still searching
    tokens = torch.full((b * k, 1), mcfg.bos_id, dtype=torch.long, device=device)
    scores = torch.full((b, k), -torch.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step yields distinct ones
    finals: list[list[Hypothesis]] = [[] for _ in range(b)]

    for t in range(int(max_len.max())):
        n = active.numel()
        lprobs = step(tokens)  # [n*K, V]
        vocab = lprobs.shape[1]
        lprobs[:, never_emitted(mcfg.pad_id, mcfg.bos_id, mcfg.eos_id)] = -torch.inf
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
                    bucket.append(Hypothesis(strip(hyp, mcfg.eos_id, mcfg.pad_id), float(top_scores[r, c]) / norm))
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

    return [sorted(bucket, key=lambda h: -h.score) for bucket in finals]  # stable: first finished wins ties


def generate(
    model: Transformer,
    src: Tensor,
    cfg: Search = Search(),
    use_cache: bool = True,
    vocab_rows: Tensor | None = None,
) -> list[list[int]]:
    """Greedy when beam_size == 1, else beam search (`vocab_rows`: a shortlist's token ids, with cfg.shortlist)."""
    if cfg.beam_size <= 1:
        return greedy_search(model, src, cfg, use_cache, vocab_rows)
    return beam_search(model, src, cfg, use_cache, vocab_rows)


def generate_nbest(
    model: Transformer,
    src: Tensor,
    cfg: Search = Search(),
    num_hypotheses: int = 1,
    use_cache: bool = True,
    vocab_rows: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """The `num_hypotheses` best hypotheses per source of src [B, S] with their scores, best first (greedy when
    beam_size == 1: its one hypothesis). The first is always `generate`'s output. Fewer than asked only when
    the search finished fewer: a length limit of 1 token leaves the empty hypothesis alone. SearchError unless
    num_hypotheses is an integer 1 … beam_size."""
    n = check_num_hypotheses(num_hypotheses, max(1, cfg.beam_size))
    if cfg.beam_size <= 1:
        return [[h] for h in _greedy(model, src, cfg, use_cache, vocab_rows)]
    return [hyps[:n] for hyps in _beam(model, src, cfg, use_cache, vocab_rows)]


@torch.inference_mode()
def score_targets(
    model: Transformer, src: Tensor, targets: Sequence[Sequence[int]], len_penalty: float = 1.0
) -> list[Scored]:
    """Teacher-forced log-probabilities of `targets` (token ids without bos/eos, one per row of src [B, S]):
    per token (each target token, then eos) and the sentence score normalised as beam search ranks
    hypotheses (module docstring). Nothing is banned or forced here: these are the model's probabilities.
    ScoreError when the counts differ, a target is longer than the model can produce (max_positions - 2
    tokens + eos: the search's own limit) or holds an id outside the vocabulary."""
    mcfg = model.cfg
    check_targets(targets, src.shape[0], mcfg.vocab_size, mcfg.max_positions)
    if not targets:
        return []
    lengths = [len(t) + 1 for t in targets]  # scored positions: tokens + eos
    b, width = len(targets), max(lengths)
    tgt_in = torch.full((b, width), mcfg.pad_id, dtype=torch.long)  # [B, T]: bos + target
    tgt_out = torch.full((b, width), mcfg.pad_id, dtype=torch.long)  # [B, T]: target + eos
    for row, ids in enumerate(targets):
        tgt_in[row, : lengths[row]] = torch.tensor([mcfg.bos_id, *ids])
        tgt_out[row, : lengths[row]] = torch.tensor([*ids, mcfg.eos_id])
    tgt_in, tgt_out = tgt_in.to(src.device), tgt_out.to(src.device)
    logits = model(src, tgt_in)  # [B, T, V]; causal, so the padding after a target changes nothing before it
    lprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt_out[..., None]).squeeze(-1)  # [B, T]
    out = []
    for row, length in enumerate(lengths):
        token_lp = lprobs[row, :length]
        total = float(token_lp.sum())
        out.append(Scored(tgt_out[row, :length].tolist(), token_lp.tolist(), normalised(total, length, len_penalty)))
    return out
