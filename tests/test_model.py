"""Model-level contract tests, parametrized over every registered model entry."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.zoo_testing import ENTRIES, random_batch, tiny_model
from zoo.attention import HeadPruningUnsupported
from zoo.model import ModelConfig, build_model, count_parameters


@pytest.mark.parametrize("entry", ENTRIES)
def test_forward_backward_no_nan(entry: str) -> None:
    model = tiny_model(entry).train()
    src, tgt = random_batch()
    logits = model(src, tgt)
    assert logits.shape == (3, 6, 64)
    loss = F.cross_entropy(logits.reshape(-1, 64), tgt.roll(-1, 1).reshape(-1))
    extra = model.extra_loss()
    if extra is not None:
        loss = loss + extra
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("entry", ENTRIES)
def test_incremental_decoding_equals_full_forward(entry: str) -> None:
    full, steps = _full_and_stepwise(tiny_model(entry))
    assert torch.allclose(full, steps, atol=1e-5, rtol=0)


def _full_and_stepwise(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits [B, T, V] of one random batch, from the full forward and from incremental decoding."""
    src, tgt = random_batch()
    with torch.no_grad():
        full = model(src, tgt)  # [B, T, V]
        memory, pad = model.encode(src)
        state = model.init_state()
        steps = [model.decode(tgt[:, i : i + 1], memory, pad, state, offset=i) for i in range(tgt.shape[1])]
    return full, torch.cat(steps, dim=1)


@pytest.mark.parametrize("entry", ENTRIES)
def test_exported_decoding_step_equals_full_forward(entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a graph is exported, self-attention steps go through `attend_step` (MHA attends to the cached and
    the new positions apart, so the exported step never reads the grown cache): still the full forward."""
    model = tiny_model(entry)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    full, steps = _full_and_stepwise(model)
    assert torch.allclose(full, steps, atol=1e-5, rtol=0)


@pytest.mark.parametrize("entry", ENTRIES)
def test_cross_caches_shared_by_beams_equal_replicated_ones(entry: str) -> None:
    """The export's decoder keeps one cross-attention cache row per source and groups each source's beams
    against it (zoo.attention.base.per_source_step); the logits must equal those of a cache replicated per
    beam row, as zoo.decoding.generate keeps it, for every mechanism."""
    model = tiny_model(entry)
    src, tgt = random_batch()  # [B, S], [B, T]
    beams = 3
    rows = torch.arange(src.shape[0]).repeat_interleave(beams)  # [B·K] beams of a source are consecutive
    with torch.no_grad():
        memory, pad = model.encode(src)
        shared, replicated = model.init_state(), model.init_state()
        model.decode(tgt[:, :1], memory, pad, shared, offset=0)  # fills the per-source cross caches
        model.decode(tgt[rows, :1], memory[rows], pad[rows], replicated, offset=0)
        for layer in shared:  # the self caches follow the beam rows; the cross caches stay per source
            model.reorder_state([{"self": layer["self"]}], rows)
        for i in range(1, tgt.shape[1]):
            shift = torch.arange(beams).repeat(src.shape[0])[:, None]  # beams of a source see other tokens
            tokens = (tgt[rows, i : i + 1] + shift) % model.cfg.vocab_size
            a = model.decode(tokens, memory, pad, shared, offset=i)  # [B·K, 1, V]
            b = model.decode(tokens, memory[rows], pad[rows], replicated, offset=i)
            assert torch.allclose(a, b, atol=1e-5, rtol=0), i
    assert all(next(iter(layer["cross"].values())).shape[0] == src.shape[0] for layer in shared)


@pytest.mark.parametrize("entry", ENTRIES)
def test_padding_does_not_change_unpadded_outputs(entry: str) -> None:
    model = tiny_model(entry)
    src, tgt = random_batch()
    padded_src = F.pad(src, (0, 4), value=0)  # four more padding positions
    with torch.no_grad():
        a = model(src, tgt)
        b = model(padded_src, tgt)
        mem_a, _ = model.encode(src)
        mem_b, _ = model.encode(padded_src)
    assert torch.allclose(a, b, atol=1e-5, rtol=0)
    keep = src.ne(0)
    assert torch.allclose(mem_a[keep], mem_b[:, : src.shape[1]][keep], atol=1e-5, rtol=0)


@pytest.mark.parametrize("entry", ENTRIES)
def test_gated_heads_equal_physically_removed_heads(entry: str) -> None:
    model = tiny_model(entry)
    names = list(model.attention_modules())
    heads = model.cfg.num_heads
    plan = {names[0]: [heads - 1], names[-1]: list(range(0, heads, 2))}
    try:
        model.apply_head_plan(plan, remove=False)
    except HeadPruningUnsupported:
        pytest.skip("mechanism refuses head removal")
    src, tgt = random_batch()
    with torch.no_grad():
        gated = model(src, tgt)
    pruned = build_model(ModelConfig.from_dict(model.cfg.to_dict()))  # same plan, gated
    pruned.load_state_dict(model.state_dict())
    pruned.apply_head_plan(plan, remove=True)
    with torch.no_grad():
        removed = pruned.eval()(src, tgt)
    assert torch.allclose(gated, removed, atol=1e-5, rtol=0)
    assert pruned.attention_modules()[names[0]].num_heads == 1
    assert count_parameters(pruned) < count_parameters(model)
    # and a model rebuilt from the pruned config alone has the same shapes as the pruned one
    rebuilt = build_model(ModelConfig.from_dict(pruned.cfg.to_dict()))
    rebuilt.load_state_dict(pruned.state_dict())


def test_gate_equals_zeroed_output_projection_columns() -> None:
    """Gating a head off must equal zeroing its out_proj columns (zeroing q/k/v is not enough:
    the value bias would survive through the attention-weighted sum)."""
    model = tiny_model("transformer")
    src, tgt = random_batch()
    name = "decoder.layers.0.cross_attn"
    attn = model.attention_modules()[name]
    dh = attn.head_dim
    with torch.no_grad():
        attn.v_proj.bias.normal_()  # make a surviving value bias visible
        reference = tiny_model("transformer")
        reference.load_state_dict(model.state_dict())
        ref_attn = reference.attention_modules()[name]
        ref_attn.out_proj.weight[:, 1 * dh : 2 * dh] = 0
        model.apply_head_plan({name: [h for h in range(attn.num_heads) if h != 1]}, remove=False)
        assert torch.allclose(model(src, tgt), reference(src, tgt), atol=1e-6, rtol=0)
        # zeroing only q/k/v of the head does NOT remove it
        third = tiny_model("transformer")
        third.load_state_dict(reference.state_dict())
        t_attn = third.attention_modules()[name]
        t_attn.out_proj.weight.copy_(attn.out_proj.weight)
        for proj in (t_attn.q_proj, t_attn.k_proj, t_attn.v_proj):
            proj.weight[dh : 2 * dh] = 0
        assert not torch.allclose(third(src, tgt), reference(src, tgt), atol=1e-6, rtol=0)


def test_config_roundtrip_and_unknown_fields() -> None:
    cfg = tiny_model("transformer").cfg
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_parameter_counts_exclude_embeddings() -> None:
    model = tiny_model("transformer")
    emb = model.src_embed.weight.numel()  # shared (share_all_embeddings in size=tiny)
    assert count_parameters(model) - count_parameters(model, include_embeddings=False) == emb


def test_pre_norm_variant_runs_incrementally() -> None:
    model = tiny_model("transformer", pre_norm=True)
    src, tgt = random_batch()
    with torch.no_grad():
        full = model(src, tgt)
        memory, pad = model.encode(src)
        state = model.init_state()
        steps = [model.decode(tgt[:, i : i + 1], memory, pad, state, offset=i) for i in range(tgt.shape[1])]
    assert torch.allclose(full, torch.cat(steps, 1), atol=1e-5, rtol=0)
