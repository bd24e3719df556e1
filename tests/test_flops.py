"""Analytic FLOPs (zoo.flops) against torch's FLOP counter and against hand formulas.

torch's counter counts the fused SDPA kernel as 0 on CPU, so every cross-check forces the mha
module's explicit-matmul path by capturing the attention map (`capture = ("A",)`).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from zoo.flops import attention_flops, format_size_summary, model_flops, size_summary
from zoo.model import ModelConfig, Transformer, build_model, count_parameters

VOCAB = 53


def tiny(**overrides) -> Transformer:
    cfg = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        num_heads=4,
        ffn_dim=48,
        dropout=0.0,
        max_positions=64,
    )
    cfg.update(overrides)
    torch.manual_seed(0)
    return build_model(ModelConfig(**cfg)).eval()


def torch_counts(model: Transformer, src_len: int, tgt_len: int, batch: int = 1) -> tuple[int, dict[str, int]]:
    """(total, per-module) FLOPs torch counts for one explicit-path forward of `batch` pairs."""
    for m in model.attention_modules().values():
        m.capture = ("A",)
    src = torch.randint(4, VOCAB, (batch, src_len))  # no padding: every position is computed anyway
    tgt = torch.randint(4, VOCAB, (batch, tgt_len))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(src, tgt)
    per_module = {
        name.removeprefix("Transformer."): sum(ops.values())
        for name, ops in counter.get_flop_counts().items()
        if name.startswith("Transformer.")
    }
    return counter.get_total_flops(), per_module


@pytest.mark.parametrize(("src_len", "tgt_len"), [(7, 5), (9, 9), (1, 3)])
def test_matches_torch_flop_counter(src_len: int, tgt_len: int) -> None:
    model = tiny()
    ours = model_flops(model, src_len, tgt_len)
    total, per_module = torch_counts(model, src_len, tgt_len)
    assert ours["total"] == total
    for name, flops in ours["per_module"].items():
        if name != "output_proj":  # a bare matmul in decode(), not a submodule torch can attribute
            assert flops == per_module[name], name
    assert ours["encoder"] + ours["decoder"] + ours["output_proj"] == ours["total"]
    assert ours["output_proj"] == 2 * tgt_len * 32 * VOCAB


def test_batch_scales_linearly_and_default_tgt_len() -> None:
    model = tiny()
    total, _ = torch_counts(model, 6, 6, batch=3)
    assert model_flops(model, 6)["total"] * 3 == total
    assert model_flops(model, 6)["tgt_len"] == 6


def test_head_dim_independent_of_d_model() -> None:
    # 4 heads of 16 = inner width 64 on a d_model of 32 (fixed-head-size option)
    model = tiny(head_dim=16)
    total, _ = torch_counts(model, 7, 5)
    assert model_flops(model, 7, 5)["total"] == total
    attn = model.encoder.layers[0].self_attn
    d, h, dh, t = 32, 4, 16, 7
    assert attention_flops(attn, t, t) == 4 * (2 * t * d * h * dh) + 2 * (2 * h * t * t * dh)


def test_untied_output_projection() -> None:
    model = tiny(share_decoder_embeddings=False)
    total, _ = torch_counts(model, 7, 5)
    assert model_flops(model, 7, 5)["total"] == total


def test_pruned_model_saves_exactly_the_removed_heads() -> None:
    d, dh, s, t = 32, 8, 11, 6
    plan = {
        "encoder.layers.0.self_attn": [0, 2],
        "decoder.layers.1.self_attn": [3],
        "decoder.layers.0.cross_attn": [1, 2, 3],
    }
    full = model_flops(tiny(), s, t)
    model = tiny()
    model.apply_head_plan(plan, remove=True)
    pruned = model_flops(model, s, t)

    def per_head(q_len: int, kv_len: int) -> int:
        # one head: q/k/v/out projection slices + its share of q kᵀ and (softmax) v
        return 2 * q_len * d * dh * 2 + 2 * kv_len * d * dh * 2 + 2 * 2 * q_len * kv_len * dh

    saved = 2 * per_head(s, s) + 3 * per_head(t, t) + 1 * per_head(t, s)
    assert full["total"] - pruned["total"] == saved
    assert full["encoder"] - pruned["encoder"] == 2 * per_head(s, s)
    assert pruned["per_module"]["decoder.layers.1.self_attn"] == per_head(t, t)
    assert pruned["output_proj"] == full["output_proj"]
    total, _ = torch_counts(model, s, t)
    assert pruned["total"] == total


def test_gated_heads_still_cost_flops() -> None:
    model = tiny()
    model.apply_head_plan({"encoder.layers.0.self_attn": [0]}, remove=False)
    assert model_flops(model, 8)["total"] == model_flops(tiny(), 8)["total"]


def test_mechanism_supplied_flops_are_used() -> None:
    model = tiny()
    attn = model.decoder.layers[0].cross_attn
    attn.flops = lambda q_len, kv_len: 1000 * q_len + kv_len  # what an MGK/MLK class would define
    base = model_flops(tiny(), 7, 5)
    ours = model_flops(model, 7, 5)
    assert ours["per_module"]["decoder.layers.0.cross_attn"] == 5007
    assert ours["total"] - base["total"] == 5007 - base["per_module"]["decoder.layers.0.cross_attn"]


def test_size_summary_and_format() -> None:
    model = tiny()
    summary = size_summary(model)
    assert summary["params"] == count_parameters(model)
    assert summary["params_excl_emb"] == count_parameters(model, include_embeddings=False) < summary["params"]
    assert summary["flops"] == model_flops(model, 30)["total"]
    assert summary["src_len"] == 30
    line = format_size_summary(
        {"params": 9_870_000, "params_excl_emb": 6_120_000, "flops": 1_234_000_000, "src_len": 30}
    )
    assert line == "params 9.87M (excl. emb 6.12M) · 1.23 GFLOPs @ src 30"
    assert "MFLOPs" in format_size_summary(summary)


def test_rejects_bad_lengths() -> None:
    with pytest.raises(ValueError):
        model_flops(tiny(), 0)
