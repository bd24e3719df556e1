"""onnxruntime's fused `com.microsoft::MultiHeadAttention` kernel for the decoder step's mha modules (issue 65).

Why: at batch 1 a decoder step is a few hundred small kernels, each with its dispatch whatever it computes; written
out, one layer's two attentions are 45 of them (projections split into heads and merged back, scores of the past
and of the new position apart, a Concat, a Softmax, two Slices, …). Export config `fused_attention` (FUSED_CHOICES):

- "cross": the cross-attention step as one kernel. The N = sources × G query rows become G query *positions* of their
  source ([sources, G, I]) against the cross cache [sources, H, S, dh] (onnxruntime's BNSH layout) and the source
  padding as a 0/1 key mask: the grouping of `per_source_step`, exact because cross-attention queries never see each
  other. The alignment layer takes its weights from the kernel's `output_qk` (scaled scores, padding masked) and one
  Softmax.
- "all": the self-attention step too — q, k and v from one MatMul + Add (the three weights concatenated at export)
  and a Split, then MultiHeadAttention(q, k, v, past_key, past_value), the past gathered from the host's store as
  before ([N, H, t, dh]). onnxruntime attends to the past only when the grown caches are asked for as outputs
  (checked: without them it ignores the past), so the node returns them, unread; that copy of every row's past per
  layer made "all" slower and heavier at beam × batch rows, so the finished graph runs the kernel only for few rows
  and the same attention written out for many (export/self_attention_by_rows.py). The new position's k and v go out
  as before (`next.*`).

Grouped-query modules (`GroupedQueryAttention`, H query heads over Hkv key/value heads, g = H / Hkv per group) run as
the same kernel with num_heads = Hkv: a group's g query heads become g query *positions* of their key/value head
([N, 1, H·dh] → [N, g, Hkv·dh], head kv·g + j at position j), which is what grouped attention computes — no key or
value repeated per query head, the cache read once per group. Exact because the kernel masks no query position
(`unidirectional` 0): every position sees every key, as one step's query does.

Only while the decoder graph is exported, and only for modules whose class is exactly `MultiHeadAttention` or
`GroupedQueryAttention` (each with its own head count, so non-uniform pruned heads keep working). Numerics: the
kernel sums in its own order, so outputs differ from torch's in the last bits; the export's verification compares
them with its usual tolerance. Not yet run on onnxruntime's CUDA provider, which has the same operator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.attention.base import Attention
from zoo.attention.gqa import GroupedQueryAttention
from zoo.attention.mha import MultiHeadAttention
from zoo.model import Transformer

OP = "com.microsoft::MultiHeadAttention"
OP_VERSION = 1
# The additive value of a masked key: the lowest float32 rather than onnxruntime's default −10000, so a padded
# position's weight is exactly 0 as torch's −inf makes it (scores are far from ±3.4e38, so nothing overflows).
MASK_FILTER_VALUE = float(torch.finfo(torch.float32).min)
# export config `fused_attention`: which of the decoder step's mha modules run as the fused kernel. "all" is the
# default: on 2 AMD EPYC cores (family 25 model 17) with the runtime's default spinning it was level with "none" or
# faster at greedy and beam 5, batch 1 and 32, fp32 and INT8, at most 6 MB more at its peak (results/runtime/
# fast_defaults.md); on 2 Zen 3 cores it was 0.97× at beam 5 × 32 with 121 MB more, every self-attention's
# grown-cache output being a copy of the past (results/runtime/fused_attention.md).
FUSED_CHOICES = ("none", "cross", "all")
FUSED_BUFFERS = ("fused_qkv_weight", "fused_qkv_bias", "fused_q_bias")  # what the hooks add to a module, and remove


class FusedSelfStep:
    """One decoding step of an mha or gqa self-attention module as one MultiHeadAttention kernel (module docstring)."""

    def __init__(self, module: MultiHeadAttention) -> None:
        self.module = module
        m = module
        # [I + 2·Ikv, D] and [I + 2·Ikv]: q, k, v rows in that order — one MatMul and Add where there were three.
        # Buffers while the hook is installed, so the graph names them
        weight = torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]).detach().clone()
        m.register_buffer("fused_qkv_weight", weight, persistent=False)
        m.register_buffer("fused_qkv_bias", qkv_bias(m.q_proj.bias, m.k_proj.bias, m.v_proj.bias), persistent=False)
        self.gate = merged_gate(module)

    def __call__(self, x: Tensor, memory: Tensor | None, key_padding_mask: Tensor | None, cache: dict) -> Tensor | None:
        m = self.module
        if memory is not None or key_padding_mask is not None or not cache or m.capture or m.training:
            return None
        n = x.shape[0]
        heads, kv, dh = m.num_heads, key_value_heads(m), m.head_dim
        group = heads // kv
        # [N, 1, I], [N, 1, Ikv] twice, with their biases: the new k, v go out as they are (a Reshape each); the
        # kernel's grown caches are not read (and for many rows not made: export/self_attention_by_rows.py)
        q, k, v = F.linear(x, m.fused_qkv_weight, m.fused_qkv_bias).split([heads * dh, kv * dh, kv * dh], dim=-1)
        past_k, past_v = cache["k"], cache["v"]  # [N, Hkv, t, dh]
        t = past_k.shape[2]
        out, _, _ = torch.onnx.ops.symbolic_multi_out(
            OP,
            [query_positions(q, group, dh), k, v, None, None, None, past_k, past_v],
            {"num_heads": kv},
            dtypes=[x.dtype] * 3,
            shapes=[[n, group, kv * dh], [n, kv, t + 1, dh], [n, kv, t + 1, dh]],
            version=OP_VERSION,
        )  # [N, g, Ikv]; onnxruntime reads the past only when its grown caches are outputs (module docstring)
        new = {"k": k.reshape(n, kv, 1, dh), "v": v.reshape(n, kv, 1, dh)}  # memory-identical: one position
        grown = m.extend_cache(cache, new)  # the graph returns its last position, i.e. `new` (export/rewrites.py)
        cache.clear()
        cache.update(grown)
        return finish(m, self.gate, merged_heads(out, group, dh))


class FusedCrossStep:
    """One decoding step of an mha or gqa cross-attention module as one MultiHeadAttention kernel (module
    docstring)."""

    def __init__(self, module: MultiHeadAttention) -> None:
        self.module = module
        self.gate = merged_gate(module)
        bias = module.q_proj.bias
        # [3I]: k, v have none. Grouped modules add their query bias before the kernel (it differs per position)
        if key_value_heads(module) == module.num_heads:
            zeros = None if bias is None else torch.zeros_like(bias)
            module.register_buffer("fused_q_bias", qkv_bias(bias, zeros, zeros), persistent=False)

    def __call__(self, x: Tensor, memory: Tensor | None, key_padding_mask: Tensor | None, cache: dict) -> Tensor | None:
        m = self.module
        if memory is None or not cache or set(m.capture) - {"A"} or m.training:
            return None
        n = x.shape[0]
        k, v = cache["k"], cache["v"]  # [sources, Hkv, S, dh]
        sources = k.shape[0]
        torch._check(n % sources == 0)
        beams = n // sources
        heads, kv, dh = m.num_heads, key_value_heads(m), m.head_dim
        group = heads // kv
        # [sources, G·g, Ikv]: a source's beams (and each beam's group members) as its query positions
        q = F.linear(x, m.q_proj.weight, m.q_proj.bias if group > 1 else None)
        q = query_positions(q.reshape(sources, beams, heads * dh), group, dh)
        keep = None if key_padding_mask is None else (~key_padding_mask).to(torch.int32)  # [sources, S] 1 = a key
        weights = "A" in m.capture  # the alignment layer: its attention weights are recorded
        outputs = torch.onnx.ops.symbolic_multi_out(
            OP,
            [q, k, v, None if group > 1 else m.fused_q_bias, keep],
            {"num_heads": kv, "mask_filter_value": MASK_FILTER_VALUE},
            dtypes=[x.dtype] * (4 if weights else 1),
            shapes=[
                [sources, beams * group, kv * dh],
                *([list(k.shape), list(v.shape), [sources, kv, beams * group, k.shape[2]]] if weights else []),
            ],
            version=OP_VERSION,
        )  # [sources, G·g, Ikv]; with weights also (unread: the export leaves them unnamed) present k and v, and
        # the scaled, masked scores [sources, Hkv, G·g, S] (`output_qk`)
        if weights:  # [sources, H, G, S] as an mha module's: head kv·g + j
            scores = outputs[-1].reshape(sources, kv, beams, group, -1).transpose(2, 3)
            m.captured["A"] = scores.reshape(sources, heads, beams, -1).softmax(dim=-1)  # padded keys: weight 0
        return finish(m, self.gate, merged_heads(outputs[0], group, dh).reshape(n, 1, heads * dh))


def key_value_heads(module: Attention) -> int:
    """The key/value heads a fusable module projects and caches: a grouped-query module's own count, else one per
    query head."""
    return module.kv_heads if isinstance(module, GroupedQueryAttention) else module.num_heads


def query_positions(q: Tensor, group: int, dh: int) -> Tensor:
    """[R, L, H·dh] → [R, L·g, Hkv·dh]: each key/value head's g query heads as g query positions (head kv·g + j of
    position l at position l·g + j), the kernel's layout for grouped attention; unchanged when g = 1."""
    if group == 1:
        return q
    rows, inner = q.shape[0], q.shape[-1]
    kv = inner // (group * dh)
    return q.reshape(rows, -1, kv, group, dh).transpose(2, 3).reshape(rows, -1, kv * dh)


def merged_heads(out: Tensor, group: int, dh: int) -> Tensor:
    """The kernel's [R, L·g, Hkv·dh] → [R, L, H·dh], heads merged in the module's order (`query_positions`'
    inverse); unchanged when g = 1."""
    if group == 1:
        return out
    rows, inner = out.shape[0], out.shape[-1]
    kv = inner // dh
    return out.reshape(rows, -1, group, kv, dh).transpose(2, 3).reshape(rows, -1, group * inner)


def qkv_bias(q: Tensor | None, k: Tensor | None, v: Tensor | None) -> Tensor | None:
    """The kernel's `bias` input [3I] (q, k, v), or None for modules without biases."""
    return None if q is None or k is None or v is None else torch.cat([q, k, v]).detach().clone()


def merged_gate(module: Attention) -> Tensor | None:
    """The module's head gates per merged channel [I], or None when every gate is 1 (physically pruned exports):
    read when the hook is installed, since the exporter cannot branch on a buffer's value."""
    gate = module.head_gate
    return None if bool((gate == 1).all()) else gate.repeat_interleave(module.head_dim).detach().clone()


def finish(module: Attention, gate: Tensor | None, out: Tensor) -> Tensor:
    """out [N, 1, I] (heads merged) → the module's output: gated heads (`merged_gate`), out_proj."""
    if gate is not None:
        out = out * gate.to(out.dtype)
    return module.out_proj(out)


def fusable(module: Attention) -> bool:
    """Modules whose step the fused kernel computes: exactly `MultiHeadAttention` or `GroupedQueryAttention` (not a
    subclass that may attend otherwise)."""
    return type(module) in (MultiHeadAttention, GroupedQueryAttention)


@contextlib.contextmanager
def fused_decoder_steps(model: Transformer, which: str) -> Iterator[int]:
    """While exporting the decoder: the fusable decoder attentions' steps through the fused kernel — `which` is
    "cross" (cross-attention only) or "all" (self-attention too) — a module whose weights are being recorded (the
    alignment layer) falling back by itself. Yields how many modules."""
    if which not in FUSED_CHOICES[1:]:
        raise ValueError(f"fused_attention={which!r}: not one of {FUSED_CHOICES[1:]}")
    hooked: list[Attention] = []
    try:
        for layer in model.decoder.layers:
            if fusable(layer.self_attn) and which == "all":
                layer.self_attn.export_step = FusedSelfStep(layer.self_attn)
                hooked.append(layer.self_attn)
            if fusable(layer.cross_attn):
                layer.cross_attn.export_step = FusedCrossStep(layer.cross_attn)
                hooked.append(layer.cross_attn)
        yield len(hooked)
    finally:
        for module in hooked:
            module.export_step = None
            for name in FUSED_BUFFERS:
                if name in module._buffers:
                    delattr(module, name)
