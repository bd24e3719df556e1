"""Grouped-query / multi-query attention (zoo.attention.gqa) against a literal implementation of the formula.

The reference is written here from the definition alone — query head h attends with key/value head h // (H / G) —
per head, in float64, from the module's weights, never its methods. Also: the caches hold only the key/value heads,
a multi-head module whose heads agree within each group is reproduced exactly by its mean-pooled grouped module
(uptraining's conversion), and the exported decoder's cache inputs have the key/value head count.
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.attention import HeadPruningUnsupported, build_attention, pool_key_value_heads
from zoo.attention.gqa import GroupedQueryAttention

D, H, DH = 12, 4, 5  # head_dim 5 ≠ d_model / H: the fixed-head-size option must work
B, T, S = 2, 4, 6


def make(kv_heads: int) -> GroupedQueryAttention:
    torch.manual_seed(0)
    module = build_attention("gqa", D, H, head_dim=DH, kv_heads=kv_heads).double().eval()
    with torch.no_grad():
        for p in module.parameters():  # biases start at 0: make them matter
            if p.dim() == 1:
                p.normal_(0, 0.3)
    assert isinstance(module, GroupedQueryAttention)
    return module


def split(x: Tensor, layer: torch.nn.Linear) -> Tensor:
    # [B, L, D] -> [B, heads, L, DH] with the layer's raw weights
    return F.linear(x, layer.weight, layer.bias).view(x.shape[0], x.shape[1], -1, DH).transpose(1, 2)


def literal(module: GroupedQueryAttention, x: Tensor, memory: Tensor, valid: Tensor) -> Tensor:
    """softmax(q_h k_{g(h)}ᵀ / √dh) v_{g(h)} with g(h) = h // (H / G), per head; valid [B, T, S]."""
    q, k, v = split(x, module.q_proj), split(memory, module.k_proj), split(memory, module.v_proj)
    group = H // module.kv_heads
    heads = []
    for h in range(H):
        scores = q[:, h] @ k[:, h // group].transpose(-1, -2) / math.sqrt(DH)  # [B, T, S]
        heads.append(scores.masked_fill(~valid, float("-inf")).softmax(-1) @ v[:, h // group])
    merged = torch.stack(heads, 1).transpose(1, 2).reshape(x.shape[0], x.shape[1], H * DH)
    return F.linear(merged, module.out_proj.weight, module.out_proj.bias)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_cross_and_causal_self_attention_match_the_formula(kv_heads: int) -> None:
    module = make(kv_heads)
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
    padded = torch.zeros(B, S, dtype=torch.bool)
    padded[1, 4:] = True
    cross = module(x, memory, key_padding_mask=padded)
    torch.testing.assert_close(cross, literal(module, x, memory, (~padded)[:, None, :].expand(B, T, S)))
    causal = module(x, causal=True)
    torch.testing.assert_close(causal, literal(module, x, x, torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)))


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_the_caches_hold_only_the_key_value_heads_and_steps_equal_the_full_pass(kv_heads: int) -> None:
    module = make(kv_heads)
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
    self_cache: dict[str, Tensor] = {}
    cross_cache: dict[str, Tensor] = {}
    steps = [module(x[:, t : t + 1], cache=self_cache) for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, 1), module(x, causal=True))
    assert {name: tuple(c.shape) for name, c in self_cache.items()} == {n: (B, kv_heads, T, DH) for n in "kv"}
    module(x[:, :1], memory, cache=cross_cache)
    assert tuple(cross_cache["k"].shape) == (B, kv_heads, S, DH)
    # one query row per source, several beams each: the per-source step groups beams over the one cached row
    beams = torch.randn(B * 3, 1, D, dtype=torch.float64)
    stepped = module(beams, memory, cache=cross_cache)
    torch.testing.assert_close(stepped, module(beams, memory.repeat_interleave(3, 0)))


def test_with_one_key_value_head_per_query_head_it_is_multi_head_attention() -> None:
    grouped = make(H)
    plain = build_attention("mha", D, H, head_dim=DH).double().eval()
    plain.load_state_dict(grouped.state_dict())
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
    torch.testing.assert_close(grouped(x, memory), plain(x, memory))
    torch.testing.assert_close(grouped(x, causal=True), plain(x, causal=True))


def test_uptraining_mean_pools_each_groups_key_value_heads() -> None:
    """A multi-head module whose key/value heads agree within each group (2 groups of 2) is exactly its mean-pooled
    grouped module; in general each shared head is the mean of its group's heads."""
    torch.manual_seed(1)
    plain = build_attention("mha", D, H, head_dim=DH).double().eval()
    with torch.no_grad():
        for name in ("k_proj", "v_proj"):
            layer = getattr(plain, name)
            layer.bias.normal_(0, 0.3)
            for h in (1, 3):  # head 1 repeats head 0, head 3 repeats head 2
                rows = slice(h * DH, (h + 1) * DH)
                layer.weight[rows] = layer.weight[(h - 1) * DH : h * DH]
                layer.bias[rows] = layer.bias[(h - 1) * DH : h * DH]
    grouped = make(2)
    state = {f"attn.{k}": v for k, v in plain.state_dict().items()}
    assert pool_key_value_heads({"attn": grouped, "other": plain}, state) == 1
    grouped.load_state_dict({k.removeprefix("attn."): v for k, v in state.items()})
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
    torch.testing.assert_close(grouped(x, memory), plain(x, memory))
    mixed = {f"m.{k}": v.clone() for k, v in make(H).state_dict().items()}  # unequal heads: the mean of each pair
    expected = mixed["m.v_proj.weight"].view(2, 2, DH, D).mean(1).reshape(2 * DH, D)
    pool_key_value_heads({"m": grouped}, mixed)
    torch.testing.assert_close(mixed["m.v_proj.weight"], expected)


def test_removing_query_heads_is_refused_with_the_fix_and_bad_group_counts_name_the_divisor() -> None:
    with pytest.raises(HeadPruningUnsupported, match="remove_heads=false"):
        make(2).check_head_removal()
    with pytest.raises(ValueError, match="kv_heads=3 must be ≥ 1 and divide num_heads=4"):
        build_attention("gqa", D, H, kv_heads=3)


@pytest.mark.parametrize(("entry", "kv_heads"), [("gqa", 2), ("mqa", 1)])
def test_the_exported_decoders_caches_have_the_key_value_head_count(entry: str, kv_heads: int, exported) -> None:
    """The decoder graph's caches carry the key/value heads, not the query heads — the cross caches it reads
    [sources, heads, src_len, dh] and the self-attention positions it returns [batch, heads, 1, dh] for the host's
    store — read from the ONNX file the exporter wrote (and verified against PyTorch), not from our manifest."""
    export_dir, manifest = exported(entry)
    assert manifest["model_config"]["num_heads"] == 8 > kv_heads
    graph = onnx.load(str(export_dir / "decoder.onnx"), load_external_data=False).graph
    shapes = {v.name: v.type.tensor_type.shape.dim for v in (*graph.input, *graph.output)}
    layers = manifest["model_config"]["decoder_layers"]
    cross = [f"L{i}.cross.{k}" for i in range(layers) for k in "kv"]
    new = [f"next.L{i}.self.{k}" for i in range(layers) for k in "kv"]
    for name in cross + new:
        assert shapes[name][1].dim_value == kv_heads, (name, shapes[name])


def test_uptraining_starts_from_the_transformers_weights_with_key_value_heads_pooled(
    smoke_run, smoke_corpus, tmp_path
) -> None:
    """`zoo.train +model=gqa init_from=<transformer run>`: the grouped model starts from the trained transformer,
    each group's key/value heads mean-pooled (one update at a warm-up lr of ~1e-6 moves nothing measurable); a run
    whose tokenizer differs from the checkpoint's (another vocabulary) is refused before it trains."""
    from tests.conftest import smoke_overrides
    from tests.zoo_testing import compose_train
    from zoo.checkpoint import load_checkpoint
    from zoo.errors import ZooError
    from zoo.train import train

    source = smoke_run("transformer")
    one_update = ["trainer.max_updates=1", "trainer.warmup_updates=1000", "trainer.validate_every=1"]
    result = train(
        compose_train(smoke_overrides("gqa", smoke_corpus, tmp_path / "up") + [f"init_from={source}", *one_update])
    )
    teacher = load_checkpoint(source)["model"]
    student = load_checkpoint(Path(result["run_dir"]) / "checkpoints" / "last.pt")["model"]
    name = "decoder.layers.0.self_attn.k_proj.weight"
    pooled = teacher[name].view(2, 4, -1, teacher[name].shape[-1]).mean(1).flatten(0, 1)
    torch.testing.assert_close(student[name], pooled, atol=1e-4, rtol=0)
    torch.testing.assert_close(student["src_embed.weight"], teacher["src_embed.weight"], atol=1e-4, rtol=0)
    other = smoke_overrides("gqa", smoke_corpus, tmp_path / "other") + ["data.vocab_size=900", f"init_from={source}"]
    with pytest.raises(ZooError, match="tokenizer differs from this run's"):
        train(compose_train(other + one_update))


@pytest.mark.parametrize(("entry", "kv_heads"), [("gqa", 2), ("mqa", 1)])
def test_the_speed_stage_counts_the_cache_a_sentence_holds(entry: str, kv_heads: int, exported) -> None:
    """zoo.report.speed's cache per sentence, from the export's cache specs: per decoder layer, keys and values of
    kv_heads × dh floats for every decoder position (self) and every source token (cross) — a quarter / an eighth
    of what 8 heads hold."""
    from zoo.report.speed import cache_bytes

    manifest = exported(entry)[1]
    cfg = manifest["model_config"]
    dh = cfg["d_model"] // cfg["num_heads"]
    for steps, src_len in ((1, 5), (12, 30)):
        per_layer = 2 * kv_heads * dh * (steps + src_len) * 4  # k and v, float32
        assert cache_bytes(manifest["caches"], steps, src_len) == cfg["decoder_layers"] * per_layer
