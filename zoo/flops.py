"""Analytic FLOPs and parameter counts, the size numbers reports put next to BLEU/ROUGE.

Why analytic: torch's FLOP counter sees only the matmuls it has formulas for and counts the fused
SDPA kernel (our default attention path on CPU), `cdist` and cumsum as 0 (zoo/DESIGN.md §3c), so a
mechanism comparison (MGK, MLK, pruned GHT-PS models) would be skewed by whichever kernel a
variant happens to use. These formulas depend only on shapes; tests cross-check them against
`torch.utils.flop_counter.FlopCounterMode` on explicit-matmul paths.

Conventions (the same for every entry in the zoo):
  * one multiply-add = 2 FLOPs; an [M, K] @ [K, N] product costs 2·M·K·N;
  * only matrix products are counted: bias adds, softmax, scaling, masking, activations,
    dropout, residual adds and LayerNorm are ignored (each is O(T·D) against O(T·D²) matmuls,
    and torch's counter ignores them too, so the cross-check is exact);
  * embedding lookups (and the sinusoidal positions) cost 0;
  * one sentence pair (batch 1), source length S, target length T, teacher-forced: the decoder
    runs once over all T positions (training / scoring cost, not incremental decoding), and
    causal self-attention is charged for the full T×T score matrix, as the kernels compute it;
  * heads that are only gated off (GHT-PS fine-tuning, `heads_removed=False`) still cost FLOPs;
    only physically removed heads (`apply_head_plan(..., remove=True)`) are saved.

Per attention module with H heads of size dh (its own H and dh — pruned modules differ),
model width D, q_len Tq and kv_len Tk (the standard softmax(q kᵀ/√dh) v formula):
    q_proj 2·Tq·D·H·dh + k_proj 2·Tk·D·H·dh + v_proj 2·Tk·D·H·dh + out_proj 2·Tq·H·dh·D
    + q kᵀ 2·H·Tq·Tk·dh + (softmax) v 2·H·Tq·Tk·dh
(projection costs are read off the actual `nn.Linear` shapes, so extra key projections are
included automatically). A mechanism whose core differs (MGK, MLK, …) defines
`flops(q_len, kv_len) -> int` on its class and that count is used for the whole module instead;
the per-module helpers it builds on live in `zoo.attention.flops`.
FFN: 2·L·D·F + 2·L·F·D. Output projection to the vocabulary: 2·T·D·V.
"""

from __future__ import annotations

from typing import Any

from zoo.attention import Attention

# The per-module helpers live in the attention package (mechanisms' own flops() use them, and the package must not
# import this module, which imports the model); re-exported here for callers of zoo.flops.
from zoo.attention.flops import dot_product_core_flops, linear_flops, projection_flops
from zoo.model import FeedForward, Transformer, count_parameters

#: source length the papers' size tables are quoted at (IWSLT-like sentence length).
DEFAULT_SRC_LEN = 30


def attention_flops(module: Attention, q_len: int, kv_len: int) -> int:
    """FLOPs of one attention module for q_len queries over kv_len keys.

    Uses the module's own `flops(q_len, kv_len)` if its mechanism defines one (its core is not a
    plain dot product), otherwise projections + the standard scaled-dot-product core with the
    module's current num_heads and head_dim (so pruned and fixed-head-size modules are right).
    """
    own = getattr(module, "flops", None)
    if callable(own):
        return int(own(q_len, kv_len))
    return projection_flops(module, q_len, kv_len) + dot_product_core_flops(
        module.num_heads, module.head_dim, q_len, kv_len
    )


def ffn_flops(ffn: FeedForward, length: int) -> int:
    """Position-wise FFN: fc1 [L, D] @ [D, F] then fc2 [L, F] @ [F, D]."""
    return linear_flops(ffn.fc1, length) + linear_flops(ffn.fc2, length)


def model_flops(model: Transformer, src_len: int = DEFAULT_SRC_LEN, tgt_len: int | None = None) -> dict[str, Any]:
    """Forward FLOPs of one teacher-forced sentence pair (conventions in the module docstring).

    Returns {"encoder", "decoder", "output_proj", "total", "per_module": {name: flops},
    "src_len", "tgt_len"}; per-module names are the model's stable module names
    ("encoder.layers.0.self_attn", "decoder.layers.1.ffn", "output_proj", …). "decoder" excludes
    the vocabulary projection, which is reported separately because it dominates small models.
    """
    if src_len < 1:
        raise ValueError(f"src_len must be >= 1, got {src_len}")
    tgt_len = src_len if tgt_len is None else tgt_len
    if tgt_len < 1:
        raise ValueError(f"tgt_len must be >= 1, got {tgt_len}")
    per_module: dict[str, int] = {}
    encoder = 0
    for i, layer in enumerate(model.encoder.layers):
        per_module[f"encoder.layers.{i}.self_attn"] = attention_flops(layer.self_attn, src_len, src_len)
        per_module[f"encoder.layers.{i}.ffn"] = ffn_flops(layer.ffn, src_len)
        encoder += per_module[f"encoder.layers.{i}.self_attn"] + per_module[f"encoder.layers.{i}.ffn"]
    decoder = 0
    for i, layer in enumerate(model.decoder.layers):
        per_module[f"decoder.layers.{i}.self_attn"] = attention_flops(layer.self_attn, tgt_len, tgt_len)
        per_module[f"decoder.layers.{i}.cross_attn"] = attention_flops(layer.cross_attn, tgt_len, src_len)
        per_module[f"decoder.layers.{i}.ffn"] = ffn_flops(layer.ffn, tgt_len)
        decoder += sum(per_module[f"decoder.layers.{i}.{part}"] for part in ("self_attn", "cross_attn", "ffn"))
    # logits [T, D] @ [D, V], tied to the target embedding or a separate output_proj: same shape.
    weight = model.output_proj.weight if model.output_proj is not None else model.tgt_embed.weight
    vocab, d_model = weight.shape
    output_proj = 2 * tgt_len * d_model * vocab
    per_module["output_proj"] = output_proj
    return {
        "encoder": encoder,
        "decoder": decoder,
        "output_proj": output_proj,
        "total": encoder + decoder + output_proj,
        "per_module": per_module,
        "src_len": src_len,
        "tgt_len": tgt_len,
    }


def size_summary(model: Transformer, src_len: int = DEFAULT_SRC_LEN) -> dict[str, Any]:
    """Parameters with and without embeddings plus forward FLOPs at `src_len` (= tgt_len): the
    three size numbers the GHT/MGK papers print next to quality."""
    flops = model_flops(model, src_len)
    return {
        "params": count_parameters(model, include_embeddings=True),
        "params_excl_emb": count_parameters(model, include_embeddings=False),
        "flops": flops["total"],
        "src_len": flops["src_len"],
        "tgt_len": flops["tgt_len"],
    }


def _scaled(value: float, units: tuple[tuple[float, str], ...]) -> str:
    # three significant figures without exponent notation: 9.87M, 44.1M, 123M
    scale, suffix = next(((s, u) for s, u in units if abs(value) >= s), units[-1])
    x = value / scale
    digits = 2 if abs(x) < 10 else 1 if abs(x) < 100 else 0
    return f"{x:.{digits}f}{suffix}"


_COUNT_UNITS = ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1.0, ""))
_FLOP_UNITS = ((1e12, " TFLOPs"), (1e9, " GFLOPs"), (1e6, " MFLOPs"), (1e3, " KFLOPs"), (1.0, " FLOPs"))


def format_count(n: float) -> str:
    """A parameter count as the papers print it: 5.53M."""
    return _scaled(n, _COUNT_UNITS)


def format_flops(n: float) -> str:
    """A FLOP count with its unit: 461 MFLOPs."""
    return _scaled(n, _FLOP_UNITS).strip()


def format_size_summary(d: dict[str, Any]) -> str:
    """One line for logs and report tables, e.g. "params 9.87M (excl. emb 6.12M) · 1.23 GFLOPs @ src 30"."""
    return (
        f"params {_scaled(d['params'], _COUNT_UNITS)} (excl. emb {_scaled(d['params_excl_emb'], _COUNT_UNITS)})"
        f" · {_scaled(d['flops'], _FLOP_UNITS)} @ src {d['src_len']}"
    )
