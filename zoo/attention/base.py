"""The attention contract every mechanism in the zoo implements (zoo/DESIGN.md §4).

A mechanism only decides how per-head queries meet per-head keys/values (`attend`) and which
per-position tensors it caches (`project_memory`). Everything the rest of the product relies on —
projections, the per-head output gate, physical head removal, incremental caches and beam
reordering, feature capture for GHT — lives here once, so every variant gets it for free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from zoo.errors import ZooError

# A layer's incremental state: named tensors, each [B, H, S, *] (batch first so beams reorder by index_select).
Cache = dict[str, Tensor]

FEATURE_MAPS = ("V", "A", "O")


class HeadPruningUnsupported(ZooError, NotImplementedError):
    """Raised by mechanisms for which removing heads would change the kept heads' outputs."""


class Attention(nn.Module):
    """Multi-head attention skeleton: d_model → H heads of size head_dim → d_model.

    `head_dim` is independent of d_model / H (the "concise" fixed-head-size option and pruned
    models both need that). Subclasses override `attend` (and, if they cache more than k and v,
    `project_memory` / `key_projections`).
    """

    #: names of the linear layers producing per-head key-side tensors (sliced on head removal).
    key_projections: tuple[str, ...] = ("k_proj", "v_proj")
    #: why a cached cross-attention step of this mechanism has no weight per source position ("" = it has them:
    #: its `attend` captures them as "A"); word alignments (zoo/decoding/alignment.py) are refused with this reason
    no_step_weights: str = ""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(
                    f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                    "set head_dim explicitly (fixed head size)"
                )
            head_dim = d_model // num_heads
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dropout = dropout
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        # 0/1 mask on head outputs before out_proj; a buffer so it is saved and exported with the weights.
        self.register_buffer("head_gate", torch.ones(num_heads))
        self.capture: tuple[str, ...] = ()  # which feature maps to keep (GHT); empty = free
        self.captured: dict[str, Tensor] = {}
        # the export layer's fused kernel for one decoding step (export/fused_attention.py), set only while a decoder
        # graph is exported: called with forward's arguments, it returns the output or None to run the usual path
        self.export_step: Callable[[Tensor, Tensor | None, Tensor | None, Cache], Tensor | None] | None = None
        # This class's reset, not an override: a subclass's own tensors do not exist yet. A subclass that adds
        # parameters calls `self.reset_parameters()` once they do (that re-draws q/k/v/out too, which seeded
        # models' initial values depend on, so the draws here stay).
        Attention.reset_parameters(self)

    def reset_parameters(self) -> None:
        """Initialise every parameter (subclasses extend this for their own)."""
        # fairseq's init: scaled xavier for q/k/v so the attention logits start well-conditioned.
        for name in ("q_proj", *self.key_projections):
            proj = getattr(self, name)
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    # ----------------------------------------------------------------- shape helpers
    def _split(self, x: Tensor) -> Tensor:
        # [B, S, H*dh] -> [B, H, S, dh]
        b, s, _ = x.shape
        return x.view(b, s, -1, self.head_dim).transpose(1, 2)

    def _merge(self, x: Tensor) -> Tensor:
        # [B, H, T, dh] -> [B, T, H*dh]
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)

    # ----------------------------------------------------------------- mechanism hooks
    def project_memory(self, memory: Tensor) -> Cache:
        """Per-head key-side tensors of `memory` [B, S, D]; each entry [B, H, S, *]."""
        return {"k": self._split(self.k_proj(memory)), "v": self._split(self.v_proj(memory))}

    def attend(self, q: Tensor, kv: Cache, mask: Tensor | None, causal: bool) -> Tensor:
        """q [B, H, T, dh], kv entries [B, H, S, *], mask [B, 1|H, T, S] bool (True = may attend)
        or None; `causal` means plain lower-triangular masking with T == S. Returns [B, H, T, dh]."""
        raise NotImplementedError

    def extend_cache(self, cache: Cache, new: Cache) -> Cache:
        """Append one step's key-side tensors to a self-attention cache (along positions)."""
        if not cache:
            return dict(new)
        return {name: torch.cat([cache[name], new[name]], dim=2) for name in new}

    def attend_step(self, q: Tensor, past: Cache, new: Cache, grown: Cache) -> Tensor:
        """One decoding step of self-attention: q [B, H, 1, dh] over the cached positions `past` plus its own
        `new` ones; `grown` is `extend_cache(past, new)`. Returns [B, H, 1, dv].

        Called only while a graph is exported (torch.compiler.is_exporting). A mechanism may override it to
        attend to `past` and `new` apart, so the exported decoder step never materialises the grown cache: the
        export runtime owns the cache and appends the new position itself (export/graph.py), and a grown copy
        per layer and step is both the largest transient of a beam search and a copy of the whole cache."""
        return self.attend(q, grown, None, False)

    def extra_loss(self) -> Tensor | None:
        """Auxiliary loss of this module (e.g. Mixhead orthogonality), or None."""
        return None

    # ----------------------------------------------------------------- the contract
    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: Cache | None = None,
    ) -> Tensor:
        """x [B, T, D] queries; memory [B, S, D] for cross-attention (None = self-attention).

        key_padding_mask [B, S] bool, True at padded keys. `cache` (a dict, mutated in place)
        turns on incremental decoding: self-attention appends this call's keys/values, which
        makes `causal` unnecessary for single-token steps; cross-attention computes the memory
        projections once and reuses them.
        """
        if self.export_step is not None and cache is not None and x.shape[1] == 1 and torch.compiler.is_exporting():
            fused = self.export_step(x, memory, key_padding_mask, cache)
            if fused is not None:
                return fused
        q = self._split(self.q_proj(x))  # [B, H, T, dh]
        past: Cache = {}
        if memory is None:
            kv = new = self.project_memory(x)
            if cache is not None:
                past = dict(cache)
                kv = self.extend_cache(cache, new)
                cache.clear()
                cache.update(kv)
                if x.shape[1] == 1:
                    causal = False  # one new query sees every cached position
        elif cache is not None and cache:
            kv = cache
        else:
            kv = self.project_memory(memory)
            if cache is not None:
                cache.update(kv)
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, None, None, :]  # [B, 1, 1, S]
        if memory is not None and cache:
            out = per_source_step(q, cache_rows(kv), lambda grouped: self.attend(grouped, kv, mask, False))
        elif past and mask is None and x.shape[1] == 1 and torch.compiler.is_exporting():
            out = self.attend_step(q, past, new, kv)  # [B, H, 1, dh]
        else:
            out = self.attend(q, kv, mask, causal)  # [B, H, T, dh]
        if self.capture:
            self._capture(kv, out)
        out = out * self.head_gate.to(out.dtype)[None, :, None, None]
        return self.out_proj(self._merge(out))

    def _capture(self, kv: Cache, out: Tensor) -> None:
        if "V" in self.capture:
            self.captured["V"] = kv["v"]
        if "O" in self.capture:
            self.captured["O"] = out

    # ----------------------------------------------------------------- head removal
    @torch.no_grad()
    def keep_heads(self, heads: Sequence[int]) -> None:
        """Physically keep only `heads` (original indices, in order): slice the q/k/v rows and
        the output-projection columns; the output bias is untouched, so outputs equal those of
        the gated model whose gate is 1 exactly on `heads`."""
        heads = list(heads)
        if not heads or len(set(heads)) != len(heads) or not all(0 <= h < self.num_heads for h in heads):
            raise ValueError(f"invalid head selection {heads} for a module with {self.num_heads} heads")
        rows = torch.cat([torch.arange(h * self.head_dim, (h + 1) * self.head_dim) for h in heads])
        for name in ("q_proj", *self.key_projections):
            setattr(self, name, _slice_linear(getattr(self, name), rows, dim=0))
        self.out_proj = _slice_linear(self.out_proj, rows, dim=1)
        self._keep_head_params(torch.tensor(heads))
        self.head_gate = self.head_gate[heads].clone()
        self.num_heads = len(heads)

    def check_head_removal(self) -> None:
        """Raise `HeadPruningUnsupported` where `keep_heads` cannot be exact (default: it can), so a
        head plan is refused before any module changes rather than half-way or at export time."""

    def _keep_head_params(self, heads: Tensor) -> None:
        """Slice mechanism-specific per-head parameters (override in variants that have them)."""


def _slice_linear(layer: nn.Linear, index: Tensor, dim: int) -> nn.Linear:
    weight = layer.weight.index_select(dim, index)
    out_features, in_features = weight.shape
    new = nn.Linear(in_features, out_features, bias=layer.bias is not None)
    new.to(weight.device, weight.dtype)
    new.weight.copy_(weight)
    if layer.bias is not None:
        new.bias.copy_(layer.bias if dim == 1 else layer.bias.index_select(0, index))
    return new


def causal_mask(t: int, s: int, device: torch.device | None = None) -> Tensor:
    """[T, S] bool, True where query i may see key j: lower-triangular, with the keys aligned to the end when
    S > T (the T queries are the last positions after a cached prefix). The one causal mask every mechanism uses."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def cache_rows(cache: Cache) -> int:
    """The batch size of a cache (every entry is batch first)."""
    return next(iter(cache.values())).shape[0]


def per_source_step(q: Tensor, sources: int, attend: Callable[[Tensor], Tensor]) -> Tensor:
    """One decoding step's cross-attention when the cross cache holds one row per *source* and the queries
    q [N, H, 1, dh] come in N = sources × G consecutive rows per source (G beams; G = 1 when the cache has a row
    per query, as in zoo.decoding.generate). Each source's G queries attend to its cache together — `attend` maps
    [sources, H, G, dh] → [sources, H, G, dv] — instead of replicating the cache G times: the ONNX runtime keeps
    one cross cache per sentence (a beam of 5 over 32 sentences held 165 MB of copies) and the G query rows
    become one small matrix product per head. Exact: cross-attention queries never see each other. Queries of
    several positions (teacher forcing through a cache) need a cache row per query and go to `attend` as they are."""
    n, h, t, d = q.shape
    if t != 1:
        return attend(q)
    torch._check(n % sources == 0)  # the export's graphs get this as a runtime check on the two batch axes
    grouped = q.reshape(sources, n // sources, h, d).transpose(1, 2)  # [sources, H, G, dh]
    out = attend(grouped)  # [sources, H, G, dv]
    return out.transpose(1, 2).reshape(n, h, 1, out.shape[-1])  # [N, H, 1, dv]


def reorder_cache(cache: Cache, order: Tensor) -> None:
    """Beam reordering: pick batch rows `order` [B'] of every cached tensor, in place."""
    for name, value in cache.items():
        cache[name] = value.index_select(0, order)
