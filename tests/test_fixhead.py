"""Fixed head size (concise multi-head attention): the `head_dim` option, and the `fixhead` entry."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.zoo_testing import compose_train, random_batch, tiny_model
from zoo.attention import build_attention
from zoo.attention.mha import MultiHeadAttention
from zoo.model import ModelConfig, build_model, count_parameters


def fixed_head_reference(m: MultiHeadAttention, x: Tensor, mem: Tensor, pad: Tensor | None) -> Tensor:
    """The paper's FixedMultiHead written per head: head_i = softmax((W_q^i x)(W_k^i m)ᵀ / √d_p) W_v^i m,
    out = W_o [head_1; …; head_H] (+ biases), W_q^i, W_k^i, W_v^i ∈ R^{d_p × d_model}."""
    dp = m.head_dim
    heads = []
    for i in range(m.num_heads):
        rows = slice(i * dp, (i + 1) * dp)
        q = F.linear(x, m.q_proj.weight[rows], m.q_proj.bias[rows])  # [B, T, d_p]
        k = F.linear(mem, m.k_proj.weight[rows], m.k_proj.bias[rows])  # [B, S, d_p]
        v = F.linear(mem, m.v_proj.weight[rows], m.v_proj.bias[rows])  # [B, S, d_p]
        logits = q @ k.transpose(1, 2) / math.sqrt(dp)  # [B, T, S]
        if pad is not None:
            logits = logits.masked_fill(pad[:, None, :], float("-inf"))
        heads.append(logits.softmax(-1) @ v)
    return m.out_proj(torch.cat(heads, dim=-1))  # [B, T, H·d_p] -> [B, T, d_model]


def _inputs(d_model: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    x, mem = torch.randn(2, 5, d_model, generator=g), torch.randn(2, 7, d_model, generator=g)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    return x, mem, pad


def test_head_dim_equal_to_d_model_over_heads_is_vanilla() -> None:
    torch.manual_seed(0)
    vanilla = MultiHeadAttention(32, 4)
    fixed = MultiHeadAttention(32, 4, head_dim=8)
    fixed.load_state_dict(vanilla.state_dict())  # same shapes, so the same weights load
    x, mem, pad = _inputs(32)
    with torch.no_grad():
        assert torch.equal(fixed(x, mem, key_padding_mask=pad), vanilla(x, mem, key_padding_mask=pad))
        assert torch.equal(fixed(x, causal=True), vanilla(x, causal=True))
    # and whole models: head_dim=d_model/H equals the default
    cfg = dict(vocab_size=40, d_model=32, encoder_layers=1, decoder_layers=1, num_heads=4, ffn_dim=32)
    torch.manual_seed(1)
    a = build_model(ModelConfig(**cfg)).eval()
    b = build_model(ModelConfig(**cfg, head_dim=8)).eval()
    b.load_state_dict(a.state_dict())
    src, tgt = random_batch(vocab=40)
    with torch.no_grad():
        assert torch.equal(a(src, tgt), b(src, tgt))


@pytest.mark.parametrize(("d_model", "heads", "dp"), [(32, 16, 64), (32, 2, 5), (30, 7, 8)])
def test_fixed_head_size_shapes_scaling_and_reference(d_model: int, heads: int, dp: int) -> None:
    torch.manual_seed(0)
    m = build_attention("mha", d_model, heads, head_dim=dp).eval()
    assert (m.num_heads, m.head_dim) == (heads, dp)
    for name in ("q_proj", "k_proj", "v_proj"):
        assert getattr(m, name).weight.shape == (heads * dp, d_model)
    assert m.out_proj.weight.shape == (d_model, heads * dp)
    x, mem, pad = _inputs(d_model)
    with torch.no_grad():
        out = m(x, mem, key_padding_mask=pad)
        assert out.shape == (2, 5, d_model)
        assert torch.allclose(out, fixed_head_reference(m, x, mem, pad), atol=1e-5, rtol=0)
        m.capture = ("A", "V")  # explicit path: the scores are scaled by 1/√d_p, not 1/√(d_model/H)
        m(x, mem, key_padding_mask=pad)
        assert m.captured["A"].shape == (2, heads, 5, 7) and m.captured["V"].shape == (2, heads, 7, dp)
        q, k = m._split(m.q_proj(x)), m._split(m.k_proj(mem))
        logits = (q @ k.transpose(-1, -2) / math.sqrt(dp)).masked_fill(pad[:, None, None, :], float("-inf"))
        assert torch.allclose(m.captured["A"], logits.softmax(-1), atol=1e-6)
        cache: dict[str, Tensor] = {}
        m.capture = ()
        steps = torch.cat([m(x[:, i : i + 1], causal=True, cache=cache) for i in range(5)], dim=1)
        assert cache["k"].shape == cache["v"].shape == (2, heads, 5, dp)
        assert torch.allclose(steps, m(x, causal=True), atol=1e-5, rtol=0)


def test_keep_heads_is_exact_with_fixed_head_size() -> None:
    torch.manual_seed(0)
    m = build_attention("mha", 24, 6, head_dim=10).eval()
    with torch.no_grad():
        m.v_proj.bias.normal_()  # a surviving value bias would show up if gating were inexact
    kept = [5, 1, 3]
    x, mem, pad = _inputs(24)
    with torch.no_grad():
        m.head_gate.zero_()
        m.head_gate[kept] = 1
        gated = m(x, mem, key_padding_mask=pad)
        m.keep_heads(kept)
        assert (m.num_heads, m.head_dim, m.q_proj.out_features, m.out_proj.in_features) == (3, 10, 30, 30)
        assert torch.allclose(m(x, mem, key_padding_mask=pad), gated, atol=1e-6, rtol=0)


def test_fixhead_entry() -> None:
    small = compose_train(["+model=fixhead"]).model  # size=small: d_model 256
    assert (small.attention, small.num_heads, small.head_dim, small.d_model) == ("mha", 16, 32, 256)
    base = compose_train(["+model=fixhead", "size=base"]).model
    assert (base.num_heads, base.head_dim) == (16, 64)
    more = compose_train(["+model=fixhead", "model.num_heads=32"]).model
    assert (more.num_heads, more.head_dim) == (32, 32)  # adding heads keeps the head size
    model = tiny_model("fixhead")  # size=tiny: d_model 32, 16 heads of 4: width 64 ≠ d_model
    attn = model.encoder.layers[0].self_attn
    assert (attn.num_heads, attn.head_dim, attn.q_proj.weight.shape) == (16, 4, (64, 32))
    baseline = tiny_model("transformer")
    d, inner, modules = 32, 64, 2 + 2 * 2  # size=tiny: 2 encoder self + 2 × (decoder self + cross)
    extra = modules * (4 * d * (inner - d) + 3 * (inner - d))  # wider q/k/v/out weights + q/k/v biases
    assert count_parameters(model) - count_parameters(baseline) == extra
