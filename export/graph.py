"""Torch modules that present a `Transformer` as the two graphs the ONNX runtime runs.

Why wrappers: the model's incremental API passes a list of per-layer dicts of tensors whose names
and shapes belong to each attention mechanism (MHA caches "k"/"v" [B, H, T, dh]; MGK several key
sets; MLK running sums with no position axis). An ONNX graph needs a flat, ordered list of named
tensors instead, so the layout is *discovered* by running one torch decoding step and recorded as
`CacheSpec`s — nothing here knows which tensors a mechanism caches.

Graph I/O (names are stable and go into manifest.json; `Lk.self.<name>` / `Lk.cross.<name>`):

encoder.onnx
    in   src_tokens       int64 [batch, src_len]
    out  memory           f32   [batch, src_len, d_model]   (encoder states; not needed by the decoder)
         memory_pad_mask  bool  [batch, src_len]            True at source padding
         Lk.cross.<name>  f32   per mechanism, batch first  (cross-attention cache, computed once)
decoder.onnx (one incremental step, every step)
    in   tokens           int64 [batch, 1]                  last token of every live hypothesis
         step             int64 [1]                         its position (0 = bos), indexes the positions table
         history          int64 [batch, steps]              row i's cell of every earlier position (see below)
         topk             int64 [1]                         how many best tokens per row to return (k)
         vocab_rows       int64 [candidates]                exports with a vocabulary shortlist: sorted token
                                                            ids whose logits alone are computed; empty = all V
         memory_pad_mask  bool  [sources, src_len]
         Lk.cross.<name>  f32   [sources, ...]              one row per source: rows = sources × G, G rows each
         Lk.self.<name>   f32   [cells·a, b]                growing caches [batch, a..., steps, b...]: the
                                                            host's store, a rows per (position, slot) cell
                        or f32  [batch, ...]                running sums (no position axis, MLK): row i's state
    out  logits           f32   [batch, vocab]              [batch, candidates] with a shortlist
         log_probs        f32   [batch, vocab]              log_softmax(logits), over the shortlist with one
         top_log_probs    f32   [batch, k]                  the k largest log-probs per row, descending
         top_tokens       int64 [batch, k]                  their token ids (ties: lower id first); with a
                                                            shortlist their positions in vocab_rows
         alignment        f32   [sources, G, src_len]       exports whose mechanism has cross-attention weights
                                                            (manifest `alignment`): layer `alignment.layer`'s
                                                            cross-attention of this step, averaged over its kept
                                                            heads (zoo/decoding/alignment.py), 0 at source padding; G
                                                            rows
                                                            per source as the cross caches group them, so the
                                                            host reads [batch, src_len] (a reshape, no copy).
                                                            Fetched only by searches asking for alignments
         next.Lk.self.<name> f32 [batch, ...]               what the step adds: the new position (size 1 on
                                                            "steps") of a growing cache, the new running sums

The search consumes only top_log_probs/top_tokens (k = 2·beam + 3: whatever the host bans — pad, bos,
eos — at most 3 of a row's best tokens are lost, so the 2·beam best allowed candidates of every row
are always there), so no [rows, vocab] array crosses into numpy per step.

The self-attention caches that grow by a position per step live in a store the host owns
(export.runtime.SelfCache): position j's keys of the hypothesis in row s at that step sit in cell j·W + s
(W slots per position), written once, in place, never moved. Beam search reorders no cache: a hypothesis is
the list of cells its ancestors wrote, `history` [batch, steps], and the graph gathers each row's past
from the store (an index_select, DESIGN §4) straight into the [batch, ..., steps, ...] layout attention
reads. A graph that took the cache in row order and returned it grown would hold it twice at its peak (input
and output: 118 MB more at beam 5 × 32 sentences × 30 tokens of a 6-layer d512 model) and copy it twice per
step (the reorder and the concatenation); here the one copy is the gather, and MHA attends to the past and
the new position apart (Attention.attend_step), so the grown cache is never built. At step 0 `history`
has no columns and the store no cells. Running sums are small and fixed-size: the host keeps them in row
order and reorders them itself. The export's verification compares step 0 against torch's empty cache.
The cross caches and memory_pad_mask have one row per *source*: the decoder's rows (batch = sources × G)
come in G consecutive rows per source (a sentence's beams), and cross-attention groups each source's G
queries against its one cache row (zoo.attention.base.per_source_step). A caller that replicates the caches
per row (G = 1, older runtimes) gets the same result; beam search over 32 sentences no longer holds 5 copies.
Inputs a mechanism never reads (memory_pad_mask when cross-attention caches masked sums) are
dropped by the exporter; the manifest lists each graph's actual I/O.

`alignment` is computed by every step of such an export — onnxruntime runs the whole graph whatever is fetched
(checked: an unfetched output's MatMul chain still costs its time) — so it is kept to a mean over one layer's heads
of the softmax that layer computes anyway: one ReduceMean of [sources, H, G, src_len] per step (flattening it to
[batch, src_len] in the graph took four shape nodes that cost more than the mean; the host reshapes for free). That
layer's mha cross-attention is written out (MatMul, Div, Where, Softmax, MatMul) rather than exported from SDPA
(Mul, MatMul, Where, Softmax, MatMul), so that its map can be read; MGK and Mixhead write theirs out anyway.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.runtime.manifest import ALIGNMENT_OUTPUT, NEXT_PREFIX  # output names the runtime fetches
from zoo.decoding.alignment import CrossAttentionWeights
from zoo.errors import ZooError
from zoo.model import Transformer

ENCODER_INPUTS = ("src_tokens",)
ENCODER_FIXED_OUTPUTS = ("memory", "memory_pad_mask")
DECODER_FIXED_INPUTS = ("tokens", "step", "history", "topk", "memory_pad_mask")
SHORTLIST_INPUT = "vocab_rows"  # after topk, in the decoder of an export with a vocabulary shortlist
DECODER_FIXED_OUTPUTS = ("logits", "log_probs", "top_log_probs", "top_tokens")

BATCH, SRC_LEN, STEPS = "batch", "src_len", "steps"
CELLS = "cells"  # axis 0 of a growing self cache's store: `cells_x<a>`, a rows per (position, slot) cell
CANDIDATES = "candidates"  # vocab_rows' axis: the token ids of a vocabulary shortlist
SOURCES = "sources"  # the cross caches' batch axis: one row per source sentence, shared by its beams


class ExportError(ZooError):
    """An export that cannot be done or did not verify; the message says why and what to do."""


@dataclass(frozen=True)
class CacheSpec:
    """One cached tensor of one decoder layer, as discovered from a torch decoding step.

    `shape` holds ints for fixed axes and symbolic names for dynamic ones: "batch" (axis 0 of self caches:
    one row per hypothesis) or "sources" (axis 0 of cross caches: one row per source sentence, which its
    beams share), "steps" (self-attention position axis, absent for running-sum states) or "src_len" (cross
    position axis, absent for summarised memories).
    """

    name: str  # graph name, e.g. "L0.self.k"
    layer: int
    kind: str  # "self" | "cross"
    key: str  # the mechanism's own name for it, e.g. "k"
    shape: tuple[int | str, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shape": list(self.shape)}

    @property
    def position_axis(self) -> int | None:
        for axis, size in enumerate(self.shape):
            if size in (STEPS, SRC_LEN):
                return axis
        return None


def _symbolic_shape(
    a: Tensor, b: Tensor, batch: int, grow: int, symbol: str, where: str, rows: str = "batch"
) -> tuple[int | str, ...]:
    """Shape of a cached tensor seen at two sizes of one axis (grown by `grow`): that axis becomes `symbol`,
    the batch axis `rows`."""
    if a.dim() != b.dim() or a.shape[0] != batch:
        raise ExportError(f"{where}: cached tensors must be batch-first [B, ...] (got {tuple(a.shape)})")
    shape: list[int | str] = [rows]
    grown = []
    for axis in range(1, a.dim()):
        if a.shape[axis] == b.shape[axis]:
            shape.append(int(a.shape[axis]))
        elif b.shape[axis] - a.shape[axis] == grow:
            shape.append(symbol)
            grown.append(axis)
        else:
            raise ExportError(
                f"{where}: axis {axis} changed from {a.shape[axis]} to {b.shape[axis]}; "
                f"only one position axis may grow (by {grow})"
            )
    if len(grown) > 1:
        raise ExportError(f"{where}: more than one axis follows the sequence length {tuple(a.shape)}")
    return tuple(shape)


@torch.no_grad()
def discover_caches(model: Transformer) -> list[CacheSpec]:
    """Run torch decoding steps on a dummy batch and describe every cached tensor generically.

    Two source lengths reveal the cross caches' source axis; two decoding steps reveal the
    self caches' position axis. Order: layer by layer, self then cross, names sorted.
    """
    cfg = model.cfg
    batch, src_len, extra = 2, 5, 3
    src = torch.full((batch, src_len), 4 % cfg.vocab_size, dtype=torch.long)
    longer = torch.cat([src, torch.full((batch, extra), cfg.pad_id, dtype=torch.long)], dim=1)
    bos = torch.full((batch, 1), cfg.bos_id, dtype=torch.long)
    states = []
    for source in (src, longer):
        memory, pad = model.encode(source)
        state = model.init_state()
        model.decode(bos, memory, pad, state, 0)
        first = [{kind: dict(cache) for kind, cache in layer.items()} for layer in state]
        model.decode(bos, memory, pad, state, 1)
        states.append((first, state))
    (first, second), (first_long, _) = states
    specs: list[CacheSpec] = []
    for i in range(len(first)):
        for kind in ("self", "cross"):
            keys = sorted(first[i][kind])
            if not keys:
                raise ExportError(f"decoder layer {i} {kind}-attention cached nothing during incremental decoding")
            for key in keys:
                where = f"decoder layer {i} {kind}-attention cache {key!r}"
                if kind == "self":
                    shape = _symbolic_shape(first[i][kind][key], second[i][kind][key], batch, 1, STEPS, where)
                else:
                    shape = _symbolic_shape(
                        first[i][kind][key], first_long[i][kind][key], batch, extra, SRC_LEN, where, SOURCES
                    )
                dtype = str(first[i][kind][key].dtype).replace("torch.", "")
                specs.append(CacheSpec(f"L{i}.{kind}.{key}", i, kind, key, shape, dtype))
    return specs


def concrete_shape(spec: CacheSpec, batch: int, steps: int = 0, src_len: int = 0) -> list[int]:
    sizes = {BATCH: batch, SOURCES: batch, STEPS: steps, SRC_LEN: src_len}
    return [sizes[s] if isinstance(s, str) else s for s in spec.shape]


def cross_caches(model: Transformer, memory: Tensor, pad_mask: Tensor) -> list[dict[str, Tensor]]:
    """Every decoder layer's cross-attention cache for memory [B, S, D], built by the mechanism's own
    first-step path (a cross-attention call with an empty cache) rather than `project_memory`:
    some mechanisms cache something else (MLK: masked running sums "kv", "z"). The one dummy
    query's output is discarded (and pruned from the ONNX graph)."""
    query = memory.new_zeros(memory.shape[0], 1, memory.shape[2])  # [B, 1, D]
    caches = []
    for layer in model.decoder.layers:
        cache: dict[str, Tensor] = {}
        layer.cross_attn(query, memory, key_padding_mask=pad_mask, cache=cache)
        caches.append(cache)
    return caches


class EncoderGraph(nn.Module):
    """src_tokens [B, S] → memory, memory_pad_mask, every decoder layer's cross-attention cache."""

    def __init__(self, model: Transformer, specs: list[CacheSpec]) -> None:
        super().__init__()
        self.model = model
        self.cross = [s for s in specs if s.kind == "cross"]

    def forward(self, src_tokens: Tensor) -> tuple[Tensor, ...]:
        memory, pad_mask = self.model.encode(src_tokens)  # [B, S, D], [B, S]
        per_layer = cross_caches(self.model, memory, pad_mask)
        return (memory, pad_mask, *[per_layer[s.layer][s.key] for s in self.cross])


class DecoderStepGraph(nn.Module):
    """One incremental decoder step with flat cache inputs/outputs (see the module docstring); with
    `alignment_layer`, also that layer's head-averaged cross-attention weights (`alignment`)."""

    def __init__(self, model: Transformer, specs: list[CacheSpec], alignment_layer: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.cross = [s for s in specs if s.kind == "cross"]
        self.self_specs = [s for s in specs if s.kind == "self"]
        self.weights = None if alignment_layer is None else CrossAttentionWeights(model, alignment_layer)

    def forward(
        self, tokens: Tensor, step: Tensor, history: Tensor, topk: Tensor, memory_pad_mask: Tensor, *caches: Tensor
    ) -> tuple[Tensor, ...]:
        return decoder_step(self, tokens, step, history, topk, None, memory_pad_mask, caches)


class ShortlistStepGraph(DecoderStepGraph):
    """The decoder step of an export with a vocabulary shortlist: DecoderStepGraph's, plus the `vocab_rows` input
    (a subclass only for forward's other signature, so the weights keep their names in the graph)."""

    def forward(  # type: ignore[override]
        self,
        tokens: Tensor,
        step: Tensor,
        history: Tensor,
        topk: Tensor,
        vocab_rows: Tensor,
        memory_pad_mask: Tensor,
        *caches: Tensor,
    ) -> tuple[Tensor, ...]:
        return decoder_step(self, tokens, step, history, topk, vocab_rows, memory_pad_mask, caches)


def decoder_step(
    graph: DecoderStepGraph | ShortlistStepGraph,
    tokens: Tensor,
    step: Tensor,
    history: Tensor,
    topk: Tensor,
    vocab_rows: Tensor | None,
    memory_pad_mask: Tensor,
    caches: tuple[Tensor, ...],
) -> tuple[Tensor, ...]:
    """A step graph's outputs (the module docstring); with `vocab_rows` (a shortlist graph) its logits come from an
    If (below)."""
    m, cross_specs, self_specs = graph.model, graph.cross, graph.self_specs
    cross, prev = caches[: len(cross_specs)], caches[len(cross_specs) :]
    state: list[dict[str, dict[str, Tensor]]] = [{"self": {}, "cross": {}} for _ in m.decoder.layers]
    for spec, value in zip(cross_specs, cross, strict=True):
        state[spec.layer]["cross"][spec.key] = value  # [N, ...]
    # Transformer.decode with a tensor offset: positions table indexed by `step` [1]
    x = m.tgt_embed(tokens) * m.embed_scale + m.positions.index_select(0, step)  # [N, 1, D]
    unused_memory = memory_pad_mask  # cross-attention reads its cache, never the memory itself
    with contextlib.nullcontext() if graph.weights is None else graph.weights.recording(fed=1, grouped=True):
        for i, layer in enumerate(m.decoder.layers):
            # a store [cells, ...] -> every row's past [N, ..., t, ...], gathered right before its layer runs (the
            # graph's node order is onnxruntime's run order: gathered up front, every layer's past would be alive
            # at once); running sums are in row order already
            for spec, value in zip(self_specs, prev, strict=True):
                if spec.layer == i:
                    gathered = value if spec.position_axis is None else past(spec, value, history)
                    state[i]["self"][spec.key] = gathered
            x = layer(x, unused_memory, memory_pad_mask, state[i])
    alignment = [] if graph.weights is None else [graph.weights.last]  # [sources, G, S]
    x = m.decoder.final_norm(x)
    # [N, 1, D] -> [N, D] before the projection: a Squeeze onnxruntime does without copying, where selecting
    # position 0 of the [N, 1, V] product was a Gather that copied all the logits (2.1 of 112 ms a beam-5 × 32
    # step of the 36.7M model, and a 6.4 MB buffer more)
    x = x.squeeze(1)  # [N, D]
    if vocab_rows is None:
        logits = m.logits(x)  # [N, V]
    else:  # a shortlist (`vocab_rows` [C], sorted ids) restricts the output projection to its C tokens; none
        # (C = 0) is the full projection. An ONNX If, only the branch taken runs — at a cost to the full step
        # (results/runtime/README.md), so only exports with a shortlist have it
        logits = torch.cond(vocab_rows.shape[0] == 0, _all_logits(m), _shortlist_logits(m), (x, vocab_rows))
    log_probs = torch.log_softmax(logits, dim=-1)  # [N, V] or [N, C]: normalised over what was computed
    k = topk.item()  # a graph input: one graph serves greedy (k=4) and every beam size
    torch._check(k >= 1)
    torch._check(k <= log_probs.shape[1])
    top_log_probs, top_tokens = torch.topk(log_probs, k, dim=-1)  # [N, k] each
    added = [step_output(s, state[s.layer]["self"][s.key]) for s in self_specs]
    return (logits, log_probs, top_log_probs, top_tokens, *alignment, *added)


def _all_logits(model: Transformer) -> Callable[[Tensor, Tensor], Tensor]:
    """The If's full branch: states [N, D] → logits [N, V] (the shortlist input is empty)."""

    def branch(x: Tensor, rows: Tensor) -> Tensor:
        return model.logits(x)

    return branch


def _shortlist_logits(model: Transformer) -> Callable[[Tensor, Tensor], Tensor]:
    """The If's shortlist branch: states [N, D], token ids [C] → their logits [N, C]."""

    def branch(x: Tensor, rows: Tensor) -> Tensor:
        return model.shortlist_logits(x, rows)

    return branch


def cell_split(spec: CacheSpec) -> tuple[int, int]:
    """(a, b) of a growing self cache [batch, a..., steps, b...]: the sizes before and after its position axis."""
    axis = spec.position_axis
    assert axis is not None
    return math.prod(int(s) for s in spec.shape[1:axis]), math.prod(int(s) for s in spec.shape[axis + 1 :])


def store_shape(spec: CacheSpec, cells: int) -> list[int]:
    """The host store of a growing self cache [batch, a..., steps, b...] with `cells` cells: [cells·a, b], the
    rows a gather takes whole (a cell's a slices of b values each)."""
    a, b = cell_split(spec)
    return [cells * a, b]


def past(spec: CacheSpec, store: Tensor, history: Tensor) -> Tensor:
    """Every row's cached positions from the store: store [cells·a, b], history [N, t] (row i's cell at each
    earlier position) -> [N, a..., t, b...], the layout the mechanism cached: one Gather whose index already has
    the layout, so no reshape runs for the usual [batch, heads, steps, head size] caches."""
    axis = spec.position_axis
    assert axis is not None
    a, _ = cell_split(spec)
    # cell c's slice i (of a) is store row c·a + i
    rows = history[:, None, :] * a + torch.arange(a, dtype=history.dtype)[None, :, None]  # [N, a, t]
    gathered = F.embedding(rows, store)  # [N, a, t, b]
    if axis == 2 and len(spec.shape) == 4:
        return gathered
    n, t = history.shape
    return gathered.reshape(n, *[int(s) for s in spec.shape[1:axis]], t, *[int(s) for s in spec.shape[axis + 1 :]])


def step_output(spec: CacheSpec, state: Tensor) -> Tensor:
    """What one decoder step returns of a self-attention state after it: the last position (size 1 on the
    position axis) where the state grows by a position per step — the host stores it — else the whole state."""
    axis = spec.position_axis
    if axis is None:
        return state  # running sums: fixed size, replaced every step
    return state[(slice(None),) * axis + (slice(-1, None),)]  # [N, ..., 1, ...]


def decoder_io_names(
    specs: list[CacheSpec], shortlist: bool = False, alignment: bool = False
) -> tuple[list[str], list[str]]:
    cross = [s.name for s in specs if s.kind == "cross"]
    selfs = [s.name for s in specs if s.kind == "self"]
    fixed = list(DECODER_FIXED_INPUTS)
    if shortlist:
        fixed.insert(fixed.index("topk") + 1, SHORTLIST_INPUT)
    outputs = [*DECODER_FIXED_OUTPUTS, *([ALIGNMENT_OUTPUT] if alignment else []), *[NEXT_PREFIX + n for n in selfs]]
    return [*fixed, *cross, *selfs], outputs


def encoder_io_names(specs: list[CacheSpec]) -> tuple[list[str], list[str]]:
    return list(ENCODER_INPUTS), [*ENCODER_FIXED_OUTPUTS, *[s.name for s in specs if s.kind == "cross"]]
