"""Mix-head attention (Zhang et al., 2022, "Mixhead: Breaking the low-rank bottleneck in multi-head
attention language models"; official code github.com/zhongzhang1/mixhead).

Why: with head size d_k below the sequence length a head's n×n attention map has rank ≤ d_k (the
low-rank bottleneck). Mixhead replaces each head's post-softmax map by a learned linear combination
of all heads' maps, which can have higher rank at a cost of only H×H (or d_k×H + H×H) parameters:

    P_j      = softmax(q_j k_jᵀ / √d_k)              per head j, [T, S]
    P̄_i[t]  = Σ_j M[t]_{j,i} · P_j[t]               per query row t (mixing across heads)
    out_i    = dropout(P̄_i) v_i

Variant A (position-independent): M is one learned H×H matrix, initialised to the identity.
Variant B (position-wise): M[t] = Q_tᵀ W + B for query position t, where Q_t = [q_1[t] … q_H[t]] is
the d_k×H matrix of the per-head query vectors of that position (the projected query, with its
bias, before the 1/√d_k scaling — as the official code), W ∈ R^{d_k×H} (init 0) and B ∈ R^{H×H}
(init I): M[t]_{j,i} = q_j[t]·W[:, i] + B_{j,i}. This is the paper's Mᵀ = W^{Mᵀ}·Q′ᵀ + Bᵀ (Sec. 3.1)
with its last-axis-batched notation unrolled, and the official code's mix_type 17. With W = 0 it
reduces to variant A; with M = I both equal plain multi-head attention.
Avghead (the paper's control, Sec. 4.6 / Table 7): M = 1/H everywhere, fixed — every head uses the average of
all heads' maps, which "degenerates to the single-head attention with redundant parameters". The paper says
its M is "initialized from the uniform distribution, which essentially averages all heads"; we keep it fixed
(a buffer, like its fixed Mixhead_rand) so it averages exactly and stays the control it is meant to be.

The mixing weights are unnormalised (mixed rows need not sum to 1, may be negative), as in the
paper. Its optional orthogonality regulariser λ·‖MᵀM − I‖²_F (Sec. 3.3) is returned by
`extra_loss()`; for B it is averaged over all batch rows and query positions of the last forward
pass (padded query positions included: the module only knows which *keys* are padding).

Mixing is per query row, so it happens inside `attend` and therefore on every path of the
contract: encoder self-attention, decoder self-attention in the full pass and in incremental
decoding (a new query row mixes its own maps over the cached keys), and cross-attention (the
official code skips it in incremental decoding and cross-attention). Masked keys stay exactly 0
after mixing, so padding never leaks in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.base import Attention, Cache, HeadPruningUnsupported, causal_mask
from zoo.attention.flops import dot_product_core_flops, projection_flops

VARIANTS = ("a", "b", "avg")


class MixheadAttention(Attention):
    """Multi-head attention whose post-softmax maps are mixed across heads (variant "a", "b" or the fixed
    averaging control "avg").

    Feature capture: "A" is the *mixed* map P̄ (the one that weights the values, so GHT groups and
    the rank analysis see what the head actually uses); "A_unmixed" (opt-in, Mixhead only) is the
    per-head softmax map P before mixing, for comparing ranks before/after mixing.
    """

    def __init__(self, *base: Any, variant: str = "a", ortho_lambda: float = 0.0, **common: Any) -> None:
        """`base` / `common`: the contract's (d_model, num_heads, head_dim, dropout, bias); the rest: Mixhead's."""
        super().__init__(*base, **common)
        variant = str(variant).lower()
        if variant not in VARIANTS:
            raise ValueError(
                f"mixhead variant must be one of {VARIANTS} (a = position-independent, "
                f"b = position-wise, avg = fixed uniform averaging, the paper's Avghead), got {variant!r}"
            )
        if not ortho_lambda >= 0:
            raise ValueError(f"mixhead ortho_lambda must be >= 0, got {ortho_lambda}")
        self.variant = variant
        self.ortho_lambda = float(ortho_lambda)
        h = self.num_heads
        if variant == "a":
            self.mix = nn.Parameter(torch.empty(h, h))  # [H_in j, H_out i]
        elif variant == "avg":
            self.register_buffer("mix", torch.full((h, h), 1.0 / h))  # [H_in j, H_out i], fixed
        else:
            self.mix_weight = nn.Parameter(torch.empty(self.head_dim, h))  # W [dh, H_out]
            self.mix_bias = nn.Parameter(torch.empty(h, h))  # B [H_in, H_out]
        self._reset_mixing()
        # λ·R_orth of the last forward pass with autograd on (variant B depends on the queries)
        self._ortho: Tensor | None = None

    # ----------------------------------------------------------------- parameters
    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._reset_mixing()

    def _reset_mixing(self) -> None:
        # identity mixing (B: W = 0, bias = I) starts training as plain multi-head attention (paper Sec. 3.2)
        with torch.no_grad():
            if "mix" in self._parameters:
                self.mix.copy_(torch.eye(self.num_heads))
            if "mix_weight" in self._parameters:
                self.mix_weight.zero_()
                self.mix_bias.copy_(torch.eye(self.num_heads))

    # ----------------------------------------------------------------- mixing
    def mixing_matrix(self, q: Tensor) -> Tensor:
        """M from per-head queries q [B, H, T, dh]: [H, H] for variant A, [B, T, H, H] for B.
        Entry [.., j, i] is the weight of input head j in mixed head i."""
        if self.variant in ("a", "avg"):
            return self.mix
        # M[b, t, j, i] = q[b, j, t, :] · W[:, i] + B[j, i]
        return torch.einsum("bjtd,di->btji", q, self.mix_weight) + self.mix_bias  # [B, T, H, H]

    @staticmethod
    def mix_maps(attn: Tensor, m: Tensor) -> Tensor:
        """attn [B, H, T, S] mixed across heads per query row: out[b, i, t] = Σ_j m[.., j, i]·attn[b, j, t]."""
        if m.dim() == 2:
            return torch.einsum("bjts,ji->bits", attn, m)  # [B, H, T, S]
        return torch.einsum("bjts,btji->bits", attn, m)  # [B, H, T, S]

    @staticmethod
    def ortho_penalty(m: Tensor) -> Tensor:
        """‖MᵀM − I‖²_F (paper Eq. 16) of m [.., H, H], averaged over any leading (batch, position) axes."""
        eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
        gram = m.transpose(-1, -2) @ m  # [.., H, H]
        return (gram - eye).pow(2).sum(dim=(-2, -1)).mean()

    # ----------------------------------------------------------------- the mechanism
    def attend(self, q: Tensor, kv: Cache, mask: Tensor | None, causal: bool) -> Tensor:
        k, v = kv["k"], kv["v"]  # [B, H, S, dh]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # [B, H, T, S]
        if causal:
            tri = causal_mask(q.shape[2], k.shape[2], q.device)  # [T, S]
            mask = tri if mask is None else mask & tri
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        attn = scores.softmax(dim=-1)  # [B, H, T, S]
        if "A_unmixed" in self.capture:
            self.captured["A_unmixed"] = attn
        m = self.mixing_matrix(q)  # [H, H] or [B, T, H, H]
        mixed = self.mix_maps(attn, m)  # [B, H, T, S]; masked keys stay exactly 0
        if "A" in self.capture:
            self.captured["A"] = mixed
        # the regulariser is needed only when training; keep nothing (and no graph) at inference
        self._ortho = None
        if self.ortho_lambda and torch.is_grad_enabled():
            self._ortho = self.ortho_lambda * self.ortho_penalty(m)
        p = self.dropout if self.training else 0.0
        return F.dropout(mixed, p, self.training) @ v  # [B, H, T, dh]

    def extra_loss(self) -> Tensor | None:
        """λ·‖MᵀM − I‖²_F, or None when λ = 0. Variant A reads it off its parameter; variant B returns
        the value of the last forward pass run with autograd on (None before one / after no_grad)."""
        if not self.ortho_lambda or self.variant == "avg":  # a fixed M has nothing to regularise
            return None
        if self.variant == "a":
            return self.ortho_lambda * self.ortho_penalty(self.mix)
        return self._ortho

    def __getstate__(self) -> dict[str, Any]:
        # a non-leaf tensor with a graph cannot be deep-copied or pickled; it is per-step scratch anyway
        state = self.__dict__.copy()
        state["_ortho"] = None
        return state

    # ----------------------------------------------------------------- size
    def flops(self, q_len: int, kv_len: int) -> int:
        """Projections + q kᵀ + P̄ v as plain MHA, plus the mixing [Tq·Tk, H] @ [H, H] (2·Tq·Tk·H²)
        and, for B, the mixing matrices q·W: [Tq·H, dh] @ [dh, H] (2·Tq·H·dh·H). The training-only
        orthogonality penalty is not counted (zoo.flops counts forward passes)."""
        h, dh = self.num_heads, self.head_dim
        total = projection_flops(self, q_len, kv_len) + dot_product_core_flops(h, dh, q_len, kv_len)
        total += 2 * q_len * kv_len * h * h
        if self.variant == "b":
            total += 2 * q_len * h * dh * h
        return total

    # ----------------------------------------------------------------- heads
    def check_head_removal(self) -> None:
        raise HeadPruningUnsupported(
            "mixhead cannot remove heads exactly: every kept head's map is a mix of ALL heads' maps "
            "(P̄_i = Σ_j M[j, i]·P_j), so dropping head j's q/k rows would change the kept heads' outputs. "
            "Gating a head (head_gate = 0) stays exact — it zeros that head's mixed output before out_proj — "
            "but a head plan for mixhead would promise a physical removal that export cannot deliver."
        )

    def keep_heads(self, heads: Sequence[int]) -> None:
        """Refused: see `check_head_removal`."""
        self.check_head_removal()
