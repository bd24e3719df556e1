"""The zoo's models decode through the runtime's one search loop; this module is their `Step`, and teacher-forced
scoring.

`export/runtime/search_loop.py` owns greedy and beam search (numpy, over a `Step` that returns every live row's best
tokens). `TorchStep` is that step for a `Transformer`: it decodes on the model's device, takes the top k there and
hands [N, k] arrays to the loop — the loop synchronised with the host every step anyway — so the torch model and
the exported graph run the same search by construction (fairseq2's split of the step from the generator), and
their parity reduces to the parity of two steppers.

`use_cache=False` recomputes the whole prefix every step: it is the reference the cached path is tested against
(identical hypotheses), not a user-facing mode.

Scores, one definition everywhere (what fairseq and Marian report): a hypothesis' score is the sum of its
tokens' log-probabilities, eos included, divided by its length (tokens + eos) ** len_penalty. It is what beam
search ranks finished hypotheses by, what `generate_nbest` returns, and what `score_targets` computes for a given
target with the teacher-forced decoder — so scoring the beam's best hypothesis gives back its beam score, except
where the search forced eos at the length limit: there the search counts that eos as log-prob 0 (it had no
choice), the teacher-forced decoder counts the model's real log-prob of eos.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from export.runtime.search import (
    Hypothesis,
    Scored,
    Search,
    SearchError,
    check_num_hypotheses,
    check_targets,
    normalised,
    row_limits,
)
from export.runtime.search_loop import (
    SearchVocab,
    beam,
    beam_first_rows,
    check_prefixes,
    given_for,
    greedy,
    sample_rows,
    samples_by_sentence,
)
from zoo.alignment import CrossAttentionWeights
from zoo.model import Transformer

__all__ = ["TorchStep", "generate", "generate_nbest", "score_targets"]


class TorchStep:
    """The runtime search's `Step` over a zoo model: next-token log-probs of the live rows, cached or by full
    recompute, and their k best, on the model's device. With a vocabulary shortlist (`outside` [V]: True for the
    tokens it leaves out) those tokens get -inf before the softmax, so the others are normalised among themselves —
    what the exported graph computes by gathering their rows."""

    def __init__(
        self,
        model: Transformer,
        memory: Tensor,
        pad_mask: Tensor,
        use_cache: bool,
        outside: Tensor | None = None,
        alignment_layer: int | None = None,
    ) -> None:
        self.model, self.memory, self.pad_mask = model, memory, pad_mask  # [N, S, D], [N, S]
        self.state = model.init_state() if use_cache else None
        self.prefix: Tensor | None = None  # [N, t+1] tokens so far, kept only to recompute without a cache
        self.outside = outside
        # alignments (zoo/alignment.py): with `alignment_layer`, each call leaves that decoder layer's cross-attention
        # weights of the step, averaged over its kept heads, in `attention` [N, S] f32 (rows in the current order);
        # SearchError here for a layer the decoder lacks or a mechanism without such weights (linear, MLK)
        self.weights = None if alignment_layer is None else CrossAttentionWeights(model, alignment_layer)
        self.alignments = alignment_layer is not None  # the search loop then carries `attention` with hypotheses
        self.attention: np.ndarray | None = None

    def __call__(self, last: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """last [N] tokens at position t → every row's k best (log-prob [N, k] f32, token [N, k] int64),
        descending."""
        logits = self._logits(last, t)  # [N, V]
        best = torch.log_softmax(logits, dim=-1).topk(min(k, logits.shape[-1]), dim=-1)  # [N, k], sorted
        return best.values.cpu().numpy(), best.indices.cpu().numpy()

    def full(self, last: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray, None]:
        """last [N] tokens at position t → every row's (logits [N, V], log-probs [N, V]) on the host, -inf outside
        a shortlist (columns are token ids: None) — for the search's options that reshape a distribution."""
        logits = self._logits(last, t)  # [N, V]
        return logits.cpu().numpy(), torch.log_softmax(logits, dim=-1).cpu().numpy(), None

    def _logits(self, last: np.ndarray, t: int) -> Tensor:
        """last [N] tokens at position t → next-token logits [N, V] f32 (-inf outside a shortlist)."""
        tokens = torch.from_numpy(np.ascontiguousarray(last, dtype=np.int64)).to(self.memory.device)[:, None]  # [N, 1]
        fed = 1 if self.state is not None else t + 1  # query positions per row of this decoder call
        with contextlib.nullcontext() if self.weights is None else self.weights.recording(fed):
            if self.state is not None:
                logits = self.model.decode(tokens, self.memory, self.pad_mask, self.state, t)
            else:
                self.prefix = tokens if self.prefix is None else torch.cat([self.prefix, tokens], dim=1)  # [N, t+1]
                logits = self.model.decode(self.prefix, self.memory, self.pad_mask)
        if self.weights is not None and self.weights.last is not None:
            self.attention = self.weights.last.cpu().numpy()  # [N, S]
        logits = logits[:, -1].float()  # [N, V]
        if self.outside is not None:
            logits = logits.masked_fill(self.outside, -torch.inf)
        return logits

    def select(self, rows: np.ndarray) -> None:
        """Continue from these rows of the last step: of the memory, the cache or prefix (beam reordering,
        finished sentences leaving)."""
        order = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(self.memory.device)  # [N']
        self.memory = self.memory.index_select(0, order)
        self.pad_mask = self.pad_mask.index_select(0, order)
        if self.state is not None:
            self.model.reorder_state(self.state, order)
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, order)


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


@torch.inference_mode()
def _search(
    model: Transformer,
    src: Tensor,
    cfg: Search,
    use_cache: bool,
    vocab_rows: Tensor | None,
    n: int = 1,
    prefixes: Sequence[Sequence[int]] | None = None,
    keys: Sequence[int] | None = None,
    alignment_layer: int | None = None,
) -> list[list[Hypothesis]]:
    """Every finished hypothesis per sentence of src [B, S], best first: the runtime's greedy (one each; with
    sampling, `n` draws each) when beam_size <= 1, else its beam search — over a `TorchStep`. `prefixes`: each
    sentence's given first output tokens; `keys`: each sentence's sampling key (default: its row);
    `alignment_layer`: hypotheses carry alignments from that decoder layer's cross-attention (zoo/alignment.py)."""
    mcfg = model.cfg
    vocab = SearchVocab(mcfg.vocab_size, mcfg.pad_id, mcfg.bos_id, mcfg.eos_id)
    limits = row_limits(src.ne(mcfg.pad_id).sum(1).cpu().numpy(), cfg, mcfg.max_positions)
    if prefixes is not None:
        check_prefixes(prefixes, limits, vocab)
    outside = _outside(model, cfg, vocab_rows, src.device)
    memory, pad_mask = model.encode(src)  # [B, S, D], [B, S]
    if cfg.sampling:
        rows, row_keys = sample_rows(src.shape[0], n, keys)
        given = given_for(len(rows), cfg, None if prefixes is None else [prefixes[i] for i in rows], row_keys)
        index = torch.from_numpy(rows).to(src.device)
        step = TorchStep(
            model, memory.index_select(0, index), pad_mask.index_select(0, index), use_cache, outside, alignment_layer
        )
        return samples_by_sentence(greedy(step, limits.take(rows), cfg, vocab, given), n)
    given = given_for(src.shape[0], cfg, prefixes)
    if cfg.beam_size <= 1:
        step = TorchStep(model, memory, pad_mask, use_cache, outside, alignment_layer)
        return [[h] for h in greedy(step, limits, cfg, vocab, given)]
    width = mcfg.vocab_size if outside is None else int((~outside).sum())  # tokens a step may produce
    g = beam_first_rows(cfg.beam_size, width)  # rows per sentence of the first step
    rows = torch.arange(src.shape[0], device=src.device).repeat_interleave(g)  # [B*g]
    step = TorchStep(
        model, memory.index_select(0, rows), pad_mask.index_select(0, rows), use_cache, outside, alignment_layer
    )
    return beam(step, g, limits, cfg, vocab, given)


def generate(
    model: Transformer,
    src: Tensor,
    cfg: Search = Search(),
    use_cache: bool = True,
    vocab_rows: Tensor | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[int]]:
    """The best hypothesis' token ids per sentence of src [B, S] (no bos/eos): greedy when beam_size == 1, else
    beam search (`vocab_rows`: a shortlist's token ids [C], with cfg.shortlist; eos always allowed; `prefixes`:
    per sentence the token ids its output starts with, included in the output)."""
    return [hyps[0].tokens if hyps else [] for hyps in _search(model, src, cfg, use_cache, vocab_rows, 1, prefixes)]


def generate_nbest(
    model: Transformer,
    src: Tensor,
    cfg: Search = Search(),
    num_hypotheses: int = 1,
    use_cache: bool = True,
    vocab_rows: Tensor | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    keys: Sequence[int] | None = None,
    alignment_layer: int | None = None,
) -> list[list[Hypothesis]]:
    """The `num_hypotheses` best hypotheses per source of src [B, S] with their scores, best first (greedy when
    beam_size == 1: its one hypothesis; with sampling, that many draws, `keys`: each source's sampling key). The
    first is always `generate`'s output. Fewer than asked only when the search finished fewer: a length limit of
    1 token leaves the empty hypothesis alone. `alignment_layer`: each hypothesis carries its alignment. SearchError
    unless num_hypotheses is an integer 1 … most_hypotheses."""
    n = check_num_hypotheses(num_hypotheses, cfg.most_hypotheses, bool(cfg.sampling))
    found = _search(model, src, cfg, use_cache, vocab_rows, n, prefixes, keys, alignment_layer)
    return [hyps[:n] for hyps in found]


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
