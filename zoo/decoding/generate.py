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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from export.runtime.generation import search_batch
from export.runtime.search import (
    DEFAULT_MAX_SENTENCES,
    DEFAULT_MAX_TOKENS,
    Hypothesis,
    Scored,
    Search,
    SearchError,
    check_targets,
    normalised,
)
from export.runtime.search_loop import SearchVocab
from export.runtime.tokenizer import TextTokenizer
from zoo.decoding.alignment import CrossAttentionWeights, check_alignments
from zoo.model import Transformer

__all__ = ["TorchEngine", "TorchStep", "generate", "score_targets"]
T = TypeVar("T")


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
        # alignments (zoo/decoding/alignment.py): with `alignment_layer`, each call leaves that decoder layer's
        # cross-attention
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

    @torch.inference_mode()  # the step's own: whoever drives it, no autograd graph is built
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

    @torch.inference_mode()
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


class TorchEngine:
    """A zoo model as the runtime's decoding driver's engine (export/runtime/generation.py): the driver batches,
    checks and searches; this says how a batch is encoded and stepped. `use_cache=False`: the reference full
    recompute; `vocab_rows`: a shortlist's token ids [C] for searches with shortlist=1; `alignment_layer`: the
    decoder layer alignments come from (None: zoo/decoding/alignment.py's default); `progress`: a bar over the
    batches."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: TextTokenizer | None = None,
        use_cache: bool = True,
        vocab_rows: Tensor | None = None,
        alignment_layer: int | None = None,
        progress: bool = False,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_sentences: int = DEFAULT_MAX_SENTENCES,
    ) -> None:
        mcfg = model.cfg
        self.model, self.tokenizer, self.use_cache, self.vocab_rows = model, tokenizer, use_cache, vocab_rows
        self.alignment_layer, self.progress = alignment_layer, progress
        self.vocab = SearchVocab(mcfg.vocab_size, mcfg.pad_id, mcfg.bos_id, mcfg.eos_id)
        self.max_positions: int = mcfg.max_positions
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.device = next(model.parameters()).device
        model.eval()  # an engine decodes: no dropout (a trainer sets train() again after validating)

    @torch.inference_mode()
    def open(self, src: np.ndarray, search: Search) -> _TorchBatch:
        tokens = torch.from_numpy(np.ascontiguousarray(src, dtype=np.int64)).to(self.device)  # [B, S]
        memory, pad_mask = self.model.encode(tokens)  # [B, S, D], [B, S]
        layer = check_alignments(self.model, self.alignment_layer) if search.return_alignments else None
        return _TorchBatch(self, memory, pad_mask, self._outside(search), layer)

    def _outside(self, search: Search) -> Tensor | None:
        """[V] True at the tokens a shortlisted search may not produce: all but `vocab_rows` and eos; None without
        a shortlist. SearchError when shortlist=1 comes without the token ids."""
        if not search.shortlist:
            return None
        if self.vocab_rows is None:
            raise SearchError("shortlist=1: give the shortlist's token ids (vocab_rows) to the torch search")
        outside = torch.ones(self.vocab.size, dtype=torch.bool, device=self.device)
        outside[self.vocab_rows.to(self.device)] = False
        outside[self.vocab.eos_id] = False
        return outside

    def map(self, run: Callable[[TorchEngine, list[int]], T], batches: list[list[int]]) -> Iterator[T]:
        shown = tqdm(batches, desc="decode", unit="batch", leave=False) if self.progress else batches
        return (run(self, idx) for idx in shown)

    def check_alignments(self) -> None:
        check_alignments(self.model, self.alignment_layer)

    def teacher_forced(self, src: np.ndarray, targets: list[list[int]], len_penalty: float) -> list[Scored]:
        tokens = torch.from_numpy(np.ascontiguousarray(src, dtype=np.int64)).to(self.device)  # [B, S]
        return score_targets(self.model, tokens, targets, len_penalty)


class _TorchBatch:
    """A batch encoded once for one search; each `step` a `TorchStep` over some of its rows."""

    def __init__(
        self, engine: TorchEngine, memory: Tensor, pad_mask: Tensor, outside: Tensor | None, layer: int | None
    ) -> None:
        self.engine, self.memory, self.pad_mask, self.outside, self.layer = engine, memory, pad_mask, outside, layer
        self.width = engine.vocab.size if outside is None else int((~outside).sum())  # tokens a step may produce

    def step(self, rows: np.ndarray, steps: int, slots: int) -> TorchStep:
        index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(self.memory.device)  # [N]
        memory, pad_mask = self.memory.index_select(0, index), self.pad_mask.index_select(0, index)
        return TorchStep(self.engine.model, memory, pad_mask, self.engine.use_cache, self.outside, self.layer)


def generate(
    model: Transformer,
    src: Tensor,
    search: Search = Search(),
    prefixes: Sequence[Sequence[int]] | None = None,
    **engine: Any,
) -> list[list[Hypothesis]]:
    """Per sentence of src [B, S] its `search.num_hypotheses` best hypotheses, best first — the runtime driver's
    `search_batch` over this model (`prefixes`: per sentence its given first output tokens, unchecked; `engine`:
    TorchEngine's options, e.g. use_cache=False, vocab_rows=…)."""
    return search_batch(TorchEngine(model, **engine), src.cpu().numpy(), search, prefixes=prefixes)


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
