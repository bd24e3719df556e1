"""Linear attention (Katharopoulos et al., 2020) and the Transformer with a Mixture of Linear Keys
(MLK, Nguyen et al., paper §2.4).

MLK linearises MGK's Gaussian kernel with the feature map φ(x) = elu(x) + 1 (paper Eqn. 13):

    h_i = Σ_j Σ_r π_r φ(q_i)·φ(k_jr) v_j / Σ_j Σ_r π_r φ(q_i)·φ(k_jr)
        = φ(q_i)ᵀ [Σ_j φ̃_j v_jᵀ] / φ(q_i)ᵀ [Σ_j φ̃_j],      φ̃_j = Σ_r π_r φ(k_jr)

so the mixture only changes the per-position key feature φ̃_j, and associativity turns the O(T·S)
attention map into two running sums: KV = Σ φ̃ vᵀ [dh, dv] and z = Σ φ̃ [dh]. Plain linear
attention is the M = 1 case (φ̃_j = φ(k_j)).

Paths:
  * encoder self-attention / cross-attention: non-causal sums over the (non-padded) keys; padded
    keys get φ̃ = 0, so they add nothing to either sum. Cross-attention caches the two sums once per
    source ("kv" [B, H, dh, dv], "z" [B, H, 1, dh]) instead of per-position keys.
  * decoder self-attention: causal. The full (training) pass walks the sequence in chunks carrying
    the running sums (state after chunk c = state before + that chunk's sums), with the dense
    masked form inside a chunk; incremental decoding is the same recurrence one token at a time, so
    the cache is just the running sums — O(1) in the number of decoded tokens. Every cache tensor is
    batch-first, so beam reordering stays an index_select on dim 0.
There is no attention matrix to apply dropout to, so `dropout` (attention dropout) is unused.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.attention.base import Cache, cache_rows, causal_mask, per_source_step
from zoo.attention.flops import projection_flops
from zoo.attention.mixture_keys import MixtureKeyAttention


def feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 > 0 (Katharopoulos et al.): keeps every kernel value and normaliser positive."""
    return F.elu(x) + 1.0


class MixtureOfLinearKeys(MixtureKeyAttention):
    """MLK attention: linear attention whose key features are π-mixtures of M keys per position.

    Options: `num_components` M (default 2), `shared_key` (sMLK: one key projection plus shifts),
    `chunk_size` (positions per block in the causal full pass: larger = more parallel, more
    T×chunk work), `eps` (added to the normaliser, as in the reference linear transformer).
    π is learned per head by SGD (softmax over logits, init 1/M); the paper defines the E-step
    variants for MGK only.
    """

    no_step_weights = (
        "its cross-attention caches the source as running sums (Σ φ̃ vᵀ, Σ φ̃), so a decoding step never computes a "
        "weight per source position"
    )

    def __init__(
        self,
        *base: Any,
        num_components: int = 2,
        shared_key: bool = False,
        chunk_size: int = 64,
        eps: float = 1e-6,
        **common: Any,
    ) -> None:
        """`base` / `common`: the contract's (d_model, num_heads, head_dim, dropout, bias); the rest: MLK's."""
        super().__init__(*base, num_components=num_components, shared_key=shared_key, prior="learned", **common)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        self.eps = eps

    # ----------------------------------------------------------------- contract hooks
    def project_memory(self, memory: Tensor) -> Cache:
        """Per-position mixed key features φ̃ ("k") and values ("v"), each [B, H, S, dh]."""
        return {"k": self.key_features(memory), "v": self._split(self.v_proj(memory))}

    def attend(self, q: Tensor, kv: Cache, mask: Tensor | None, causal: bool) -> Tensor:
        """q [B, H, T, dh] (raw queries). kv holds per-position "k" (φ̃) and "v" and/or running sums
        "kv", "z" of earlier positions (the cached prefix); mask may only mask keys ([B, 1, 1, S]:
        linear attention has no per-query map to mask). Returns [B, H, T, dv]."""
        fq = feature_map(q)  # [B, H, T, dh]
        state = (kv["kv"], kv["z"]) if "kv" in kv else None
        if "k" not in kv:
            if state is None:
                raise ValueError("linear attention needs per-position keys or running sums")
            return self._read(fq, *state)
        fk = _mask_keys(kv["k"], mask)
        if causal:
            return self._causal(fq, fk, kv["v"], state)[0]
        return self._read(fq, *self._sums(fk, kv["v"], state))

    def extend_cache(self, cache: Cache, new: Cache) -> Cache:
        """Fold one step's per-position features/values into the running sums (the cache never grows)."""
        state = (cache["kv"], cache["z"]) if cache else None
        kv, z = self._sums(new["k"], new["v"], state)
        return {"kv": kv, "z": z}

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: Cache | None = None,
    ) -> Tensor:
        """As `Attention.forward`, but the caches hold running sums rather than per-position keys,
        which the base orchestration cannot express (it would append positions). Key padding is
        applied before anything is summed or cached."""
        q = self._split(self.q_proj(x))  # [B, H, T, dh]
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]  # [B, 1, 1, S]
        had_prefix = bool(cache)
        kv: Cache | None = None
        if memory is not None and had_prefix:  # cross-attention after the first step: cached sums
            out = per_source_step(q, cache_rows(cache), lambda grouped: self.attend(grouped, cache, None, False))
        else:
            kv = self.project_memory(x if memory is None else memory)
            kv["k"] = _mask_keys(kv["k"], mask)  # padded keys: φ̃ = 0
            if cache is None:
                out = self.attend(q, kv, None, causal)
            elif memory is None:
                # incremental self-attention: new positions causally on top of the cached running sums
                out = self.attend(q, {**cache, **kv}, None, True)
                state = self.extend_cache(cache, kv)
                cache.clear()
                cache.update(state)
            else:
                cache.update(self.extend_cache({}, kv))  # cross-attention: sum the source once
                out = self.attend(q, cache, None, False)
        if self.capture:
            complete = kv is not None and not (memory is None and had_prefix)
            self._capture_linear(
                q, kv if complete else None, out, causal=memory is None and (causal or cache is not None)
            )
        out = out * self.head_gate.to(out.dtype)[None, :, None, None]
        return self.out_proj(self._merge(out))

    # ----------------------------------------------------------------- linear-attention maths
    def key_features(self, x: Tensor) -> Tensor:
        """φ̃_j = Σ_r π_r φ(k_jr) for every position of x [B, S, D] -> [B, H, S, dh]."""
        feats = torch.stack([feature_map(k) for k in self.component_keys(x)], dim=2)  # [B, H, M, S, dh]
        log_pi = self.log_prior()
        if log_pi is None:  # M = 1
            return feats[:, :, 0]
        return (feats * log_pi.exp()[None, :, :, None, None]).sum(dim=2)  # [B, H, S, dh]

    def _sums(self, fk: Tensor, v: Tensor, state: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
        """Running sums after adding positions fk [B, H, S, dh], v [B, H, S, dv] to `state`."""
        kv = fk.transpose(-1, -2) @ v  # Σ_j φ̃_j v_jᵀ: [B, H, dh, S] @ [B, H, S, dv] -> [B, H, dh, dv]
        z = fk.sum(dim=2, keepdim=True)  # Σ_j φ̃_j: [B, H, 1, dh]
        if state is not None:
            kv, z = state[0] + kv, state[1] + z
        return kv, z

    def _read(self, fq: Tensor, kv: Tensor, z: Tensor) -> Tensor:
        """φ(q)ᵀ KV / (φ(q)ᵀ z + eps): fq [B, H, T, dh] -> [B, H, T, dv]."""
        num = fq @ kv  # [B, H, T, dh] @ [B, H, dh, dv] -> [B, H, T, dv]
        den = fq @ z.transpose(-1, -2)  # [B, H, T, dh] @ [B, H, dh, 1] -> [B, H, T, 1]
        return num / (den + self.eps)

    def _causal(
        self, fq: Tensor, fk: Tensor, v: Tensor, state: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Causal linear attention of T new positions after an optional prefix `state`:
        h_i = φ(q_i)ᵀ (KV_prefix + Σ_{j≤i} φ̃_j v_jᵀ) / φ(q_i)ᵀ (z_prefix + Σ_{j≤i} φ̃_j).
        Chunks of `chunk_size` positions: the running sums carry everything before a chunk, the
        dense lower-triangular product handles positions inside it. Returns (out [B, H, T, dv],
        kv, z after the last position)."""
        b, h, t, d = fq.shape
        if state is None:
            kv = fq.new_zeros(b, h, d, v.shape[-1])  # [B, H, dh, dv]
            z = fq.new_zeros(b, h, 1, d)  # [B, H, 1, dh]
        else:
            kv, z = state
        outs = []
        for start in range(0, t, self.chunk_size):
            qc = fq[:, :, start : start + self.chunk_size]  # [B, H, C, dh]
            kc = fk[:, :, start : start + self.chunk_size]
            vc = v[:, :, start : start + self.chunk_size]  # [B, H, C, dv]
            within = (qc @ kc.transpose(-1, -2)).tril()  # φ(q_i)·φ̃_j for j ≤ i in the chunk: [B, H, C, C]
            num = qc @ kv + within @ vc  # [B, H, C, dv]
            den = qc @ z.transpose(-1, -2) + within.sum(dim=-1, keepdim=True)  # [B, H, C, 1]
            outs.append(num / (den + self.eps))
            kv, z = self._sums(kc, vc, (kv, z))
        return torch.cat(outs, dim=2), kv, z

    def _capture_linear(self, q: Tensor, kv: Cache | None, out: Tensor, causal: bool) -> None:
        """Feature maps for GHT. "O" always. "V" (values) and "A" (the implied attention map
        a_ij = φ(q_i)·φ̃_j / Σ_j' φ(q_i)·φ̃_j', built densely only on request) exist only when this
        call saw every key position — not in cached decoding steps, whose earlier positions survive
        only inside the running sums; there the entries are removed rather than left stale."""
        if "O" in self.capture:
            self.captured["O"] = out
        if kv is None:  # this call did not see every key position
            self.captured.pop("V", None)
            self.captured.pop("A", None)
            return
        if "V" in self.capture:
            self.captured["V"] = kv["v"]
        if "A" in self.capture:
            scores = feature_map(q) @ kv["k"].transpose(-1, -2)  # [B, H, T, S]
            if causal:
                scores = scores.masked_fill(~causal_mask(scores.shape[-2], scores.shape[-1], scores.device), 0.0)
            self.captured["A"] = scores / (scores.sum(dim=-1, keepdim=True) + self.eps)

    # ----------------------------------------------------------------- size
    def flops(self, q_len: int, kv_len: int) -> int:
        """Projections (all component key projections) + the associative core per head:
        φ̃ᵀv ([dh, Tk] @ [Tk, dv]) + φ(q)·KV ([Tq, dh] @ [dh, dv]) + φ(q)·z ([Tq, dh] @ [dh, 1]).
        This is the exact count of the non-causal paths (encoder self, cross); the decoder's causal
        full pass additionally spends ~4·H·Tq·min(Tq, chunk_size)·dh on within-chunk products.
        Feature maps, the π mixing and the sums over positions are elementwise (not counted)."""
        h, dh = self.num_heads, self.head_dim
        core = h * (2 * kv_len * dh * dh + 2 * q_len * dh * dh + 2 * q_len * dh)
        return projection_flops(self, q_len, kv_len) + core


class LinearAttention(MixtureOfLinearKeys):
    """Plain linear attention (the M = 1 case of MLK): the baseline MLK is compared against."""

    def __init__(self, *base: Any, chunk_size: int = 64, eps: float = 1e-6, **common: Any) -> None:
        super().__init__(*base, num_components=1, shared_key=False, chunk_size=chunk_size, eps=eps, **common)


def _mask_keys(fk: Tensor, mask: Tensor | None) -> Tensor:
    """Zero the features of masked keys. mask [B, 1, 1, S] True = may attend (a key mask only)."""
    if mask is None:
        return fk
    if mask.shape[-2] != 1:
        raise ValueError("linear attention supports key masks only (per-query masks have no linear form)")
    return fk * mask.transpose(-1, -2).to(fk.dtype)  # [B, 1, S, 1] broadcast over heads and features
