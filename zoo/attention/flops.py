"""FLOP formulas of one attention module, for mechanisms whose core is not a plain dot product.

A leaf of the attention package (it needs only the contract in `zoo.attention.base`): mechanisms import these
helpers in their own `flops(q_len, kv_len)`, and `zoo.flops` (the whole-model counts, which imports the model and
therefore every mechanism) builds on them — so the dependency runs one way, zoo.flops → zoo.attention.
Conventions (one multiply-add = 2 FLOPs, only matrix products counted) are documented in `zoo.flops`.
"""

from __future__ import annotations

from torch import nn

from zoo.attention.base import Attention


def linear_flops(layer: nn.Linear, length: int) -> int:
    """FLOPs of applying `layer` to `length` positions: [L, in] @ [in, out] = 2·L·in·out (bias ignored)."""
    return 2 * length * layer.in_features * layer.out_features


def projection_flops(module: Attention, q_len: int, kv_len: int) -> int:
    """Input/output projections of an attention module, from its actual layer shapes.

    Exposed so mechanisms that define their own `flops()` only have to add their core cost.
    Query-side layers (q_proj, out_proj) see q_len positions; every key-side layer named in
    `module.key_projections` (k, v, and e.g. MGK's second key projection) sees kv_len positions.
    """
    total = linear_flops(module.q_proj, q_len) + linear_flops(module.out_proj, q_len)
    for name in module.key_projections:
        total += linear_flops(getattr(module, name), kv_len)
    return total


def dot_product_core_flops(num_heads: int, head_dim: int, q_len: int, kv_len: int) -> int:
    """Scores q kᵀ ([H, Tq, dh] @ [H, dh, Tk]) plus weighted values ([H, Tq, Tk] @ [H, Tk, dh])."""
    return 2 * (2 * num_heads * q_len * kv_len * head_dim)
