"""Linear attention and MLK (zoo.attention.linear) against dense reference formulas.

The references build the full T×S kernel matrix φ(q_i)·Σ_r π_r φ(k_jr) with an explicit mask and
normalise it row by row — the O(T·S) form the module's running sums must reproduce exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from tests.zoo_testing import compose_train
from zoo.attention import build_attention, reorder_cache
from zoo.attention.linear import LinearAttention, MixtureOfLinearKeys
from zoo.flops import size_summary
from zoo.model import ModelConfig, build_model

D, H, DH = 12, 3, 5  # head_dim 5 ≠ d_model / H
B, T, S = 2, 7, 5
EPS = 1e-6


def make(cls: type = MixtureOfLinearKeys, **options) -> MixtureOfLinearKeys:
    torch.manual_seed(0)
    module = cls(D, H, head_dim=DH, **options).double().eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.normal_(0, 0.3)
            if name == "pi_logits":
                p.normal_()
    return module


def heads(x: Tensor, layer: torch.nn.Linear) -> Tensor:
    # [B, L, D] -> [B, H, L, DH]
    return F.linear(x, layer.weight, layer.bias).view(x.shape[0], x.shape[1], -1, DH).transpose(1, 2)


def phi(x: Tensor) -> Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x))  # elu(x) + 1, written out


def dense_reference(module: MixtureOfLinearKeys, x: Tensor, source: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """h_i = Σ_j Σ_r π_r φ(q_i)·φ(k_jr) v_j / Σ_j Σ_r π_r φ(q_i)·φ(k_jr) over valid [B, T, S] pairs
    (paper Eqn. 13; M = 1 is plain linear attention). Returns (module output, attention map)."""
    q, v = heads(x, module.q_proj), heads(source, module.v_proj)
    m = module.num_components
    if module.shared_key:
        k = heads(source, module.k_proj)
        keys = [k] + [k + module.key_shifts[None, :, r, None, :] for r in range(m - 1)]
    else:
        keys = [heads(source, getattr(module, "k_proj" if r == 0 else f"k_proj{r}")) for r in range(m)]
    pi = module.pi_logits.softmax(-1) if m > 1 else torch.ones(H, 1, dtype=x.dtype)
    kernel = sum(pi[None, :, r, None, None] * (phi(q) @ phi(k).transpose(-1, -2)) for r, k in enumerate(keys))
    kernel = kernel * valid[:, None].to(kernel.dtype)  # [B, H, T, S]
    attn = kernel / (kernel.sum(-1, keepdim=True) + EPS)
    out = attn @ v  # [B, H, T, DH]
    return module.out_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], H * DH)), attn


def inputs(seed: int = 3) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    memory = torch.randn(B, S, D, generator=g, dtype=torch.float64)
    x_pad = torch.zeros(B, T, dtype=torch.bool)
    x_pad[0, -3:] = True
    mem_pad = torch.zeros(B, S, dtype=torch.bool)
    mem_pad[1, -2:] = True
    return x, memory, x_pad, mem_pad


VARIANTS = [
    (LinearAttention, {}),
    (MixtureOfLinearKeys, {}),
    (MixtureOfLinearKeys, {"num_components": 3}),
    (MixtureOfLinearKeys, {"shared_key": True}),
]


# ------------------------------------------------------------------------------------------ formulas
@pytest.mark.parametrize(("cls", "options"), VARIANTS)
def test_non_causal_paths_equal_dense_formula(cls: type, options: dict) -> None:
    module = make(cls, **options)
    x, memory, x_pad, mem_pad = inputs()
    with torch.no_grad():
        enc = module(x, key_padding_mask=x_pad)
        expected_enc, _ = dense_reference(module, x, x, (~x_pad)[:, None, :].expand(B, T, T))
        cross = module(x, memory, key_padding_mask=mem_pad)
        expected_cross, _ = dense_reference(module, x, memory, (~mem_pad)[:, None, :].expand(B, T, S))
    keep = ~x_pad  # padded query rows are never read
    assert torch.allclose(enc[keep], expected_enc[keep], atol=1e-10, rtol=0)
    assert torch.allclose(cross, expected_cross, atol=1e-10, rtol=0)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 64])
@pytest.mark.parametrize(("cls", "options"), VARIANTS)
def test_causal_running_sums_equal_dense_masked_formula(cls: type, options: dict, chunk_size: int) -> None:
    module = make(cls, chunk_size=chunk_size, **options)
    x = inputs()[0]
    with torch.no_grad():
        out = module(x, causal=True)
        expected, _ = dense_reference(module, x, x, torch.ones(T, T, dtype=torch.bool).tril()[None].expand(B, T, T))
    assert torch.allclose(out, expected, atol=1e-10, rtol=0)


def test_linear_is_mlk_with_one_key() -> None:
    linear = make(LinearAttention)
    assert linear.num_components == 1 and linear.key_projections == ("k_proj", "v_proj")
    assert not any("pi" in n or "shift" in n for n, _ in linear.named_parameters())
    mlk = make(MixtureOfLinearKeys)
    with torch.no_grad():  # MLK with π = (1, 0) is linear attention with the first key projection
        mlk.pi_logits.copy_(torch.tensor([[0.0, -float("inf")]] * H))
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(mlk, name).load_state_dict(getattr(linear, name).state_dict())
        x = inputs()[0]
        assert torch.allclose(mlk(x, causal=True), linear(x, causal=True), atol=1e-12, rtol=0)


def test_padded_keys_contribute_nothing() -> None:
    module = make()
    x, memory, _, mem_pad = inputs()
    changed = memory.clone()
    changed[mem_pad] = 100.0  # whatever sits at padded positions
    with torch.no_grad():
        a = module(x, memory, key_padding_mask=mem_pad)
        b = module(x, changed, key_padding_mask=mem_pad)
        longer = module(x, F.pad(memory, (0, 0, 0, 3), value=5.0), key_padding_mask=F.pad(mem_pad, (0, 3), value=True))
    assert torch.allclose(a, b, atol=1e-12, rtol=0) and torch.allclose(a, longer, atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------ caches
@pytest.mark.parametrize(("cls", "options"), VARIANTS)
def test_incremental_running_sums_equal_full_pass(cls: type, options: dict) -> None:
    module = make(cls, chunk_size=3, **options)
    x, memory, _, mem_pad = inputs()
    with torch.no_grad():
        full_self = module(x, causal=True)
        full_cross = module(x, memory, key_padding_mask=mem_pad)
        self_cache: dict[str, Tensor] = {}
        cross_cache: dict[str, Tensor] = {}
        steps_self, steps_cross = [], []
        for i in range(T):
            steps_self.append(module(x[:, i : i + 1], causal=True, cache=self_cache))
            # O(1) state: the summed KV and normaliser, not per-position keys, batch first
            assert set(self_cache) == {"kv", "z"}
            assert self_cache["kv"].shape == (B, H, DH, DH) and self_cache["z"].shape == (B, H, 1, DH)
            cached = dict(cross_cache)
            steps_cross.append(module(x[:, i : i + 1], memory, key_padding_mask=mem_pad, cache=cross_cache))
            assert set(cross_cache) == {"kv", "z"}
            if cached:  # the source is summed once
                assert all(cross_cache[n] is cached[n] for n in cached)
    assert torch.allclose(full_self, torch.cat(steps_self, 1), atol=1e-10, rtol=0)
    assert torch.allclose(full_cross, torch.cat(steps_cross, 1), atol=1e-10, rtol=0)
    # a multi-token chunk on top of a cached prefix (prefix of 3, then 4 tokens at once)
    with torch.no_grad():
        cache: dict[str, Tensor] = {}
        head = module(x[:, :3], causal=True, cache=cache)
        tail = module(x[:, 3:], causal=True, cache=cache)
    assert torch.allclose(full_self, torch.cat([head, tail], 1), atol=1e-10, rtol=0)
    order = torch.tensor([1, 0, 0])
    before = {n: t.clone() for n, t in self_cache.items()}
    reorder_cache(self_cache, order)
    assert all(torch.equal(self_cache[n], before[n][order]) for n in before)


# ------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize(("cls", "options"), VARIANTS)
def test_keep_heads_equals_gated_heads(cls: type, options: dict) -> None:
    module = make(cls, **options)
    keep = [2, 0]
    pruned = copy.deepcopy(module)
    module.head_gate.copy_(torch.tensor([1.0, 0.0, 1.0]))
    pruned.keep_heads(keep)
    assert pruned.num_heads == 2
    if module.num_components > 1:
        assert torch.equal(pruned.pi_logits, module.pi_logits[keep])
    x, memory, x_pad, mem_pad = inputs()
    with torch.no_grad():
        for args, kwargs in (
            ((x,), {"key_padding_mask": x_pad}),
            ((x,), {"causal": True}),
            ((x, memory), {"key_padding_mask": mem_pad}),
        ):
            assert torch.allclose(module(*args, **kwargs), pruned(*args, **kwargs), atol=1e-12, rtol=0)


def test_capture_feature_maps() -> None:
    module = make()
    module.capture = ("A", "V", "O")
    x, memory, _, mem_pad = inputs()
    with torch.no_grad():
        module(x, causal=True)
        _, attn = dense_reference(module, x, x, torch.ones(T, T, dtype=torch.bool).tril()[None].expand(B, T, T))
        assert torch.allclose(module.captured["A"], attn, atol=1e-10, rtol=0)
        assert module.captured["V"].shape == (B, H, T, DH) and module.captured["O"].shape == (B, H, T, DH)
        module(x, memory, key_padding_mask=mem_pad)
        _, attn = dense_reference(module, x, memory, (~mem_pad)[:, None, :].expand(B, T, S))
        assert torch.allclose(module.captured["A"], attn, atol=1e-10, rtol=0)
        assert torch.allclose(module.captured["A"].sum(-1), torch.ones(B, H, T, dtype=torch.float64))
        # cached steps see earlier positions only through the running sums: no stale maps are left behind
        cache: dict[str, Tensor] = {}
        module(x[:, :1], causal=True, cache=cache)
        module(x[:, 1:2], causal=True, cache=cache)
        assert set(module.captured) == {"O"}


def test_invalid_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        build_attention("mlk", D, H, chunk_size=0)
    with pytest.raises(TypeError):
        build_attention("linear", D, H, num_components=2)  # "linear" is the single-key baseline
    with pytest.raises(ValueError, match="key masks"):
        make().attend(
            torch.randn(B, H, T, DH, dtype=torch.float64),
            {"k": torch.rand(B, H, T, DH, dtype=torch.float64), "v": torch.rand(B, H, T, DH, dtype=torch.float64)},
            torch.ones(B, 1, T, T, dtype=torch.bool),
            False,
        )


# ------------------------------------------------------------------------------------------ size
@pytest.mark.parametrize(("cls", "options"), VARIANTS)
def test_flops_match_torch_counter_on_non_causal_paths(cls: type, options: dict) -> None:
    module = make(cls, **options)
    x, memory, _, _ = inputs()
    for args, (q_len, kv_len) in (((x,), (T, T)), ((x, memory), (T, S))):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(*args)
        assert module.flops(q_len, kv_len) * B == counter.get_total_flops()


def test_mlk_4head_is_smaller_than_linear_8head() -> None:
    def summary(entry: str) -> dict:
        cfg = compose_train([f"+model={entry}", "size=small"]).model
        fields = {k: v for k, v in cfg.items() if k != "name"}
        fields["attention_options"] = dict(fields["attention_options"])
        torch.manual_seed(0)
        return size_summary(build_model(ModelConfig(vocab_size=1000, **fields)))

    linear, mlk = summary("linear_8head"), summary("mlk_4head")
    assert mlk["params_excl_emb"] < linear["params_excl_emb"] and mlk["flops"] < linear["flops"]
