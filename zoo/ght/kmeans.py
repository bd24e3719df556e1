"""Deterministic k-means over a handful of points (one point per attention head).

Heads are few (≤ 16) but each point is huge (a head's feature map flattened over batch ×
positions), so Lloyd iterations on cdist are cheap. Labels are canonicalised (groups numbered by
their smallest member) so partitions from different runs compare with `==`.

GHT clusters 9+ modules at every update, so on a GPU nothing here reads a value back to the host
inside an iteration (a host sync per iteration made GHT ~5x slower than the transformer on a
shared GPU): empty groups are re-seeded and labels renumbered with tensor ops, and convergence is
tested at iterations 2, 4, 8, 16 there (every iteration on the CPU, where the test is free). A
converged partition is a fixed point of the iteration, so the labels are the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KMeansResult:
    labels: Tensor  # [N] long, canonical
    centres: Tensor  # [C, F]
    inertia: Tensor  # [] sum of squared distances to the centres (a tensor: reading it is the caller's sync)


def canonical_labels(labels: Tensor, k: int | None = None) -> Tensor:
    """Renumber groups in order of first appearance (group of point 0 is 0, …); `k` (≥ the number of
    groups) spares the host read of the largest label."""
    n = labels.numel()
    k = int(labels.max()) + 1 if k is None else k
    positions = torch.arange(n, device=labels.device)
    first = torch.full((k,), n, dtype=torch.long, device=labels.device)
    first = first.scatter_reduce(0, labels.long(), positions, reduce="amin")  # [k] first member (n if empty)
    order = torch.sort(first, stable=True).indices  # groups by first appearance, empty ones last
    new_number = torch.empty_like(order).scatter_(0, order, torch.arange(k, device=labels.device))  # [k]
    return new_number.gather(0, labels.long()).to(labels.dtype)


def reseed_empty_groups(new: Tensor, dist: Tensor, k: int) -> Tensor:
    """Give each empty group (in order) the point farthest from its centre among groups of ≥ 2 members.

    new [N] labels, dist [N, k] distances to the centres; written without host reads (see the module note)."""
    counts = torch.bincount(new, minlength=k)  # [k]
    for g in range(k):
        own = dist.gather(1, new[:, None]).squeeze(1)  # [N] distance of each point to its centre
        movable = counts.gather(0, new) > 1  # [N] points whose group keeps a member if they leave
        far = torch.where(movable, own, torch.full_like(own, -1.0)).argmax().view(1)  # [1]
        move = (counts[g] == 0) & movable.any()  # [] this group is empty and someone can move
        donor = new.gather(0, far)  # [1]
        counts = counts.scatter_add(0, donor, -move.long().view(1))
        counts[g] += move.long()
        new = new.scatter(0, far, torch.where(move, torch.full_like(donor, g), donor))
    return new


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
def kmeans(
    points: Tensor,
    k: int,
    iters: int = 50,
    seed: int = 0,
    init_labels: Tensor | None = None,
    test_every_iteration: bool | None = None,
) -> KMeansResult:
    """Cluster `points` [N, F] into `k` groups.

    `init_labels` warm-starts from a previous partition (centres = its group means), which keeps
    groups stable between steps; otherwise k-means++ seeded by `seed` makes the result
    reproducible. Empty groups are re-seeded with the point farthest from its centre.
    `test_every_iteration` (default: on the CPU only) tests convergence after each iteration rather than
    at iterations 2, 4, 8, 16; the result is the same."""
    points = points.detach().float()
    n = points.shape[0]
    if k >= n:
        labels = torch.arange(n, device=points.device)
        return KMeansResult(labels, points.clone(), points.new_zeros(()))
    gen = torch.Generator().manual_seed(seed)
    if init_labels is not None:
        init_labels = init_labels.long().to(points.device)
    # labels already on an accelerator came from a k-means with this k: checking them would cost a host sync
    if init_labels is not None and (init_labels.device.type != "cpu" or int(init_labels.max()) < k):
        centres = group_means(points, init_labels, k)
    else:
        centres = _kmeans_pp(points, k, gen)
    every = points.device.type == "cpu" if test_every_iteration is None else test_every_iteration
    labels = torch.full((n,), -1, dtype=torch.long, device=points.device)
    for it in range(iters):
        dist = torch.cdist(points, centres)  # [N, k]
        new = reseed_empty_groups(dist.argmin(dim=1), dist, k)  # [N]
        tested = every or (it > 0 and (it & (it + 1)) == 0)  # iterations 2, 4, 8, 16 when not every one
        if tested and torch.equal(new, labels):
            break
        labels = new
        centres = group_means(points, labels, k)
    labels = canonical_labels(labels, k)
    centres = group_means(points, labels, k)
    inertia = (points - centres[labels]).pow(2).sum()
    return KMeansResult(labels, centres, inertia)
