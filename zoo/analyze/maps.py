"""Rank and singular-value spectrum of the post-softmax attention maps (what weights the values).

Per module = layer × attention kind: the rank distribution (number of singular values above an
*absolute* `threshold`, the MGK paper's analysis, 1e-6) of each cropped [n_q × n_k] map, one matrix
per sentence and head, and the normalised cumulative singular-value curve (the Mixhead paper's
Fig. 1/3): c(k) = Σ_{i≤k} σ_i / Σ_i σ_i, with k rescaled to the fraction k/r of the
r = min(n_q, n_k) singular values so sentences of different lengths average onto one curve; "area"
is the mean of the curve over the grid (0.5 for equal singular values, → 1 for rank one).

Decoder self-attention maps are lower-triangular with a positive diagonal, so they are full rank in
exact arithmetic; their singular-value curves are still informative.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from zoo.model import Transformer

KINDS = {
    ("encoder", "self_attn"): "encoder self-attention",
    ("decoder", "self_attn"): "decoder self-attention",
    ("decoder", "cross_attn"): "decoder cross-attention",
}


# ---------------------------------------------------------------------- pure functions
def singular_values(mats: Tensor) -> Tensor:
    """[..., n, m] -> [..., min(n, m)] singular values in descending order, in float64."""
    return torch.linalg.svdvals(mats.to(torch.float64))


def matrix_ranks(mats: Tensor, threshold: float = 1e-6) -> Tensor:
    """[..., n, m] -> [...] number of singular values above `threshold` (absolute, as the MGK paper)."""
    return (singular_values(mats) > threshold).sum(dim=-1)


def cumulative_singular_values(sv: Tensor) -> Tensor:
    """[..., r] descending singular values -> [..., r] normalised cumulative sums (last entry 1;
    an all-zero matrix gives all ones)."""
    total = sv.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, sv.cumsum(dim=-1) / total.clamp_min(torch.finfo(sv.dtype).tiny), torch.ones_like(sv))


def resample_curve(curve: Tensor, grid: int) -> Tensor:
    """[..., r] cumulative curve at k = 1..r -> [..., grid + 1] values at fractions x = 0, 1/grid, …, 1
    of the singular values (linear interpolation, c(0) = 0), so matrices of any size average."""
    r = curve.shape[-1]
    padded = torch.cat([torch.zeros_like(curve[..., :1]), curve], dim=-1)  # [..., r + 1] at k = 0..r
    pos = torch.linspace(0, 1, grid + 1, dtype=torch.float64) * r  # fractional k
    lo = pos.floor().long().clamp(max=r)
    hi = (lo + 1).clamp(max=r)
    w = (pos - lo).to(curve.dtype)
    return padded[..., lo] * (1 - w) + padded[..., hi] * w


def rank_histogram(ranks: Iterable[int]) -> dict[int, int]:
    """{rank: number of matrices}, sorted by rank."""
    return dict(sorted(Counter(int(r) for r in ranks).items()))


def crop_maps(attn: Tensor, q_lens: Tensor, k_lens: Tensor) -> list[Tensor]:
    """attn [B, H, T, S] padded maps -> per batch row the [H, q_len, k_len] block of real positions
    (padded query rows would otherwise add rank that no real token has)."""
    return [attn[b, :, : int(q_lens[b]), : int(k_lens[b])] for b in range(attn.shape[0])]


def summarise_maps(stacks: Sequence[Tensor], threshold: float = 1e-6, grid: int = 50) -> dict[str, Any]:
    """Rank distribution and mean cumulative singular-value curve of a list of [H, n, m] stacks
    (one per sentence). Returns plain JSON-able numbers."""
    ranks: list[int] = []
    sizes: list[int] = []
    curves: list[Tensor] = []
    for stack in stacks:
        sv = singular_values(stack)  # [H, r]
        ranks += (sv > threshold).sum(dim=-1).tolist()
        sizes += [sv.shape[-1]] * sv.shape[0]
        curves.append(resample_curve(cumulative_singular_values(sv), grid))  # [H, grid + 1]
    if not ranks:
        return {"matrices": 0}
    curve = torch.cat(curves).mean(dim=0)
    ratio = [r / s for r, s in zip(ranks, sizes, strict=True)]
    return {
        "matrices": len(ranks),
        "rank_histogram": rank_histogram(ranks),
        "mean_rank": sum(ranks) / len(ranks),
        "mean_size": sum(sizes) / len(sizes),
        "mean_rank_ratio": sum(ratio) / len(ratio),
        "full_rank_fraction": sum(r == s for r, s in zip(ranks, sizes, strict=True)) / len(ranks),
        "curve": curve.tolist(),
        "curve_area": float(curve.mean()),
        "ranks": ranks,
        "sizes": sizes,
    }


def module_kind(name: str) -> tuple[str, int]:
    """("decoder cross-attention", 2) from "decoder.layers.2.cross_attn"."""
    parts = name.split(".")
    return KINDS.get((parts[0], parts[-1]), f"{parts[0]} {parts[-1]}"), int(parts[2])


def module_lengths(name: str, src_lens: Tensor, tgt_lens: Tensor) -> tuple[Tensor, Tensor]:
    """(query lengths, key lengths) [B] of module `name` from the source / decoder-input lengths [B]:
    encoder self-attention src × src, decoder self-attention tgt × tgt, cross-attention tgt × src."""
    decoder_self = name.startswith("decoder") and name.endswith("self_attn")
    q_lens = src_lens if name.startswith("encoder") else tgt_lens
    k_lens = tgt_lens if decoder_self else src_lens
    return q_lens, k_lens


def input_lengths(src: Tensor, tgt_in: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """(source lengths, decoder-input lengths) [B] of a padded batch. Position 0 of the decoder input is its start
    token whatever its id: a converted Marian model starts from pad, which a count of non-pad ids would drop."""
    return src.ne(pad_id).sum(1), 1 + tgt_in[:, 1:].ne(pad_id).sum(1)


# ---------------------------------------------------------------------- running a model
def collect_maps(
    model: Transformer, batches: Iterable[tuple[Tensor, Tensor]], map_name: str = "A", pad_id: int = 0
) -> dict[str, list[Tensor]]:
    """Teacher-forced forward passes over (src [B, S], tgt_in [B, T]) batches; per attention module,
    the cropped [H, n_q, n_k] maps of every sentence. `map_name` "A" is the map that weights the
    values; a mechanism-specific name (Mixhead's "A_unmixed") falls back to "A" where a module does
    not produce it. Modules that capture no map at all get an empty list."""
    modules = model.attention_modules()
    saved = {name: m.capture for name, m in modules.items()}
    wanted = tuple(dict.fromkeys((map_name, "A")))
    out: dict[str, list[Tensor]] = {name: [] for name in modules}
    try:
        for m in modules.values():
            m.capture = wanted
            m.captured.clear()
        with torch.no_grad():
            for src, tgt_in in batches:
                model(src, tgt_in)
                src_lens, tgt_lens = input_lengths(src, tgt_in, pad_id)  # [B]
                for name, m in modules.items():
                    attn = m.captured.get(map_name, m.captured.get("A"))
                    m.captured.clear()
                    if attn is None:
                        continue
                    q_lens, k_lens = module_lengths(name, src_lens, tgt_lens)
                    out[name] += [a.detach().cpu() for a in crop_maps(attn, q_lens, k_lens)]
    finally:
        for name, m in modules.items():
            m.capture = saved[name]
            m.captured.clear()
    return out
