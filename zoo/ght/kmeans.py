"""Deterministic k-means over a handful of points (one point per attention head).

Heads are few (≤ 16) but each point is huge (a head's feature map flattened over batch ×
positions), so Lloyd iterations on cdist are cheap. Labels are canonicalised (groups numbered by
their smallest member) so partitions from different runs compare with `==`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KMeansResult:
    labels: Tensor  # [N] long, canonical
    centres: Tensor  # [C, F]
    inertia: float


def canonical_labels(labels: Tensor) -> Tensor:
    """Renumber groups in order of first appearance (group of point 0 is 0, …)."""
    mapping: dict[int, int] = {}
    renumbered = [mapping.setdefault(g, len(mapping)) for g in labels.tolist()]
    return torch.tensor(renumbered, dtype=labels.dtype, device=labels.device)


def group_means(points: Tensor, labels: Tensor, k: int) -> Tensor:
    """[k, F] mean of each group's points (differentiable; an empty group gets zeros)."""
    onehot = torch.nn.functional.one_hot(labels, k).to(points.dtype)  # [N, k]
    counts = onehot.sum(0).clamp(min=1)  # [k]
    return (onehot.t() @ points) / counts[:, None]


def _kmeans_pp(points: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """k-means++ seeding; `gen` is a CPU generator whatever the points' device, so a seed picks the same
    centres on a GPU as on the CPU (up to the distances' rounding)."""
    n = points.shape[0]
    first = int(torch.randint(n, (1,), generator=gen))
    centres = [points[first]]
    for _ in range(1, k):
        d2 = torch.cdist(points, torch.stack(centres)).min(dim=1).values.pow(2)  # [N]
        if float(d2.sum()) <= 0:
            idx = int(torch.randint(n, (1,), generator=gen))
        else:
            idx = int(torch.multinomial((d2 / d2.sum()).cpu(), 1, generator=gen))
        centres.append(points[idx])
    return torch.stack(centres)


@torch.no_grad()
def kmeans(points: Tensor, k: int, iters: int = 50, seed: int = 0, init_labels: Tensor | None = None) -> KMeansResult:
    """Cluster `points` [N, F] into `k` groups.

    `init_labels` warm-starts from a previous partition (centres = its group means), which keeps
    groups stable between steps; otherwise k-means++ seeded by `seed` makes the result
    reproducible. Empty groups are re-seeded with the point farthest from its centre."""
    points = points.detach().float()
    n = points.shape[0]
    if k >= n:
        labels = torch.arange(n, device=points.device)
        return KMeansResult(labels, points.clone(), 0.0)
    gen = torch.Generator().manual_seed(seed)
    if init_labels is not None and int(init_labels.max()) < k:
        centres = group_means(points, init_labels.long().to(points.device), k)
    else:
        centres = _kmeans_pp(points, k, gen)
    labels = torch.full((n,), -1, dtype=torch.long, device=points.device)
    for _ in range(iters):
        dist = torch.cdist(points, centres)  # [N, k]
        new = dist.argmin(dim=1)
        counts = torch.bincount(new, minlength=k)
        for empty in (counts == 0).nonzero().flatten().tolist():
            own = dist.gather(1, new[:, None]).squeeze(1)  # distance of each point to its centre
            movable = counts[new] > 1
            if not movable.any():
                break
            far = int(torch.where(movable, own, torch.full_like(own, -1.0)).argmax())
            counts[new[far]] -= 1
            new[far] = empty
            counts[empty] = 1
        if torch.equal(new, labels):
            break
        labels = new
        centres = group_means(points, labels, k)
    labels = canonical_labels(labels)
    centres = group_means(points, labels, k)
    inertia = float((points - centres[labels]).pow(2).sum())
    return KMeansResult(labels, centres, inertia)
