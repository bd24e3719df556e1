"""Per-head feature-map points for grouping: each head's V, A or O map flattened over the valid
(non-padding) positions of the batch is one point (the paper's e_{i,l})."""

from __future__ import annotations

from torch import Tensor

from zoo.attention import Attention

# module kinds → (query side, key side); "src"/"tgt" name the batch tensors that give the masks
MODULE_KINDS = {"encoder_self": ("src", "src"), "decoder_self": ("tgt", "tgt"), "decoder_cross": ("tgt", "src")}


def module_kind(name: str) -> str:
    """ "encoder.layers.0.self_attn" → "encoder_self", "decoder.layers.1.cross_attn" → "decoder_cross"."""
    side = name.split(".")[0]
    kind = "cross" if name.endswith("cross_attn") else "self"
    return f"{side}_{kind}"


def head_points(module: Attention, feature_map: str, q_valid: Tensor, k_valid: Tensor) -> Tensor:
    """[H, F] points from the module's captured maps; masks are [B, T] / [B, S] bool, True = real token.

    Padded positions are zeroed rather than dropped: zeros add nothing to dot products, norms or
    Euclidean distances, so cosine similarities and k-means are exactly those of the unpadded
    points — and the backward pass avoids index_put accumulation, which is not deterministic on CPU."""
    if feature_map == "V":
        v = module.captured["V"]  # [B, H, S, dh]
        x = v * k_valid[:, None, :, None].to(v.dtype)
    elif feature_map == "O":
        o = module.captured["O"]  # [B, H, T, dh]
        x = o * q_valid[:, None, :, None].to(o.dtype)
    elif feature_map == "A":
        a = module.captured["A"]  # [B, H, T, S]
        pairs = q_valid[:, :, None] & k_valid[:, None, :]  # [B, T, S]
        x = a * pairs[:, None].to(a.dtype)
    else:
        raise ValueError(f"unknown feature map {feature_map!r}; use V, A or O")
    return x.transpose(0, 1).reshape(x.shape[1], -1)  # [H, B*positions*features]
