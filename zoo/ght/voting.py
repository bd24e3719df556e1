"""Voting-to-Stay (paper Algorithm 1): in every voting batch, for every module and every voting feature map
(V, A and O by default), the head nearest its group's centre gets one vote per group; then each group keeps its
most-voted head (`per_group`, the paper) or the C most-voted heads overall stay (`top_c`, the official code).

One labeling: the groups are the converged groups of the end-of-GCT probe (k-means on the training feature
map), used for the votes *and* for the per-group choice; in each voting batch a group's centre in a map is
the mean of its members' points in that map. Ablations as the paper names them: `random_in_group` keeps a
random member of each group ("w/o PS stay"), `random_heads` keeps as many heads as `per_group` chosen at
random, ignoring the groups ("w/o HUDS": heads switched off at random). Ties go to the lower head index, so
plans are deterministic."""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.ght.kmeans import KMeansResult, group_means

SELECTIONS = ("per_group", "top_c", "random_in_group", "random_heads")
RENAMED = {"random": "random_in_group (the paper's 'w/o PS stay') or random_heads (its 'w/o HUDS')"}


def fixed_groups(points: Tensor, labels: list[int] | Tensor, k: int) -> KMeansResult:
    """The given grouping with its centres in this batch's points: [H, F] points and [H] labels → centres
    [k, F] (or a batch of modules of one shape: [M, H, F] and [M, H] → [M, k, F])."""
    label_tensor = torch.as_tensor(labels, dtype=torch.long).to(points.device)
    centres = group_means(points.detach().float(), label_tensor, k)
    inertia = points.new_zeros(points.shape[:-2], dtype=torch.float32)
    return KMeansResult(labels=label_tensor, centres=centres, inertia=inertia)


def _nearest_members(points: Tensor, result: KMeansResult) -> tuple[Tensor, Tensor]:
    """([C] the member head nearest each group's centre, [C] whether the group has members) — [M, C] each for
    a batch of modules — on the points' device without a host read: Voting-to-Stay asks this of every module,
    map and batch of an epoch."""
    d = torch.cdist(points.detach().float(), result.centres.float())  # [..., H, C]
    groups = torch.arange(result.centres.shape[-2], device=points.device)
    member = result.labels[..., :, None] == groups  # [..., H, C]
    d = torch.where(member, d, torch.full_like(d, float("inf")))
    return d.argmin(dim=-2), member.any(dim=-2)  # argmin takes the first of equal distances, as a loop would


def nearest_heads(points: Tensor, result: KMeansResult) -> list[int]:
    """For each non-empty group, the member head nearest its centre."""
    winners, present = _nearest_members(points, result)
    return [int(h) for h, p in zip(winners.tolist(), present.tolist(), strict=True) if p]


def head_votes(points: Tensor, result: KMeansResult) -> Tensor:
    """[H] (or [M, H]) one vote for each head that is the nearest member of its (non-empty) group."""
    winners, present = _nearest_members(points, result)
    votes = torch.zeros(points.shape[:-1], device=points.device)
    return votes.scatter_add(-1, winners, present.to(votes.dtype))


def select_heads(votes: list[int], groups: list[int], k: int, rule: str, seed: int = 0) -> list[int]:
    """Kept head indices (sorted) from per-head vote counts and the final group of each head."""
    if rule in RENAMED:
        raise ValueError(f"selection={rule!r} was ambiguous and is renamed: use {RENAMED[rule]}")
    if rule not in SELECTIONS:
        raise ValueError(f"unknown selection {rule!r}; use one of {SELECTIONS}")
    heads = range(len(votes))
    gen = torch.Generator().manual_seed(seed)
    present = sorted(set(groups))
    if rule == "top_c":
        order = sorted(heads, key=lambda h: (-votes[h], h))
        return sorted(order[:k])
    if rule == "random_heads":  # as many heads as one per group, drawn without regard to the groups
        return sorted(int(h) for h in torch.randperm(len(votes), generator=gen)[: len(present)])
    kept = []
    for g in present:
        members = [h for h in heads if groups[h] == g]
        if rule == "per_group":
            kept.append(min(members, key=lambda h: (-votes[h], h)))
        else:  # random_in_group
            kept.append(members[int(torch.randint(len(members), (1,), generator=gen))])
    return sorted(kept)


def plot_votes(votes: dict[str, list[int]], plan: dict[str, list[int]], out_png: str) -> None:
    """Heat map module × head of vote counts, kept heads outlined."""
    # imported here: matplotlib is slow to import and only plotting needs it, and the Agg backend must be
    # selected before pyplot loads (at module level that would change the backend of whoever imports us)
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
