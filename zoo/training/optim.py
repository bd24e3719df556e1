"""Optimiser, learning-rate schedule and loss of the fairseq transformer recipe."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

OPTIMIZER_KERNELS = ("for_loop", "foreach", "fused")


def build_optimizer(
    model: nn.Module,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    kernel: str = "for_loop",
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters. `kernel` (OPTIMIZER_KERNELS) is torch's implementation of the same
    update: one small op per parameter and step (for_loop, torch's CPU default), grouped tensors (foreach), or one
    fused kernel (fused); they agree up to float rounding."""
    if kernel not in OPTIMIZER_KERNELS:
        raise ValueError(f"optimizer kernel {kernel!r}: use one of {', '.join(OPTIMIZER_KERNELS)}")
    params = [p for p in model.parameters() if p.requires_grad]
    choice = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[kernel]
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **choice)


def _warmup_then(
    optimizer: torch.optim.Optimizer,
    warmup_updates: int,
    warmup_init_lr: float,
    after: Callable[[int, int], float],
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from `warmup_init_lr` to the optimizer's peak lr, then `after(step, warmup)` as a multiplier
    of the peak: the part both schedules share."""
    peak = optimizer.param_groups[0]["lr"]
    start = min(warmup_init_lr / peak, 1.0)
    warmup = max(warmup_updates, 1)

    def factor(step: int) -> float:
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        return after(step, warmup)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def inverse_sqrt_schedule(
    optimizer: torch.optim.Optimizer, warmup_updates: int, warmup_init_lr: float = 1e-7
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the peak lr over `warmup_updates`, then decay ∝ 1/√step (fairseq's
    inverse_sqrt). Expressed as a multiplier of the optimizer's peak lr."""
    return _warmup_then(optimizer, warmup_updates, warmup_init_lr, lambda step, warmup: (warmup / step) ** 0.5)


LR_SCHEDULES = ("inverse_sqrt", "linear")


def linear_decay_schedule(
    optimizer: torch.optim.Optimizer,
    warmup_updates: int,
    remaining: Callable[[int], float],
    warmup_init_lr: float = 1e-7,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the peak lr, then linear decay to zero where the budget ends (budgeted training,
    Li et al., ICLR 2020): a run stopped by its budget ends annealed instead of mid-descent.
    `remaining(step)` is the fraction of the post-warm-up budget still left, in [0, 1]."""
    return _warmup_then(optimizer, warmup_updates, warmup_init_lr, lambda step, _: min(max(remaining(step), 0.0), 1.0))


def budget_left(
    step: int,
    warmup_updates: int,
    max_updates: int,
    elapsed_s: float = 0.0,
    max_minutes: float = 0.0,
    warmup_end_s: float | None = None,
) -> float:
    """Fraction of the post-warm-up budget left after `step` updates: the smaller of what `max_updates` and
    `max_minutes` leave (0 = no such limit). A wall-clock budget is measured from `warmup_end_s`, the elapsed
    training time when warm-up ended (still warming up: from now)."""
    left = 1.0
    warmup = max(warmup_updates, 1)
    if max_updates:
        left = min(left, (max_updates - step) / max(max_updates - warmup, 1))
    if max_minutes:
        budget_s = max_minutes * 60
        start = warmup_end_s if warmup_end_s is not None else elapsed_s
        left = min(left, (budget_s - elapsed_s) / max(budget_s - start, 1e-9))
    return left


def budget_reached(fraction: float, step: int, max_updates: int, elapsed_s: float, max_minutes: float) -> str:
    """Which limit of a run's budget `fraction` of it has been spent of after `step` updates and `elapsed_s`
    training seconds: "max_updates", "max_minutes" (0 = no wall-clock limit) or "". One rule for the end of
    training (fraction 1, the trainer) and for what happens partway (GHT-PS votes at a fractional vote_at)."""
    if step >= fraction * max_updates:
        return "max_updates"
    if max_minutes and elapsed_s >= fraction * max_minutes * 60:
        return "max_minutes"
    return ""


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over non-pad target tokens.

    logits [B, T, V], target [B, T]. Smoothing spreads ε uniformly over the vocabulary (torch's
    and fairseq's definition); one log-softmax serves both the loss and the NLL (perplexity)."""
    lprobs = F.log_softmax(logits.float(), dim=-1).reshape(-1, logits.shape[-1])  # [B*T, V]
    flat = target.reshape(-1, 1)
    keep = flat.ne(pad_id)
    nll = -lprobs.gather(1, flat).masked_fill(~keep, 0.0).sum()
    smooth = -lprobs.sum(dim=-1, keepdim=True).masked_fill(~keep, 0.0).sum()
    vocab = logits.shape[-1]
    loss = (1.0 - smoothing) * nll + smoothing / vocab * smooth
    return loss, nll.detach()
