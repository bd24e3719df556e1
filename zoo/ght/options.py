"""What a GHT / GHT-PS run is configured with (`model.ght.*`): the options, each checked when the run is composed
(`GHTOptions.from_config` names the allowed values), and the stages a run passes through — apart from the procedure
that carries them out (procedure.py) so that commands and tools can read and validate them without the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from zoo.attention import FEATURE_MAPS
from zoo.ght.features import MODULE_KINDS
from zoo.ght.voting import RENAMED, SELECTIONS

LOSS_NORMALIZATIONS = ("mean", "token_sum")
VOTE_TRIGGERS = ("fixed", "converged")
KMEANS_INITS = ("warm", "fixed_heads")


class Stage(str, Enum):
    """GHT-PS's stages in order; the value is what `last.pt` stores (a plain string, so checkpoints written
    before this enum existed resume unchanged)."""

    GCT = "gct"  # group-constrained training
    VOTE = "vote"  # Voting-to-Stay (one pass, then the plan is applied)
    FINETUNE = "finetune"  # task loss only, non-kept heads gated off and frozen


@dataclass
class GHTOptions:
    groups: int = 2  # C
    alpha: float = 0.5  # homogenisation weight
    beta: float = 0.5  # diversification weight
    feature_map: str = "V"  # V | A | O
    modules: list[str] = field(default_factory=lambda: list(MODULE_KINDS))
    kmeans_every: int = 1  # re-run k-means every N updates (1 = every step, as the official code)
    kmeans_iters: int = 20
    kmeans_init: str = "warm"  # warm: from the previous update's groups (stable partitions) | fixed_heads: from the
    #                            same C heads' points on every update, as the official kmeans_pytorch call (numpy's
    #                            choice of C of H heads under seed 0)
    loss_normalization: str = "token_sum"  # token_sum: the official scale — every module's terms summed, then
    #   divided by the batch's target tokens, exactly as the official fairseq criterion adds them to a
    #   token-summed loss that fairseq divides by the token count | mean: the mean over modules at full strength
    #   against the per-token task loss (a per-token, per-module option)
    constraint_scale: float = 1.0  # multiplier on the normalised constraint weight (the ght_scan suite's axis);
    #   1 = the official scale under token_sum
    homogenize: bool = True  # ablation: False drops the −α term
    diversify: bool = True  # ablation: False drops the +β term
    prune: bool = False  # GHT-PS: vote and fine-tune
    vote_at: float = 0.6  # vote at this update (≥ 1) or fraction of the budget (< 1: of max_updates, or of
    #                       max_minutes when that ends first): the analogue of the official epoch_start_to_prune
    vote_trigger: str = "fixed"  # fixed: vote at vote_at, compact or not (the official schedule) | converged:
    #                              earlier when the trained groups' centres stop moving on the probe batch
    check_every: int = 100  # probe-batch convergence checks every N updates
    shift_threshold: float = 0.05  # relative centre shift that counts as converged
    patience: int = 3  # consecutive converged checks needed
    probe_sentences: int = 32  # fixed probe batch: the first N validation pairs
    vote_batches: int = 0  # voting pass length in training batches (0 = one full epoch, the paper)
    vote_maps: list[str] = field(default_factory=lambda: ["V", "A", "O"])  # maps that vote (paper: all three;
    #                         the official code: its one clustering map, e.g. [O])
    selection: str = "per_group"  # per_group (paper) | top_c (official code) | random_in_group (w/o PS stay)
    #                               | random_heads (w/o HUDS)
    seed: int = 0
    finetune_patience: int = 3  # early stopping (validations) in the fine-tuning stage; 0 = off
    init_stage: str = "vote"  # stage to begin with when init_from= gives trained GHT weights

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> GHTOptions:
        known = set(cls.__dataclass_fields__)
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"unknown model.ght options {sorted(unknown)}; known: {sorted(known)}")
        opts = cls(**cfg)
        if opts.feature_map not in FEATURE_MAPS:
            raise ValueError(f"model.ght.feature_map={opts.feature_map!r}: use V, A or O")
        opts.vote_maps = list(opts.vote_maps)
        if (
            not opts.vote_maps
            or set(opts.vote_maps) - set(FEATURE_MAPS)
            or len(set(opts.vote_maps)) < len(opts.vote_maps)
        ):
            raise ValueError(
                f"model.ght.vote_maps={opts.vote_maps}: a non-empty list of distinct maps among "
                "V, A, O (the paper votes with [V, A, O])"
            )
        if opts.selection in RENAMED:
            raise ValueError(f"model.ght.selection={opts.selection!r} is renamed: use {RENAMED[opts.selection]}")
        if opts.selection not in SELECTIONS:
            raise ValueError(f"model.ght.selection={opts.selection!r}: use one of {list(SELECTIONS)}")
        if opts.vote_batches < 0:
            raise ValueError("model.ght.vote_batches must be >= 0 (0 = one full epoch)")
        bad = set(opts.modules) - set(MODULE_KINDS)
        if bad:
            raise ValueError(f"model.ght.modules has {sorted(bad)}; use any of {list(MODULE_KINDS)}")
        if opts.groups < 1:
            raise ValueError("model.ght.groups must be >= 1")
        if opts.init_stage not in {stage.value for stage in Stage}:
            raise ValueError(f"model.ght.init_stage={opts.init_stage!r}: use one of {[stage.value for stage in Stage]}")
        if opts.kmeans_init not in KMEANS_INITS:
            raise ValueError(f"model.ght.kmeans_init={opts.kmeans_init!r}: use one of {list(KMEANS_INITS)}")
        if opts.vote_trigger not in VOTE_TRIGGERS:
            raise ValueError(f"model.ght.vote_trigger={opts.vote_trigger!r}: use one of {list(VOTE_TRIGGERS)}")
        if not opts.constraint_scale > 0:
            raise ValueError(f"model.ght.constraint_scale={opts.constraint_scale}: use a positive multiplier")
        if opts.loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(
                f"model.ght.loss_normalization={opts.loss_normalization!r}: use one of {list(LOSS_NORMALIZATIONS)}"
            )
        return opts
