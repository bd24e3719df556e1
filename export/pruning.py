"""Head plans for export: read them, derive them from head importance, remove heads physically.

A head plan maps attention-module names ("decoder.layers.0.self_attn", …) to the *original* head
indices that stay, in every context: in a checkpoint's ModelConfig, in a `head_plan=plan.json`
file, in manifest.json. A checkpoint may already have heads gated off (GHT-PS fine-tuning:
`heads_removed=False`) or removed (`heads_removed=True`, then module position p holds original
head `plan[p]`); a new plan may only keep heads that are still active in it.

Why physical removal is exact: a gated head's output is multiplied by 0 before out_proj, so dropping
its q/k/v rows and out_proj columns (bias untouched) leaves every other number as it was
(`Attention.keep_heads`); the export verifies it on real sentences anyway.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from export.graph import ExportError
from zoo.attention import HeadPruningUnsupported
from zoo.model import Transformer, build_model

HeadPlan = dict[str, list[int]]


def original_indices(model: Transformer) -> dict[str, list[int]]:
    """Module name → original head index of each present head position."""
    cfg = model.cfg
    out = {}
    for name, module in model.attention_modules().items():
        if cfg.heads_removed and name in cfg.head_plan:
            out[name] = list(cfg.head_plan[name])
        else:
            out[name] = list(range(module.num_heads))
    return out


def active_heads(model: Transformer) -> dict[str, list[int]]:
    """Module name → original indices of the heads that contribute (present and gate ≠ 0)."""
    present = original_indices(model)
    modules = model.attention_modules()
    return {
        name: [h for p, h in enumerate(heads) if float(modules[name].head_gate[p]) != 0.0]
        for name, heads in present.items()
    }


def load_plan(path: str | Path) -> HeadPlan:
    """Read a JSON head plan {module: [head, …]}; errors name the file and the problem."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ExportError(f"head plan {p} does not exist; pass head_plan=<file.json> with {{module: [heads]}}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"head plan {p} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in v)
        for k, v in data.items()
    ):
        raise ExportError(
            f"head plan {p} must be a JSON object mapping module names to lists of head indices, "
            'e.g. {"decoder.layers.0.self_attn": [0, 3]}'
        )
    return {k: list(v) for k, v in data.items()}


def validate_plan(plan: HeadPlan, model: Transformer) -> HeadPlan:
    """Check a plan against the model's active heads; returns it with sorted head lists."""
    active = active_heads(model)
    unknown = sorted(set(plan) - set(active))
    if unknown:
        raise ExportError(f"head plan names unknown attention modules {unknown}; this model has: {', '.join(active)}")
    clean = {}
    for name, heads in plan.items():
        if not heads:
            raise ExportError(f"head plan keeps no head of {name}; every module needs at least one")
        if len(set(heads)) != len(heads):
            raise ExportError(f"head plan repeats a head of {name}: {heads}")
        missing = sorted(set(heads) - set(active[name]))
        if missing:
            raise ExportError(
                f"head plan keeps heads {missing} of {name}, which are not active in this checkpoint "
                f"(active heads: {active[name]})"
            )
        clean[name] = sorted(heads)
    return clean


def final_plan(model: Transformer, plan: HeadPlan) -> HeadPlan:
    """The plan of the exported model: `plan` where given, else each module's active heads; modules
    that keep all their original heads are left out."""
    active = active_heads(model)
    num_heads = model.cfg.num_heads
    out = {}
    for name, heads in active.items():
        kept = plan.get(name, heads)
        if kept != list(range(num_heads)):
            out[name] = list(kept)
    return out


def prune(model: Transformer, plan: HeadPlan, remove: bool = True) -> tuple[Transformer, Transformer]:
    """(exported model, gated reference) for a validated `plan` (original indices).

    The reference is the checkpoint's model with every head outside the final plan gated off; the
    exported model has those heads physically removed and is rebuilt from its config alone (a
    strict state-dict load proves the config describes it). With `remove=False` both are the gated
    model (for mechanisms whose head removal is inexact).
    """
    plan = final_plan(model, plan)
    present = original_indices(model)
    gated = copy.deepcopy(model).eval()
    modules = gated.attention_modules()
    for name, kept in plan.items():
        positions = [present[name].index(h) for h in kept]
        mask = torch.zeros_like(modules[name].head_gate)
        mask[positions] = 1.0
        modules[name].head_gate.mul_(mask)
    if not model.cfg.heads_removed:
        # the gated model's config says which heads are gated, so manifest.json describes it fully
        gated.cfg.head_plan = {name: list(kept) for name, kept in plan.items()}
    if not remove:
        return gated, gated
    pruned = copy.deepcopy(gated)
    modules = pruned.attention_modules()
    for name, kept in plan.items():
        positions = [present[name].index(h) for h in kept]
        if positions == list(range(modules[name].num_heads)):
            continue
        try:
            modules[name].keep_heads(positions)
        except HeadPruningUnsupported as exc:
            reason = str(exc).rstrip(".")
            raise ExportError(
                f"attention mechanism {model.cfg.attention!r} cannot remove heads of {name} exactly: "
                f"{reason}. Export with remove_heads=false to keep them gated instead"
            ) from exc
    cfg = copy.deepcopy(pruned.cfg)
    cfg.head_plan = plan
    cfg.heads_removed = True
    rebuilt = build_model(cfg)
    try:
        rebuilt.load_state_dict(pruned.state_dict())
    except RuntimeError as exc:
        raise ExportError(f"the pruned model cannot be rebuilt from its config alone: {exc}") from exc
    return rebuilt.eval(), gated


def _batch(
    pairs: Sequence[tuple[list[int], list[int]]], pad: int, bos: int, eos: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src [B, S], tgt_in [B, T], tgt_out [B, T]) right-padded."""
    s = max(len(src) for src, _ in pairs)
    t = max(len(tgt) for _, tgt in pairs) + 1
    src = torch.full((len(pairs), s), pad, dtype=torch.long)
    tgt_in = torch.full((len(pairs), t), pad, dtype=torch.long)
    tgt_out = torch.full((len(pairs), t), pad, dtype=torch.long)
    for i, (a, b) in enumerate(pairs):
        src[i, : len(a)] = torch.tensor(a, dtype=torch.long)
        tgt_in[i, : len(b) + 1] = torch.tensor([bos, *b], dtype=torch.long)
        tgt_out[i, : len(b) + 1] = torch.tensor([*b, eos], dtype=torch.long)
    return src, tgt_in, tgt_out


def head_importance(
    model: Transformer, pairs: Sequence[tuple[list[int], list[int]]], batch_size: int = 1
) -> dict[str, dict[int, float]]:
    """Michel et al. (2019) head importance: I_h = Σ_batches |∂L/∂gate_h|, L the mean token
    cross-entropy of a batch (batch_size=1: their per-example expectation).

    Computed on the active heads only, keyed by original head index. Their per-layer ℓ2
    normalisation only matters for a global budget; a per-module budget is invariant to it.
    """
    if not pairs:
        raise ExportError("no sentence pairs to estimate head importance on")
    work = copy.deepcopy(model).eval()  # eval: dropout off, the gradients measure the deployed model
    for p in work.parameters():
        p.requires_grad_(False)
    modules = work.attention_modules()
    gates = {}
    for name, module in modules.items():
        module.head_gate = module.head_gate.detach().clone().requires_grad_(True)
        gates[name] = module.head_gate
    totals = {name: torch.zeros_like(g) for name, g in gates.items()}
    cfg = work.cfg
    for start in range(0, len(pairs), batch_size):
        src, tgt_in, tgt_out = _batch(pairs[start : start + batch_size], cfg.pad_id, cfg.bos_id, cfg.eos_id)
        logits = work(src, tgt_in)  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=cfg.pad_id)
        grads = torch.autograd.grad(loss, list(gates.values()))
        for name, g in zip(gates, grads, strict=True):
            totals[name] += g.abs()
    present, active = original_indices(model), active_heads(model)
    return {
        name: {h: float(totals[name][p]) for p, h in enumerate(present[name]) if h in active[name]} for name in modules
    }


MODULE_KINDS = ("encoder_self", "decoder_self", "decoder_cross")


def module_kind(name: str) -> str:
    """ "encoder.layers.3.self_attn" → "encoder_self" (the kinds GHT's config uses too)."""
    stack, attn = name.split(".")[0], name.rsplit(".", 1)[-1]
    return f"{stack}_{attn.removesuffix('_attn')}"


def plan_from_importance(scores: dict[str, dict[int, float]], keep: int | Mapping[str, int]) -> HeadPlan:
    """Keep the most important active heads of every module (ties: lower index).

    `keep` is the per-module budget: one int for every module, or a mapping from module kinds
    (encoder_self, decoder_self, decoder_cross) and/or full module names (which win) to a head
    count; modules it does not name keep all their heads."""
    budget = dict(keep) if isinstance(keep, Mapping) else {kind: keep for kind in MODULE_KINDS}
    unknown = sorted(set(budget) - set(MODULE_KINDS) - set(scores))
    if unknown:
        raise ExportError(
            f"keep_heads names {unknown}: use module kinds {', '.join(MODULE_KINDS)} or module names "
            f"such as {next(iter(scores), 'decoder.layers.0.self_attn')}"
        )
    plan = {}
    for name, per_head in scores.items():
        k = budget.get(name, budget.get(module_kind(name)))
        if k is None:
            continue
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ExportError(f"keep_heads for {name} must be an integer >= 1, got {k!r}")
        ranked = sorted(per_head, key=lambda h: (-per_head[h], h))
        plan[name] = sorted(ranked[:k])
    return plan
