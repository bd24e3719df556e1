"""Transformer with a Mixture of Gaussian Keys (Nguyen et al., "Improving Transformers with
Probabilistic Attention Keys": MGK / sMGK). The mixture-of-keys machinery it shares with MLK (M keys per
position, π) is `zoo.attention.mixture_keys.MixtureKeyAttention`.

Why a mixture: read as a Gaussian mixture model (paper §2.1), softmax attention asks which key's
Gaussian N(k_j, σ²I) explains the query. Giving every position M Gaussians N(k_jr, σ²I) mixed by
π_r lets one head explain several query modes, so half the heads suffice (the paper's headline):

    score(q_i, k_j) = log Σ_r π_r · exp(−‖q_i − k_jr‖² / 2σ²),   a_ij = softmax_j score(q_i, k_j)

σ² = √D (D = head size) makes the q·k cross term exactly the baseline's q·k/√D. ‖q_i‖² is the same for
every key and component of query i, so it cancels in the softmax over keys (and in the E-step
responsibilities); it is dropped and the rest is combined with a logsumexp over components, which
stays finite where the literal exp(−‖q − k‖²/2σ²) underflows.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from zoo.attention.base import Cache, causal_mask
from zoo.attention.flops import projection_flops
from zoo.attention.mixture_keys import MixtureKeyAttention

#: how the mixture weights π are obtained (paper §2.3): by SGD, by the soft E-step, or ignored (hard E-step).
E_STEPS = ("learned", "soft", "hard")


class MixtureOfGaussianKeys(MixtureKeyAttention):
    """MGK attention (and sMGK with `shared_key=True`).

    Options (an entry's `attention_options`): `num_components` M (default 2), `shared_key`,
    `e_step` ("learned": π by SGD, the paper's default; "soft": π is set, at every training
    forward, to the mean responsibility γ_r = π_r N(q | k_jr) / Σ_r' π_r' N(q | k_jr') over the
    batch's attended (non-padded, causally allowed) query/key pairs and the updated π is then used
    in that forward, as in paper Eqn. 11 — no gradient, no EMA; "hard": max over components instead of
    the π-weighted logsumexp, paper Eqn. 12), and `sigma2` (None = √head_dim, the paper's choice).

    Cache: "k0" … "k{M−1}" and "v", each [B, H, S, dh] (all key sets, also for sMGK).
    """

    def __init__(
        self,
        *base: Any,
        num_components: int = 2,
        shared_key: bool = False,
        e_step: str = "learned",
        sigma2: float | None = None,
        **common: Any,
    ) -> None:
        """`base` / `common`: the contract's (d_model, num_heads, head_dim, dropout, bias); the rest: MGK's."""
        if e_step not in E_STEPS:
            raise ValueError(f"e_step must be one of {E_STEPS}, got {e_step!r}")
        prior = {"learned": "learned", "soft": "em", "hard": "none"}[e_step]
        super().__init__(*base, num_components=num_components, shared_key=shared_key, prior=prior, **common)
        self.e_step = e_step
        self.sigma2 = math.sqrt(self.head_dim) if sigma2 is None else float(sigma2)
        if not self.sigma2 > 0:
            raise ValueError(f"sigma2 must be positive, got {sigma2}")
        self._query_padding: Tensor | None = None

    # ----------------------------------------------------------------- contract hooks
    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: Cache | None = None,
    ) -> Tensor:
        """As `Attention.forward`. Also remembers the query padding for the soft E-step: in
        self-attention the key padding mask is the query padding too (one sequence), and
        responsibilities of padded queries must not move π. (Cross-attention queries carry no
        padding mask; the decoder's padded target positions are included there.)"""
        self._query_padding = None
        if memory is None and key_padding_mask is not None:
            self._query_padding = key_padding_mask[:, -x.shape[1] :]  # [B, T] True at padding
        try:
            return super().forward(x, memory, key_padding_mask=key_padding_mask, causal=causal, cache=cache)
        finally:
            self._query_padding = None

    def project_memory(self, memory: Tensor) -> Cache:
        kv = {f"k{r}": k for r, k in enumerate(self.component_keys(memory))}  # each [B, H, S, dh]
        kv["v"] = self._split(self.v_proj(memory))  # [B, H, S, dh]
        return kv

    def attend(self, q: Tensor, kv: Cache, mask: Tensor | None, causal: bool) -> Tensor:
        keys = torch.stack([kv[f"k{r}"] for r in range(self.num_components)], dim=2)  # [B, H, M, S, dh]
        t, s = q.shape[2], keys.shape[3]
        if causal:
            tri = causal_mask(t, s, q.device)  # [T, S]
            mask = tri if mask is None else mask & tri  # [B, 1, T, S]
        dist = self.component_scores(q, keys)  # [B, H, M, T, S]
        if self.prior == "em" and self.training:
            self._soft_e_step(dist, mask)
        log_pi = self.log_prior()  # [H, M], None for the hard E-step and for M = 1
        if log_pi is None:
            scores = dist.amax(dim=2)  # [B, H, T, S]: the best component alone explains the query
        else:
            scores = torch.logsumexp(dist + log_pi[None, :, :, None, None], dim=2)  # [B, H, T, S]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        attn = scores.softmax(dim=-1)  # [B, H, T, S]
        if "A" in self.capture:
            self.captured["A"] = attn
        attn = nn.functional.dropout(attn, self.dropout, self.training)
        return attn @ kv["v"]  # [B, H, T, dh]

    # ----------------------------------------------------------------- MGK maths
    def component_scores(self, q: Tensor, keys: Tensor) -> Tensor:
        """log N(q | k_r, σ²I) up to terms constant over keys and components:
        −(‖q − k_r‖² − ‖q‖²) / 2σ² = (q·k_r − ‖k_r‖²/2) / σ².  q [B, H, T, dh], keys [B, H, M, S, dh]
        → [B, H, M, T, S]."""
        dots = q.unsqueeze(2) @ keys.transpose(-1, -2)  # [B, H, 1, T, dh] @ [B, H, M, dh, S] -> [B, H, M, T, S]
        sq = keys.pow(2).sum(dim=-1).unsqueeze(-2)  # ‖k_r‖² [B, H, M, 1, S]
        return (dots - 0.5 * sq) / self.sigma2

    @torch.no_grad()
    def _soft_e_step(self, dist: Tensor, mask: Tensor | None) -> None:
        """π ← mean responsibility over the attended query/key pairs of this batch (paper Eqn. 11,
        π_r = N_r / N), in place so the buffer object (DDP broadcasts it) stays the same."""
        b, h, _, t, s = dist.shape  # [B, H, M, T, S]
        resp = (dist + self.pi.log()[None, :, :, None, None]).softmax(dim=2)  # γ [B, H, M, T, S]
        valid = torch.ones(b, 1, t, s, dtype=resp.dtype, device=resp.device)
        if mask is not None:
            valid = valid * mask.to(resp.dtype)  # [B, 1|H, T, S]
        if self._query_padding is not None:
            valid = valid * (~self._query_padding).to(resp.dtype)[:, None, :, None]
        valid = valid.expand(b, h, t, s)
        total = torch.einsum("bhrts,bhts->hr", resp, valid)  # Σ γ over valid pairs [H, M]
        count = valid.sum(dim=(0, 2, 3))  # [H]
        new = total / count.clamp_min(1.0)[:, None]
        self.pi.copy_(torch.where(count[:, None] > 0, new, self.pi))

    # ----------------------------------------------------------------- size
    def flops(self, q_len: int, kv_len: int) -> int:
        """Projections (every component key projection included) + M score products
        q k_rᵀ ([H, Tq, dh] @ [H, dh, Tk] each) + one attention-weighted sum of values. ‖k_r‖²,
        the logsumexp/max over components and the softmax are elementwise and not counted
        (zoo.flops conventions); sMGK's shifts are adds, so it costs as MGK minus one projection."""
        core = 2 * (self.num_components + 1) * self.num_heads * q_len * kv_len * self.head_dim
        return projection_flops(self, q_len, kv_len) + core
