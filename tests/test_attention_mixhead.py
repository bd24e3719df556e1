"""Mixhead (variants A and B) against plain MHA and against a loop-based reference, on every path:
encoder self-attention, decoder self-attention (full and incremental) and cross-attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from tests.zoo_testing import random_batch, tiny_model
from zoo.attention import ATTENTION_REGISTRY, HeadPruningUnsupported, build_attention
from zoo.attention.mha import MultiHeadAttention
from zoo.attention.mixhead import MixheadAttention
from zoo.flops import attention_flops

D, H = 24, 4  # d_model, heads (head_dim 6)


def make_pair(variant: str, seed: int = 0, **options) -> tuple[MultiHeadAttention, MixheadAttention]:
    """An MHA module and a Mixhead module sharing every q/k/v/out weight (mixing at its identity init)."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(D, H)
    mix = MixheadAttention(D, H, variant=variant, **options)
    missing, unexpected = mix.load_state_dict(mha.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"mix", "mix_weight", "mix_bias"}
    with torch.no_grad():  # non-zero biases so the query bias matters for variant B's mixing
        for proj in (mix.q_proj, mix.k_proj, mix.v_proj, mix.out_proj):
            proj.bias.normal_(0, 0.3)
    mha.load_state_dict({k: v for k, v in mix.state_dict().items() if k in mha.state_dict()})
    return mha.eval(), mix.eval()


def randomise_mixing(module: MixheadAttention, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (getattr(module, n) for n in ("mix", "mix_weight", "mix_bias") if hasattr(module, n)):
            p.copy_(
                torch.randn(p.shape, generator=g) * 0.5 + (torch.eye(p.shape[0]) if p.shape[0] == p.shape[1] else 0)
            )


def inputs(b: int = 2, t: int = 5, s: int = 7, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """x [B, T, D] queries, mem [B, S, D] memory, pad [B, S] (True = padding) with row 0 padded."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, D, generator=g)
    mem = torch.randn(b, s, D, generator=g)
    pad = torch.zeros(b, s, dtype=torch.bool)
    pad[0, s - 3 :] = True
    return x, mem, pad


def reference(module: MixheadAttention, x: Tensor, memory: Tensor | None, pad: Tensor | None, causal: bool) -> Tensor:
    """Loop-based Mix-head attention straight from the paper: per batch row b, query position t and
    mixed head i, P̄_i[t] = Σ_j M[t]_{j,i} P_j[t] with M[t] = Q_tᵀ W + B (B) or the learned M (A)."""
    mem = x if memory is None else memory
    b, t, _ = x.shape
    s = mem.shape[1]
    h, dh = module.num_heads, module.head_dim
    q = F.linear(x, module.q_proj.weight, module.q_proj.bias).view(b, t, h, dh)
    k = F.linear(mem, module.k_proj.weight, module.k_proj.bias).view(b, s, h, dh)
    v = F.linear(mem, module.v_proj.weight, module.v_proj.bias).view(b, s, h, dh)
    heads = torch.zeros(b, t, h, dh)
    for bi in range(b):
        for ti in range(t):
            maps = []
            for j in range(h):
                logits = torch.stack([q[bi, ti, j] @ k[bi, si, j] / math.sqrt(dh) for si in range(s)])
                allowed = torch.ones(s, dtype=torch.bool)
                if pad is not None:
                    allowed &= ~pad[bi]
                if causal:
                    allowed &= torch.arange(s) <= ti
                maps.append(logits.masked_fill(~allowed, float("-inf")).softmax(-1))
            for i in range(h):
                mixed = torch.zeros(s)
                for j in range(h):
                    if module.variant == "avg":
                        m_ji = 1.0 / h  # Avghead: every mixed head is the mean of all heads' maps
                    elif module.variant == "a":
                        m_ji = module.mix[j, i]
                    else:
                        m_ji = q[bi, ti, j] @ module.mix_weight[:, i] + module.mix_bias[j, i]
                    mixed = mixed + m_ji * maps[j]
                heads[bi, ti, i] = sum(mixed[si] * v[bi, si, i] for si in range(s))
    heads = heads * module.head_gate[None, None, :, None]
    return F.linear(heads.reshape(b, t, h * dh), module.out_proj.weight, module.out_proj.bias)


# ------------------------------------------------------------------ identity mixing = vanilla attention
@pytest.mark.parametrize("variant", ["a", "b"])
def test_identity_mixing_equals_vanilla_attention(variant: str) -> None:
    mha, mix = make_pair(variant)
    mha.capture = ("A",)  # mha's explicit-matmul path: the same operations as Mixhead minus the mixing
    x, mem, pad = inputs()
    with torch.no_grad():
        for kwargs in ({"key_padding_mask": pad[:, :5]}, {"causal": True}, {"memory": mem, "key_padding_mask": pad}):
            assert torch.equal(mix(x, **kwargs), mha(x, **kwargs)), kwargs
            mha.capture = ()  # and the fused SDPA path up to rounding
            assert torch.allclose(mix(x, **kwargs), mha(x, **kwargs), atol=1e-6, rtol=0), kwargs
            mha.capture = ("A",)


def test_fresh_modules_start_as_identity_mixing() -> None:
    a = MixheadAttention(D, H, variant="a")
    b = MixheadAttention(D, H, variant="b")
    assert torch.equal(a.mix, torch.eye(H))
    assert torch.equal(b.mix_weight, torch.zeros(D // H, H)) and torch.equal(b.mix_bias, torch.eye(H))
    b.reset_parameters()
    assert torch.equal(b.mix_bias, torch.eye(H))


# ------------------------------------------------------------------ against the loop reference
@pytest.mark.parametrize("variant", ["a", "b", "avg"])
@pytest.mark.parametrize("path", ["self_padded", "causal", "cross"])
def test_matches_loop_reference(variant: str, path: str) -> None:
    _, mix = make_pair(variant)
    if variant != "avg":  # Avghead's M is fixed
        randomise_mixing(mix)
    x, mem, pad = inputs()
    kwargs, ref_args = {
        "self_padded": ({"key_padding_mask": pad[:, :5]}, (None, pad[:, :5], False)),
        "causal": ({"causal": True}, (None, None, True)),
        "cross": ({"memory": mem, "key_padding_mask": pad}, (mem, pad, False)),
    }[path]
    with torch.no_grad():
        assert torch.allclose(mix(x, **kwargs), reference(mix, x, *ref_args), atol=1e-5, rtol=0)


def test_avghead_mixing_is_fixed_uniform_and_adds_no_parameters() -> None:
    mha, avg = make_pair("avg", ortho_lambda=0.5)
    assert sum(p.numel() for p in avg.parameters()) == sum(p.numel() for p in mha.parameters())
    assert torch.equal(avg.mix, torch.full((H, H), 1.0 / H)) and not avg.mix.requires_grad
    assert avg.extra_loss() is None  # nothing to regularise
    avg.capture = ("A", "A_unmixed")
    x, _, pad = inputs()
    with torch.no_grad():
        avg(x, key_padding_mask=pad[:, :5])
    mixed, unmixed = avg.captured["A"], avg.captured["A_unmixed"]  # [B, H, T, S]
    assert torch.allclose(mixed, unmixed.mean(dim=1, keepdim=True).expand_as(mixed), atol=1e-6, rtol=0)


def test_variant_b_mixing_matrix_is_per_position_query_times_w_plus_bias() -> None:
    _, mix = make_pair("b")
    randomise_mixing(mix)
    q = torch.randn(2, H, 5, D // H)  # [B, H, T, dh]
    m = mix.mixing_matrix(q)  # [B, T, H, H]
    assert m.shape == (2, 5, H, H)
    for b in range(2):
        for t in range(5):
            expected = q[b, :, t, :] @ mix.mix_weight + mix.mix_bias  # Q_tᵀ W + B: [H_in, dh] @ [dh, H_out]
            assert torch.allclose(m[b, t], expected, atol=1e-6)


def test_gradients_reach_the_mixing_parameters() -> None:
    for variant, names in (("a", ["mix"]), ("b", ["mix_weight", "mix_bias"])):
        _, mix = make_pair(variant)
        x, _, pad = inputs()
        mix.train()(x, key_padding_mask=pad[:, :5]).pow(2).sum().backward()
        for n in names:
            assert getattr(mix, n).grad is not None and getattr(mix, n).grad.abs().sum() > 0, (variant, n)


# ------------------------------------------------------------------ orthogonality regulariser
def test_orthogonality_loss_variant_a() -> None:
    _, mix = make_pair("a", ortho_lambda=0.25)
    assert float(mix.extra_loss().detach()) == 0.0  # identity is orthogonal
    randomise_mixing(mix)
    m = mix.mix.detach()
    expected = 0.25 * sum(
        (float(m[:, a] @ m[:, c]) - (1.0 if a == c else 0.0)) ** 2 for a in range(H) for c in range(H)
    )
    assert math.isclose(float(mix.extra_loss().detach()), expected, rel_tol=1e-5)
    with torch.no_grad():  # any orthogonal matrix (a permutation with signs) costs nothing
        mix.mix.copy_(torch.eye(H)[[2, 0, 3, 1]] * torch.tensor([1.0, -1.0, 1.0, -1.0]))
    assert float(mix.extra_loss().detach()) == pytest.approx(0.0, abs=1e-12)
    mix.extra_loss().backward()  # differentiable in the parameter


def test_orthogonality_loss_variant_b_averages_over_positions() -> None:
    _, mix = make_pair("b", ortho_lambda=0.5)
    assert mix.extra_loss() is None  # variant B needs a forward pass first
    randomise_mixing(mix)
    x, _, pad = inputs()
    mix.train()(x, key_padding_mask=pad[:, :5])
    loss = mix.extra_loss()
    q = mix.q_proj(x).view(2, 5, H, D // H).detach()
    terms = []
    for b in range(2):
        for t in range(5):
            m = q[b, t] @ mix.mix_weight.detach() + mix.mix_bias.detach()  # [H_in, H_out]
            terms.append(float(((m.T @ m - torch.eye(H)) ** 2).sum()))
    assert math.isclose(float(loss.detach()), 0.5 * sum(terms) / len(terms), rel_tol=1e-5)
    loss.backward()
    assert mix.mix_weight.grad.abs().sum() > 0
    with torch.no_grad():  # inference keeps no regulariser (nor its graph)
        mix(x)
    assert mix.extra_loss() is None


def test_zero_lambda_returns_none_and_model_sums_modules() -> None:
    for variant in ("a", "b"):
        _, mix = make_pair(variant)
        x, _, _ = inputs()
        mix.train()(x)
        assert mix.extra_loss() is None
    model = tiny_model("mixhead_a", attention_options={"variant": "a", "ortho_lambda": 0.1}).train()
    for m in model.attention_modules().values():
        randomise_mixing(m)
    expected = sum(float(m.extra_loss().detach()) for m in model.attention_modules().values())
    assert math.isclose(float(model.extra_loss().detach()), expected, rel_tol=1e-6) and expected > 0


def test_module_with_pending_regulariser_can_be_deep_copied() -> None:
    import copy

    _, mix = make_pair("b", ortho_lambda=0.5)
    x, _, _ = inputs()
    mix.train()(x)
    assert mix.extra_loss() is not None
    clone = copy.deepcopy(mix)
    assert clone.extra_loss() is None and torch.equal(clone.mix_bias, mix.mix_bias)


# ------------------------------------------------------------------ every path mixes
@pytest.mark.parametrize("variant", ["a", "b"])
def test_incremental_decoder_self_attention_mixes_and_equals_full(variant: str) -> None:
    _, identity = make_pair(variant)
    _, mixed = make_pair(variant)
    randomise_mixing(mixed)
    x, _, _ = inputs(t=6)
    with torch.no_grad():
        full = mixed(x, causal=True)
        cache: dict[str, Tensor] = {}
        steps = torch.cat([mixed(x[:, i : i + 1], causal=True, cache=cache) for i in range(6)], dim=1)
        plain_cache: dict[str, Tensor] = {}
        plain = torch.cat([identity(x[:, i : i + 1], causal=True, cache=plain_cache) for i in range(6)], dim=1)
    assert torch.allclose(steps, full, atol=1e-5, rtol=0)
    assert torch.allclose(steps, reference(mixed, x, None, None, True), atol=1e-5, rtol=0)
    # from the second step on the new query mixes over cached keys; identity mixing gives other outputs
    assert (steps - plain)[:, 1:].abs().amax() > 1e-3


@pytest.mark.parametrize("variant", ["a", "b"])
def test_cached_cross_attention_mixes_and_equals_full(variant: str) -> None:
    _, identity = make_pair(variant)
    _, mixed = make_pair(variant)
    randomise_mixing(mixed)
    x, mem, pad = inputs()
    with torch.no_grad():
        full = mixed(x, mem, key_padding_mask=pad)
        cache: dict[str, Tensor] = {}
        steps = torch.cat([mixed(x[:, i : i + 1], mem, key_padding_mask=pad, cache=cache) for i in range(5)], 1)
        assert set(cache) == {"k", "v"}  # memory projected once, reused at every step
        plain = identity(x, mem, key_padding_mask=pad)
    assert torch.allclose(steps, full, atol=1e-5, rtol=0)
    assert (full - plain).abs().amax() > 1e-3


@pytest.mark.parametrize("entry", ["mixhead_a", "mixhead_b"])
def test_model_with_mixing_everywhere_decodes_incrementally_like_full(entry: str) -> None:
    model = tiny_model(entry)
    identity = tiny_model(entry)
    for m in model.attention_modules().values():
        randomise_mixing(m)
    src, tgt = random_batch()
    with torch.no_grad():
        full = model(src, tgt)
        memory, pad = model.encode(src)
        state = model.init_state()
        steps = torch.cat([model.decode(tgt[:, i : i + 1], memory, pad, state, offset=i) for i in range(6)], 1)
        assert torch.allclose(full, steps, atol=1e-5, rtol=0)
        assert (full - identity(src, tgt)).abs().amax() > 1e-3
        # mixing only the cross-attention (resp. decoder self-attention) modules changes incremental outputs too
        for kind in ("cross_attn", "self_attn"):
            partial = tiny_model(entry)
            for name, m in partial.attention_modules().items():
                if name.startswith("decoder") and name.endswith(kind):
                    randomise_mixing(m)
            mem_p, pad_p = partial.encode(src)
            st = partial.init_state()
            inc = torch.cat([partial.decode(tgt[:, i : i + 1], mem_p, pad_p, st, offset=i) for i in range(6)], 1)
            assert (inc - identity(src, tgt)).abs().amax() > 1e-3, kind
            assert torch.allclose(inc, partial(src, tgt), atol=1e-5, rtol=0), kind


# ------------------------------------------------------------------ capture
def test_capture_a_is_the_mixed_map_and_a_unmixed_the_softmax_map() -> None:
    _, mix = make_pair("b")
    randomise_mixing(mix)
    x, _, pad = inputs()
    mix.capture = ("A", "A_unmixed", "V", "O")
    with torch.no_grad():
        mix(x, key_padding_mask=pad[:, :5])
    a, raw = mix.captured["A"], mix.captured["A_unmixed"]
    assert a.shape == raw.shape == (2, H, 5, 5)
    assert torch.allclose(raw.sum(-1), torch.ones(2, H, 5), atol=1e-6)
    q = mix._split(mix.q_proj(x))
    assert torch.allclose(a, mix.mix_maps(raw, mix.mixing_matrix(q)), atol=1e-6)
    assert torch.all(a[0, :, :, 4:] == 0) and a[0, :, :, :4].abs().amin() > 0  # padded key stays exactly 0
    assert mix.captured["V"].shape == (2, H, 5, D // H) and mix.captured["O"].shape == (2, H, 5, D // H)
    mix.capture = ()
    mix.captured.clear()
    with torch.no_grad():
        mix(x)
    assert not mix.captured  # free when off


# ------------------------------------------------------------------ heads
def test_keep_heads_refuses_with_a_clear_message() -> None:
    _, mix = make_pair("a")
    with pytest.raises(HeadPruningUnsupported, match="mix of ALL heads"):
        mix.keep_heads([0, 2])
    assert mix.num_heads == H and mix.q_proj.out_features == D  # nothing changed
    model = tiny_model("mixhead_b")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = list(model.attention_modules())
    for remove in (False, True):  # a head plan is refused before any module changes
        with pytest.raises(HeadPruningUnsupported, match="mixhead cannot remove heads"):
            model.apply_head_plan({names[0]: [0], names[-1]: [1, 2]}, remove=remove)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and not model.cfg.head_plan


def test_head_gate_still_zeros_the_mixed_head_output() -> None:
    """Gating stays well-defined: it equals zeroing the head's out_proj columns (its mixed output)."""
    _, mix = make_pair("b")
    randomise_mixing(mix)
    _, ref = make_pair("b")
    ref.load_state_dict(mix.state_dict())
    dh = D // H
    x, mem, pad = inputs()
    with torch.no_grad():
        mix.head_gate[1] = 0
        ref.out_proj.weight[:, dh : 2 * dh] = 0
        assert torch.allclose(mix(x, mem, key_padding_mask=pad), ref(x, mem, key_padding_mask=pad), atol=1e-6)
        assert torch.allclose(mix(x, mem, key_padding_mask=pad), reference(mix, x, mem, pad, False), atol=1e-5)


# ------------------------------------------------------------------ FLOPs, registry, options
@pytest.mark.parametrize("variant", ["a", "b"])
def test_flops_match_torch_counter(variant: str) -> None:
    _, mix = make_pair(variant)
    x, mem, _ = inputs(b=1)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        mix(x, mem)
    assert attention_flops(mix, 5, 7) == counter.get_total_flops()
    h, dh = H, D // H
    plain = 2 * (2 * 5 * D * h * dh) + 2 * (2 * 7 * D * h * dh) + 2 * (2 * h * 5 * 7 * dh)  # q,o @5; k,v @7; core
    extra = 2 * 5 * 7 * h * h + (2 * 5 * h * dh * h if variant == "b" else 0)
    assert mix.flops(5, 7) == plain + extra


def test_registry_and_options() -> None:
    assert ATTENTION_REGISTRY["mixhead"] is MixheadAttention
    m = build_attention("mixhead", D, H, variant="B", ortho_lambda=0.1)
    assert m.variant == "b" and m.ortho_lambda == 0.1
    with pytest.raises(ValueError, match="variant"):
        build_attention("mixhead", D, H, variant="c")
    with pytest.raises(ValueError, match="ortho_lambda"):
        build_attention("mixhead", D, H, ortho_lambda=-1.0)
    fixed = build_attention("mixhead", D, H, head_dim=10, variant="b")  # any head size works
    assert fixed.mix_weight.shape == (10, H)
    x, _, _ = inputs()
    assert fixed(x).shape == x.shape
