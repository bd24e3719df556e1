"""Deterministic k-means over a handful of points (one point per attention head).

Heads are few (≤ 16) but each point is huge (a head's feature map flattened over batch ×
positions), so Lloyd iterations on cdist are cheap. Labels are canonicalised (groups numbered by
their smallest member) so partitions from different runs compare with `==`.

GHT clusters 9+ modules at every update, and on a GPU shared by several runs its rate follows the
number of kernels it launches: so every function here also takes a batch of modules of one shape
([M, N, F] points, one k-means each, in one set of kernels), and nothing reads a value back to the
host inside an iteration — empty groups are re-seeded and labels renumbered with tensor ops, and
convergence is tested at iterations 2, 4, 8, 16 there (every iteration on the CPU, where the test is
free). A converged partition is a fixed point of the iteration, so the labels are the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KMeansResult:
    labels: Tensor  # [N] (or [M, N]) long, canonical
    centres: Tensor  # [C, F] (or [M, C, F])
    inertia: Tensor  # [] (or [M]) sum of squared distances to the centres (reading it is the caller's sync)


def canonical_labels(labels: Tensor, k: int | None = None) -> Tensor:
    """Renumber groups in order of first appearance (group of point 0 is 0, …) along the last dim; `k` (≥ the
    number of groups) spares the host read of the largest label."""
    n = labels.shape[-1]
    k = int(labels.max()) + 1 if k is None else k
    flat = labels.long().reshape(-1, n)  # [M, N]
    positions = torch.arange(n, device=labels.device).expand_as(flat)
    first = torch.full((flat.shape[0], k), n, dtype=torch.long, device=labels.device)
    first = first.scatter_reduce(1, flat, positions, reduce="amin")  # [M, k] first member (n if empty)
    order = torch.sort(first, dim=1, stable=True).indices  # groups by first appearance, empty ones last
    numbers = torch.arange(k, device=labels.device).expand_as(order)
    new_number = torch.empty_like(order).scatter_(1, order, numbers)  # [M, k]
    return new_number.gather(1, flat).reshape(labels.shape).to(labels.dtype)


def reseed_empty_groups(new: Tensor, dist: Tensor, k: int) -> Tensor:
    """Give each empty group (in order) the point farthest from its centre among groups of ≥ 2 members.

    new [N] (or [M, N]) labels, dist [N, k] (or [M, N, k]) distances to the centres; without host reads."""
    batched = new.dim() == 2
    new, dist = (new, dist) if batched else (new[None], dist[None])  # [M, N], [M, N, k]
    counts = torch.nn.functional.one_hot(new, k).sum(1)  # [M, k]
    for g in range(k):
        own = dist.gather(2, new[..., None]).squeeze(2)  # [M, N] distance of each point to its centre
        movable = counts.gather(1, new) > 1  # [M, N] points whose group keeps a member if they leave
        far = torch.where(movable, own, torch.full_like(own, -1.0)).argmax(1, keepdim=True)  # [M, 1]
        move = ((counts[:, g] == 0) & movable.any(1))[:, None]  # [M, 1] group g is empty and a point can move
        donor = new.gather(1, far)  # [M, 1]
        counts = counts.scatter_add(1, donor, -move.long())
        counts[:, g] += move[:, 0].long()
        new = new.scatter(1, far, torch.where(move, torch.full_like(donor, g), donor))
    return new if batched else new[0]


def group_means(points: Tensor, labels: Tensor, k: int) -> Tensor:
    """[k, F] (or [M, k, F]) mean of each group's points (differentiable; an empty group gets zeros)."""
    onehot = torch.nn.functional.one_hot(labels, k).to(points.dtype)  # [..., N, k]
    counts = onehot.sum(-2).clamp(min=1)  # [..., k]
    return (onehot.transpose(-2, -1) @ points) / counts[..., None]


def _kmeans_pp(points: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """k-means++ seeding of [N, F] points; `gen` is a CPU generator whatever the points' device, so a seed
    picks the same centres on a GPU as on the CPU (up to the distances' rounding)."""
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
    init_points: Sequence[int] | None = None,
) -> KMeansResult:
    """Cluster `points` [N, F] into `k` groups — or each of M modules' [M, N, F], as M separate k-means.

    `init_labels` ([N] or [M, N]) warm-starts from a previous partition (centres = its group means), which
    keeps groups stable between steps; `init_points` (k indices) starts from those points as centres, as the
    official GHT code's kmeans_pytorch does on every call; otherwise k-means++ seeded by `seed` (the same seed for
    each of M) makes the result reproducible. Empty groups are re-seeded with the point farthest from its centre.
    `test_every_iteration` (default: on the CPU only) tests convergence after each iteration rather than
    at iterations 2, 4, 8, 16; the result is the same."""
    batched = points.dim() == 3
    points = points.detach().float()
    points = points if batched else points[None]  # [M, N, F]
    m, n = points.shape[:2]
    if k >= n:
        labels = torch.arange(n, device=points.device).expand(m, n)
        return _result(labels, points.clone(), points.new_zeros(m), batched)
    if init_labels is not None:
        init_labels = init_labels.long().to(points.device).reshape(m, n)
    # labels already on an accelerator came from a k-means with this k: checking them would cost a host sync
    if init_points is not None:
        centres = points[:, list(init_points)].clone()  # [M, k, F]
    elif init_labels is not None and (init_labels.device.type != "cpu" or int(init_labels.max()) < k):
        centres = group_means(points, init_labels, k)  # [M, k, F]
    else:
        centres = torch.stack([_kmeans_pp(p, k, torch.Generator().manual_seed(seed)) for p in points])
    every = points.device.type == "cpu" if test_every_iteration is None else test_every_iteration
    labels = torch.full((m, n), -1, dtype=torch.long, device=points.device)
    for it in range(iters):
        dist = torch.cdist(points, centres)  # [M, N, k]
        new = reseed_empty_groups(dist.argmin(dim=2), dist, k)  # [M, N]
        tested = every or (it > 0 and (it & (it + 1)) == 0)  # iterations 2, 4, 8, 16 when not every one
        if tested and torch.equal(new, labels):
            break
        labels = new
        centres = group_means(points, labels, k)
    labels = canonical_labels(labels, k)
    centres = group_means(points, labels, k)
    inertia = (points - centres.gather(1, labels[..., None].expand_as(points))).pow(2).sum((1, 2))  # [M]
    return _result(labels, centres, inertia, batched)


def _result(labels: Tensor, centres: Tensor, inertia: Tensor, batched: bool) -> KMeansResult:
    return KMeansResult(labels, centres, inertia) if batched else KMeansResult(labels[0], centres[0], inertia[0])
