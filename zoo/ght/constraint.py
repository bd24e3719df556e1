"""The group-constraint loss (paper Eq. 4(B), metric-learning form) and compactness metrics.

Loss per module = −α · mean_i cos(e_i, c_g(i)) + β · mean_{j1<j2} cos(c_j1, c_j2), where the
centres c_j are the means of their members' points *with* gradient (assignments come from
k-means on detached points): the first term pulls heads towards their group, the second pushes
groups apart. How modules are combined and scaled against the task loss is the procedure's
`loss_normalization` (zoo/ght/options.py): `token_sum` sums the modules and divides by the batch's
target tokens (the official criterion's scale), `mean` averages them at full per-token strength.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.ght.kmeans import group_means


def homogeneity_diversity(points: Tensor, labels: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(mean cos(head, its centre), mean cos between distinct non-empty centres); points [H, F] with labels [H]
    give two scalars, a batch of modules [M, H, F] with [M, H] gives two [M].

    Written with one-hot matmuls and masks instead of advanced indexing: indexing's backward
    accumulates with index_put, whose summation order is not reproducible on CPU."""
    onehot = F.one_hot(labels, k).to(points.dtype)  # [..., H, k]
    centres = group_means(points, labels, k)  # [..., k, F]
    homogeneity = F.cosine_similarity(points, onehot @ centres, dim=-1).mean(-1)  # [...]
    present = (onehot.sum(-2) > 0).to(points.dtype)  # [..., k]
    pair = torch.triu(present[..., :, None] * present[..., None, :], diagonal=1)  # [..., k, k] distinct pairs
    c = F.normalize(centres, dim=-1)
    sims = c @ c.transpose(-2, -1)  # [..., k, k]
    # no pair (one group): 0 / 1 = 0, without reading the count back to the host on a GPU
    return homogeneity, (sims * pair).sum((-2, -1)) / pair.sum((-2, -1)).clamp(min=1)


def group_constraint_loss(
    points: Tensor, labels: Tensor, k: int, alpha: float, beta: float
) -> tuple[Tensor, Tensor, Tensor]:
    """−α·homogeneity + β·diversity, with both terms detached beside it; [] for one module, [M] for a batch."""
    hom, div = homogeneity_diversity(points, labels, k)
    return -alpha * hom + beta * div, hom.detach(), div.detach()


@torch.no_grad()
def compactness(points: Tensor, labels: Tensor, k: int) -> dict:
    """One module's partition and its compactness on [H, F] points with [H] labels: mean cos of a head to its
    group's centre, mean cos between centres, silhouette and Dunn index (rounded: what a record stores)."""
    hom, div = homogeneity_diversity(points.float(), labels, k)
    return {
        "groups": [int(g) for g in labels.tolist()],
        "intra_cos": round(float(hom), 4),
        "inter_cos": round(float(div), 4),
        "silhouette": round(silhouette(points, labels), 4),
        "dunn": round(dunn_index(points, labels), 4),
    }


@torch.no_grad()
def silhouette(points: Tensor, labels: Tensor) -> float:
    """Mean silhouette coefficient (Euclidean; a singleton's s is 0, Rousseeuw's convention)."""
    points = points.float()
    d = torch.cdist(points, points)  # [N, N]
    groups = labels.unique()
    if len(groups) < 2:
        return 0.0
    scores = []
    for i in range(points.shape[0]):
        own = labels == labels[i]
        if own.sum() <= 1:
            scores.append(0.0)
            continue
        a = d[i, own].sum() / (own.sum() - 1)
        b = min(float(d[i, labels == g].mean()) for g in groups if g != labels[i])
        scores.append(float((b - a) / max(float(a), b, 1e-12)))
    return sum(scores) / len(scores)


@torch.no_grad()
def dunn_index(points: Tensor, labels: Tensor) -> float:
    """min inter-group point distance / max intra-group diameter (higher = more compact)."""
    points = points.float()
    d = torch.cdist(points, points)
    same = labels[:, None] == labels[None, :]
    if same.all():
        return 0.0
    inter = d[~same].min()
    diameter = d[same].max()
    return float(inter / diameter) if diameter > 0 else float("inf")
