"""Voting-to-Stay (paper Algorithm 1): every voting batch, in every module, the head nearest each
group centre (Euclidean) gets one vote; then each group keeps its most-voted head (`per_group`,
the paper) or the C most-voted heads overall stay (`top_c`, the official code). `random` is the
paper's "w/o HUDS" ablation. Ties go to the lower head index, so plans are deterministic."""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.ght.kmeans import KMeansResult

SELECTIONS = ("per_group", "top_c", "random")


def nearest_heads(points: Tensor, result: KMeansResult) -> list[int]:
    """For each non-empty group, the member head nearest its centre."""
    d = torch.cdist(points.detach().float(), result.centres.float())  # [H, C]
    winners = []
    for g in range(result.centres.shape[0]):
        members = (result.labels == g).nonzero().flatten()
        if len(members):
            winners.append(int(members[d[members, g].argmin()]))
    return winners


def select_heads(votes: list[int], groups: list[int], k: int, rule: str, seed: int = 0) -> list[int]:
    """Kept head indices (sorted) from per-head vote counts and the final group of each head."""
    heads = range(len(votes))
    if rule == "top_c":
        order = sorted(heads, key=lambda h: (-votes[h], h))
        return sorted(order[:k])
    kept = []
    gen = torch.Generator().manual_seed(seed)
    for g in sorted(set(groups)):
        members = [h for h in heads if groups[h] == g]
        if rule == "per_group":
            kept.append(min(members, key=lambda h: (-votes[h], h)))
        elif rule == "random":
            kept.append(members[int(torch.randint(len(members), (1,), generator=gen))])
        else:
            raise ValueError(f"unknown selection {rule!r}; use one of {SELECTIONS}")
    return sorted(kept)


def plot_votes(votes: dict[str, list[int]], plan: dict[str, list[int]], out_png: str) -> None:
    """Heat map module × head of vote counts, kept heads outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(votes)
    if not names:
        return
    matrix = torch.tensor([votes[n] for n in names], dtype=torch.float)
    fig, ax = plt.subplots(figsize=(1.2 + 0.5 * matrix.shape[1], 0.6 + 0.32 * len(names)))
    im = ax.imshow(matrix, cmap="viridis", aspect="auto")
    for r, name in enumerate(names):
        for h in plan.get(name, []):
            ax.add_patch(plt.Rectangle((h - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    ax.set_yticks(range(len(names)), [n.replace(".layers.", ".").replace("_attn", "") for n in names], fontsize=7)
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_xlabel("head (red = kept)")
    fig.colorbar(im, ax=ax, label="votes")
    ax.set_title("Voting-to-Stay")
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
