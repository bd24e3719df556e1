"""Numerical rank of the pre-softmax score matrices S_h = Q_h K_hᵀ against the sentence length n.

The concise-attention paper (Bhojanapalli et al. 2020, "Low-Rank Bottleneck in Multi-head Attention
Models", Theorem 1): a head of size d_p scores a sentence of n tokens with S_h = Q_h K_hᵀ, Q_h, K_h
∈ R^{n×d_p}, so rank(S_h) ≤ min(n, d_p); for n > d_p the head cannot represent an arbitrary context
matrix. This measures, on real sentences, how close trained heads come to that bound:

  * S_h is the *unscaled, unmasked* product of the per-head projected queries and keys exactly as the
    mechanism receives them in `attend` (projection biases included; the 1/√d_p scale does not change
    the rank; the decoder's causal mask is applied after the product, so decoder self-attention is the
    full T×T product), cropped to the real (non-padded) positions of every sentence;
  * numerical rank = #{σ_i > tol·σ_max} (a *relative* tolerance, default 1e-6; the model runs in float64,
    where the round-off of a rank-r product sits near 1e-16·σ_max);
  * per matrix n = min(n_q, n_k) — the sentence length for self-attention, the shorter of target and
    source for cross-attention — and the bound min(n, d_p); "at bound" = rank equals that bound.

Mechanisms (the per-head q and k are read from the inputs of the module's `attend`, by shadowing that
method on the instance for the duration of the pass; zoo/attention is not changed):
  * mha (and GHT / fixed head size, which are mha): S_h = q_h k_hᵀ;
  * mixhead: S_h = q_h k_hᵀ per head *before* the post-softmax mixing (the mixing acts on the maps,
    not on the scores, so it is not a score of rank ≤ d_p and is not analysed here);
  * mgk / smgk: one S_{h,r} = q_h k_{h,r}ᵀ per key component r, reported separately ("…[k0]", "…[k1]").
    The score the softmax sees, log Σ_r π_r exp((q·k_r − ‖k_r‖²/2)/σ²), is not a plain product and is
    not analysed;
  * linear / mlk: skipped — no softmax score matrix exists (the kernel φ(q)·φ̃(k) is normalised
    directly, and its map is already analysed as "A" by the post-softmax analysis).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from zoo.analyze.maps import crop_maps, input_lengths, module_kind, module_lengths, singular_values
from zoo.attention import Attention, Cache
from zoo.attention.linear import MixtureOfLinearKeys
from zoo.attention.mgk import MixtureOfGaussianKeys
from zoo.model import Transformer

SCORE_DEFINITION = (
    "S_h = Q_h K_hᵀ per head: the unscaled product of the projected per-head queries and keys "
    "(biases included) as `attend` receives them, before the softmax and before any causal mask; "
    "Mixhead: before mixing; MGK: one product per key component r (q k_rᵀ); cropped to real tokens; "
    "n = min(n_q, n_k); bound = min(n, d_p)"
)
LINEAR_SKIP = (
    "linear attention: no softmax score matrix (the kernel φ(q)·φ̃(k) is normalised directly; "
    "its map is in the post-softmax analysis)"
)


# ---------------------------------------------------------------------- pure functions
def numerical_ranks(mats: Tensor, tol: float = 1e-6) -> Tensor:
    """[..., n, m] -> [...] numerical rank: the number of singular values σ_i > tol·σ_max (relative
    tolerance; an all-zero or empty matrix has rank 0)."""
    sv = singular_values(mats)  # [..., r] descending, float64
    if sv.shape[-1] == 0:
        return torch.zeros(sv.shape[:-1], dtype=torch.long)
    top = sv[..., :1]  # σ_max [..., 1]
    return ((sv > tol * top) & (top > 0)).sum(dim=-1)


def length_bucket(n: int, width: int) -> tuple[int, int]:
    """The length bucket [lo, hi] (inclusive) of width `width` holding n ≥ 1: 1…w, w+1…2w, …"""
    if n < 1 or width < 1:
        raise ValueError(f"length_bucket needs n >= 1 and width >= 1, got n={n}, width={width}")
    lo = (n - 1) // width * width + 1
    return lo, lo + width - 1


def rank_stats(ns: Sequence[int], ranks: Sequence[int], bounds: Sequence[int]) -> dict[str, Any]:
    """Summary of matrices with lengths n, ranks and bounds min(n, d_p): count, mean n, mean / max rank,
    mean bound, fraction at the bound, and how many exceed it (0 unless the tolerance is too loose)."""
    count = len(ranks)
    if not count:
        return {"matrices": 0}
    return {
        "matrices": count,
        "mean_n": sum(ns) / count,
        "mean_rank": sum(ranks) / count,
        "max_rank": max(ranks),
        "mean_bound": sum(bounds) / count,
        "at_bound_fraction": sum(r == b for r, b in zip(ranks, bounds, strict=True)) / count,
        "above_bound": sum(r > b for r, b in zip(ranks, bounds, strict=True)),
    }


def bucket_ranks(ns: Sequence[int], ranks: Sequence[int], bounds: Sequence[int], width: int) -> list[dict[str, Any]]:
    """`rank_stats` per non-empty length bucket of width `width`, by increasing n."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, n in enumerate(ns):
        groups.setdefault(length_bucket(n, width), []).append(i)
    return [
        {"lo": lo, "hi": hi, **rank_stats([ns[i] for i in idx], [ranks[i] for i in idx], [bounds[i] for i in idx])}
        for (lo, hi), idx in sorted(groups.items())
    ]


def summarise_score_ranks(
    ns: Sequence[int], ranks: Sequence[int], head_dim: int, width: int, min_len: int
) -> dict[str, Any]:
    """Flat lists of per-matrix lengths n and ranks (one per sentence × head) of heads of size
    `head_dim` -> overall stats, stats over the sentences with n ≥ `min_len` ("long") and per bucket."""
    bounds = [min(n, head_dim) for n in ns]
    long = [i for i, n in enumerate(ns) if n >= min_len]
    return {
        **rank_stats(ns, ranks, bounds),
        "long": {
            "min_len": min_len,
            **rank_stats([ns[i] for i in long], [ranks[i] for i in long], [bounds[i] for i in long]),
        },
        "buckets": bucket_ranks(ns, ranks, bounds, width),
    }


def score_stack_ranks(stacks: Sequence[Tensor], tol: float) -> tuple[list[int], list[list[int]]]:
    """One [H, n_q, n_k] score stack per sentence -> (n = min(n_q, n_k) per sentence, per-head ranks
    per sentence)."""
    ns = [min(int(s.shape[-2]), int(s.shape[-1])) for s in stacks]
    return ns, [numerical_ranks(s, tol).tolist() for s in stacks]


def summarise_module(stacks: Sequence[Tensor], head_dim: int, tol: float, width: int, min_len: int) -> dict[str, Any]:
    """Everything the report keeps about one module (or MGK component): per sentence n and per-head
    ranks, per head the mean rank and at-bound fraction over the long sentences, and the summary."""
    ns, ranks = score_stack_ranks(stacks, tol)
    heads = len(ranks[0]) if ranks else 0
    per_head = []
    for h in range(heads):
        long = [(n, r[h]) for n, r in zip(ns, ranks, strict=True) if n >= min_len]
        per_head.append(rank_stats([n for n, _ in long], [r for _, r in long], [min(n, head_dim) for n, _ in long]))
    flat_n = [n for n, r in zip(ns, ranks, strict=True) for _ in r]
    flat_r = [x for r in ranks for x in r]
    return {
        "heads": heads,
        "head_dim": head_dim,
        "n": ns,
        "ranks": ranks,
        "long_per_head": [{k: p.get(k) for k in ("matrices", "mean_rank", "at_bound_fraction")} for p in per_head],
        **summarise_score_ranks(flat_n, flat_r, head_dim, width, min_len),
    }


def module_label(name: str) -> tuple[str, str | None]:
    """("encoder.layers.0.self_attn", "k1") from "encoder.layers.0.self_attn[k1]"; (name, None) otherwise."""
    if name.endswith("]") and "[" in name:
        base, comp = name[:-1].split("[", 1)
        return base, comp
    return name, None


def score_keys(module: Attention) -> tuple[list[str], str | None]:
    """(the key tensors of the module's `attend` cache to multiply with q, or a reason to skip it)."""
    if isinstance(module, MixtureOfLinearKeys):
        return [], LINEAR_SKIP
    if isinstance(module, MixtureOfGaussianKeys):
        return [f"k{r}" for r in range(module.num_components)], None
    return ["k"], None


# ---------------------------------------------------------------------- running a model
def _recording_attend(module: Attention, sink: dict[str, Tensor], keys: Sequence[str]) -> Callable[..., Tensor]:
    original = module.attend  # the bound class method

    def attend(q: Tensor, kv: Cache, mask: Tensor | None, causal: bool) -> Tensor:
        sink["q"] = q  # [B, H, T, dh]
        for key in keys:
            sink[key] = kv[key]  # [B, H, S, dh]
        return original(q, kv, mask, causal)

    return attend


def collect_scores(
    model: Transformer, batches: Iterable[tuple[Tensor, Tensor]], pad_id: int = 0
) -> tuple[dict[str, list[Tensor]], dict[str, str]]:
    """Teacher-forced forward passes over (src [B, S], tgt_in [B, T]) batches. Returns (per module —
    per key component "name[k<r>]" for MGK — the cropped [H, n_q, n_k] score products q kᵀ of every
    sentence; {module: reason} for the modules skipped). Every module's `attend` is shadowed on the
    instance only for the pass and restored afterwards, even on error."""
    modules = model.attention_modules()
    skipped: dict[str, str] = {}
    hooked: dict[str, tuple[Attention, list[str]]] = {}
    for name, m in modules.items():
        keys, reason = score_keys(m)
        if reason:
            skipped[name] = reason
        else:
            hooked[name] = (m, keys)
    labels = {name: [name] if keys == ["k"] else [f"{name}[{k}]" for k in keys] for name, (_, keys) in hooked.items()}
    out: dict[str, list[Tensor]] = {label: [] for name in hooked for label in labels[name]}
    sinks: dict[str, dict[str, Tensor]] = {name: {} for name in hooked}
    try:
        for name, (m, keys) in hooked.items():
            m.attend = _recording_attend(m, sinks[name], keys)  # instance attribute shadows the method
        with torch.no_grad():
            for src, tgt_in in batches:
                for sink in sinks.values():
                    sink.clear()
                model(src, tgt_in)
                src_lens, tgt_lens = input_lengths(src, tgt_in, pad_id)  # [B]
                for name, (_, keys) in hooked.items():
                    sink = sinks[name]
                    if "q" not in sink:
                        raise RuntimeError(f"{name}: attend was not called in the forward pass")
                    q_lens, k_lens = module_lengths(name, src_lens, tgt_lens)
                    for key, label in zip(keys, labels[name], strict=True):
                        # [B, H, T, dh] @ [B, H, dh, S] -> [B, H, T, S]
                        scores = sink["q"] @ sink[key].transpose(-1, -2)
                        out[label] += [s.detach().cpu() for s in crop_maps(scores, q_lens, k_lens)]
    finally:
        for m, _ in hooked.values():
            m.__dict__.pop("attend", None)
        for sink in sinks.values():
            sink.clear()
    return out, skipped


def score_rank_report(
    stacks: dict[str, list[Tensor]], head_dims: dict[str, int], tol: float, width: int, min_len: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per module/component summaries, per attention kind summaries pooled over layers and components)
    of `collect_scores`'s stacks; `head_dims` maps module names (without component) to head sizes."""
    modules: dict[str, Any] = {}
    pooled: dict[str, tuple[list[int], list[int], set[int]]] = {}
    for label, module_stacks in stacks.items():
        if not module_stacks:
            continue
        base, comp = module_label(label)
        kind, layer = module_kind(base)
        dh = head_dims[base]
        entry = {
            "kind": kind,
            "layer": layer,
            "component": comp,
            **summarise_module(module_stacks, dh, tol, width, min_len),
        }
        modules[label] = entry
        ns, rs, dims = pooled.setdefault(kind, ([], [], set()))
        ns += [n for n, r in zip(entry["n"], entry["ranks"], strict=True) for _ in r]
        rs += [x for r in entry["ranks"] for x in r]
        dims.add(dh)
    by_kind = {}
    for kind, (ns, rs, dims) in pooled.items():
        if len(dims) != 1:  # not expected (one head size per model); the bound would be ambiguous
            raise ValueError(f"{kind}: modules with different head sizes {sorted(dims)}")
        (dh,) = dims
        by_kind[kind] = {"head_dim": dh, **summarise_score_ranks(ns, rs, dh, width, min_len)}
    return modules, by_kind
