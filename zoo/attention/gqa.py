"""Grouped-query attention (Ainslie et al. 2023) and its limit, multi-query attention (Shazeer 2019).

H query heads share `kv_heads` key/value heads, H / kv_heads query heads per group (kv_heads = 1: MQA). Only the
key/value heads are projected and cached, so a decoder's self- and cross-attention caches — and the memory traffic
of every decoding step that reads them — shrink by H / kv_heads. The attention itself is softmax attention: a
group's queries are laid side by side on the query axis ([B, H, T, dh] → [B, Hkv, g·T, dh]) and attend to their
one key/value head, so no key or value is ever repeated per query head.

Uptraining (the paper's recipe): a trained multi-head checkpoint becomes a grouped one by mean-pooling each group's
key and value projection heads (`pool_heads`), then training goes on (`zoo.train +model=gqa init_from=<ckpt>`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from zoo.attention.base import Attention, Cache, HeadPruningUnsupported, causal_mask
from zoo.attention.mha import MultiHeadAttention


class GroupedQueryAttention(MultiHeadAttention):
    """softmax(q kᵀ / √dh) v with query head h reading key/value head h // (H / kv_heads)."""

    def __init__(self, *base: Any, kv_heads: int = 1, **common: Any) -> None:
        """`base` / `common`: the contract's (d_model, num_heads, head_dim, dropout, bias); `kv_heads`: GQA's."""
        super().__init__(*base, **common)
        if kv_heads < 1 or self.num_heads % kv_heads:
            raise ValueError(
                f"kv_heads={kv_heads} must be ≥ 1 and divide num_heads={self.num_heads} (each key/value head serves "
                "an equal group of query heads); choose a divisor, e.g. model.attention_options.kv_heads=1 (MQA)"
            )
        self.kv_heads = kv_heads
        bias, shared = self.k_proj.bias is not None, kv_heads * self.head_dim
        self.k_proj = nn.Linear(self.d_model, shared, bias=bias)
        self.v_proj = nn.Linear(self.d_model, shared, bias=bias)
        self.reset_parameters()

    def _grouped(self, q: Tensor) -> Tensor:
        # [B, H, T, dh] -> [B, Hkv, g·T, dh]: query head h = kv·g + j lands in group kv, rows j·T … j·T + T − 1
        b, h, t, d = q.shape
        return q.reshape(b, self.kv_heads, (h // self.kv_heads) * t, d)

    def attend(self, q: Tensor, kv: Cache, mask: Tensor | None, causal: bool) -> Tensor:
        """q [B, H, T, dh], kv entries [B, Hkv, S, dh], mask [B, 1, T|1, S] or None. Returns [B, H, T, dh]."""
        b, h, t, d = q.shape
        if causal:  # the group's queries share the query axis, so the triangle is spelled out once per member
            tri = causal_mask(t, kv["k"].shape[2], q.device)  # [T, S]
            mask = tri if mask is None else mask & tri
        if mask is not None and mask.shape[-2] > 1:
            mask = torch.cat([mask] * (h // self.kv_heads), dim=-2)  # [..., g·T, S], rows as in _grouped
        out = super().attend(self._grouped(q), kv, mask, False).reshape(b, h, t, d)
        if "A" in self.capture:  # the map per query head, as every mechanism captures it: [B, H, T, S]
            self.captured["A"] = self.captured["A"].reshape(b, h, t, -1)
        return out

    def attend_step(self, q: Tensor, past: Cache, new: Cache, grown: Cache) -> Tensor:
        """The exported decoding step (see `MultiHeadAttention.attend_step`), each group's queries at once."""
        if "A" in self.capture or self.training:
            return self.attend(q, grown, None, False)
        b, h, t, d = q.shape
        return super().attend_step(self._grouped(q), past, new, grown).reshape(b, h, t, d)

    def check_head_removal(self) -> None:
        raise HeadPruningUnsupported(
            f"{type(self).__name__}: query heads share key/value heads in groups of {self.num_heads // self.kv_heads}; "
            "removing query heads would leave groups of unequal size. Gate them off instead (remove_heads=false)"
        )

    def keep_heads(self, heads: list[int]) -> None:  # type: ignore[override]
        """Refused: see `check_head_removal`."""
        self.check_head_removal()

    @torch.no_grad()
    def pool_heads(self, state: dict[str, Tensor], prefix: str) -> None:
        """Turn a multi-head module's weights in `state` (keys `prefix` + `k_proj.weight`, …) into this module's, in
        place: each group's key and value heads replaced by their mean (Ainslie et al. 2023 §2.1). Weights that
        already have this module's shapes are left as they are."""
        group = self.num_heads // self.kv_heads
        for name in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
            key = prefix + name
            if key not in state or state[key].shape[0] != self.num_heads * self.head_dim:
                continue
            w = state[key]  # [H·dh, *]
            state[key] = w.reshape(self.kv_heads, group, self.head_dim, *w.shape[1:]).mean(dim=1).flatten(0, 1)


def pool_key_value_heads(modules: dict[str, Attention], state: dict[str, Tensor]) -> int:
    """Mean-pool a multi-head checkpoint's key/value heads into every grouped module of `modules` (module name →
    module, as `Transformer.attention_modules` gives them); returns how many modules were grouped."""
    grouped = {name: m for name, m in modules.items() if isinstance(m, GroupedQueryAttention)}
    for name, module in grouped.items():
        module.pool_heads(state, f"{name}.")
    return len(grouped)


__all__ = ["GroupedQueryAttention", "pool_key_value_heads"]
