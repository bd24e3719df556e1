"""Attention mechanisms, selected by a stable string key (kept in checkpoints, ONNX metadata and
Triton model names — never a Python import path)."""

from __future__ import annotations

from typing import Any

from zoo.attention.base import FEATURE_MAPS, Attention, Cache, HeadPruningUnsupported, causal_mask, reorder_cache
from zoo.attention.gqa import GroupedQueryAttention, pool_key_value_heads
from zoo.attention.linear import LinearAttention, MixtureOfLinearKeys
from zoo.attention.mgk import MixtureOfGaussianKeys
from zoo.attention.mha import MultiHeadAttention
from zoo.attention.mixhead import MixheadAttention

ATTENTION_REGISTRY: dict[str, type[Attention]] = {
    "mha": MultiHeadAttention,
    "mgk": MixtureOfGaussianKeys,
    "mlk": MixtureOfLinearKeys,
    "linear": LinearAttention,
    "mixhead": MixheadAttention,
    "gqa": GroupedQueryAttention,
}


def build_attention(
    key: str, d_model: int, num_heads: int, head_dim: int | None = None, dropout: float = 0.0, **options: Any
) -> Attention:
    """Instantiate the mechanism registered under `key`."""
    try:
        cls = ATTENTION_REGISTRY[key]
    except KeyError:
        raise ValueError(
            f"unknown attention mechanism {key!r}; registered: {', '.join(sorted(ATTENTION_REGISTRY))}"
        ) from None
    return cls(d_model, num_heads, head_dim=head_dim, dropout=dropout, **options)


__all__ = [
    "ATTENTION_REGISTRY",
    "FEATURE_MAPS",
    "Attention",
    "Cache",
    "HeadPruningUnsupported",
    "build_attention",
    "causal_mask",
    "pool_key_value_heads",
    "reorder_cache",
]
