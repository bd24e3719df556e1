"""Encoding, length-bucketed token batching and collation into padded tensors.

Batches are capped by *padded* tokens rather than sentences (as in fairseq's ``--max-tokens``)
so memory use is flat across short and long sentences, and each epoch's batches are a pure
function of ``(seed, epoch)`` so a resumed run can regenerate epoch *e* and skip the batches it
already trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from export.runtime.tokenizer import TextTokenizer
from zoo.data.types import Example

log = logging.getLogger("zoo.data")

Pair = tuple[list[int], list[int]]


def encode_examples(
    examples: Sequence[Example],
    tokenizer: TextTokenizer,
    max_len: int | None,
    truncate: bool = False,
) -> tuple[list[Pair], int]:
    """Encode examples to ``(src_ids, tgt_ids)`` without bos/eos and drop over-long pairs.

    ``max_len`` bounds the sequences *the model sees*: ``len(src) <= max_len`` and
    ``len(tgt) + 1 <= max_len`` (the decoder input gets a bos, the output an eos), so a model
    with ``max_len`` positions never overflows. Pairs with an empty source are dropped too (an
    all-padding encoder row has nothing to attend to). With ``truncate=True`` over-long pairs
    are cut instead of dropped, e.g. to compute a loss over every validation pair. Returns the
    pairs and the number dropped.
    """
    srcs = tokenizer.encode_sources([ex.src for ex in examples])
    tgts = tokenizer.encode_targets([ex.tgt for ex in examples])
    pairs: list[Pair] = []
    too_long = empty = 0
    for src, tgt in zip(srcs, tgts, strict=True):
        if not src:
            empty += 1
            continue
        if max_len is not None and (len(src) > max_len or len(tgt) + 1 > max_len):
            if not truncate:
                too_long += 1
                continue
            src, tgt = src[:max_len], tgt[: max_len - 1]
        pairs.append((src, tgt))
    if too_long or empty:
        log.info(
            "encode_examples: dropped %d of %d pairs (%d longer than max_len=%s, %d empty source)",
            too_long + empty,
            len(examples),
            too_long,
            max_len,
            empty,
        )
    return pairs, too_long + empty


class TokenBatchSampler:
    """Length-bucketed batches of dataset indices capped by padded tokens.

    A batch's cost is ``batch_size * max(max src len, max tgt len + 1)`` (the target side
    counts its bos/eos), which is what padded tensors actually occupy. Examples are sorted by
    (target, source) length with seeded random tie-breaking, packed greedily, and the batch
    order is shuffled: all deterministic in ``(seed, epoch)``.

    Usable directly (``batches(epoch, rank, world_size)``) or as a ``DataLoader``
    ``batch_sampler`` (``set_epoch`` + iteration).
    """

    def __init__(
        self,
        src_lens: Sequence[int],
        tgt_lens: Sequence[int],
        max_tokens: int,
        max_sentences: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        remainder: Literal["drop", "pad"] = "drop",
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if len(src_lens) != len(tgt_lens):
            raise ValueError(f"{len(src_lens)} source lengths but {len(tgt_lens)} target lengths")
        if remainder not in ("drop", "pad"):
            raise ValueError(f"remainder must be 'drop' or 'pad', got {remainder!r}")
        self.src_lens = np.asarray(src_lens, dtype=np.int64)
        self.tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
        self.sizes = np.maximum(self.src_lens, self.tgt_lens + 1)
        if len(self.sizes) and int(self.sizes.max()) > max_tokens:
            worst = int(self.sizes.argmax())
            raise ValueError(
                f"example {worst} needs {int(self.sizes[worst])} padded tokens > max_tokens="
                f"{max_tokens}; raise max_tokens or lower data.max_len"
            )
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self.seed = seed
        self.remainder = remainder
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._cached: tuple[int, list[list[int]]] | None = None

    def __len__(self) -> int:
        return len(self.batches(self.epoch, self.rank, self.world_size))

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch, self.rank, self.world_size))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch that iteration yields (mirrors ``DistributedSampler.set_epoch``)."""
        self.epoch = epoch

    def _all_batches(self, epoch: int) -> list[list[int]]:
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        n = len(self.sizes)
        rng = np.random.default_rng([self.seed, epoch])
        tiebreak = rng.permutation(n) if self.shuffle else np.arange(n)
        order = np.lexsort((tiebreak, self.src_lens, self.tgt_lens))
        cap = self.max_sentences or n or 1
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for idx, size in zip(order.tolist(), self.sizes[order].tolist(), strict=True):
            new_longest = max(longest, size)
            if current and ((len(current) + 1) * new_longest > self.max_tokens or len(current) >= cap):
                batches.append(current)
                current, new_longest = [], size
            current.append(idx)
            longest = new_longest
        if current:
            batches.append(current)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cached = (epoch, batches)
        return batches

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
        """Batches (lists of dataset indices) for ``epoch`` on ``rank`` of ``world_size``.

        With one rank every index appears exactly once. With several, the epoch's batch list is
        trimmed (``remainder="drop"``; which batches fall off changes every epoch) or padded by
        repeating its first batches (``"pad"``) to a multiple of ``world_size``, and rank r
        takes every world_size-th batch, so all ranks get the same number of batches.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        batches = self._all_batches(epoch)
        extra = len(batches) % world_size
        if extra and self.remainder == "drop":
            batches = batches[: len(batches) - extra]
        elif extra:
            batches = batches + batches[: world_size - extra]
        return [list(b) for b in batches[rank::world_size]]


@dataclass
class Batch:
    """Padded tensors for one training step (right-padded with the pad id).

    ``tgt_in`` is bos + target (decoder input), ``tgt_out`` is target + eos (labels); both are
    ``[B, T]``. ``ntokens`` counts non-pad label tokens, the usual loss normaliser.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    ntokens: int

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Copy of the batch on ``device``."""
        return Batch(
            self.src.to(device, non_blocking=non_blocking),
            self.tgt_in.to(device, non_blocking=non_blocking),
            self.tgt_out.to(device, non_blocking=non_blocking),
            self.ntokens,
        )

    @property
    def nsentences(self) -> int:
        """Number of pairs in the batch."""
        return int(self.src.shape[0])


def collate(pairs: Sequence[Pair], pad_id: int, bos_id: int, eos_id: int) -> Batch:
    """Stack encoded pairs into a :class:`Batch`.

    The source is used as is (no bos/eos: the encoder input equals ``tokenizer.encode(text)``,
    which keeps generation and the exported ONNX encoder simple).
    """
    if not pairs:
        raise ValueError("cannot collate an empty batch")
    bsz = len(pairs)
    src_len = max(len(s) for s, _ in pairs)
    tgt_len = max(len(t) for _, t in pairs) + 1
    src = np.full((bsz, src_len), pad_id, dtype=np.int64)
    tgt_in = np.full((bsz, tgt_len), pad_id, dtype=np.int64)
    tgt_out = np.full((bsz, tgt_len), pad_id, dtype=np.int64)
    ntokens = 0
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s)] = s
        tgt_in[i, 0] = bos_id
        tgt_in[i, 1 : len(t) + 1] = t
        tgt_out[i, : len(t)] = t
        tgt_out[i, len(t)] = eos_id
        ntokens += len(t) + 1
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), ntokens)
