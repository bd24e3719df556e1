"""GHT-PS as a branch of a GHT run: `zoo.train +model=ght_ps branch_from=<GHT run dir>` starts at the GHT run's
state where this GHT-PS votes, instead of training the same group-constrained updates again.

Why it is exact: until its vote, GHT-PS trains what GHT of the same options trains, update for update (the same
model, data order, losses and RNG draws; the pruning options act from the vote on). A GHT run keeps its full state
at that update in checkpoints/branch_point/ (zoo/training/branch_point.py: weights, optimizer, schedule, RNG,
groups, best and kept checkpoints, metrics and probe logs), written before the update's after-update work; the
branch loads it and does that work as GHT-PS would: the probe, Voting-to-Stay, the validation. So a branched GHT-PS
equals one trained from scratch (tests/test_ght.py checks the weights bit for bit), at 1 − vote_at of its cost.
Only settings that cannot change the updates before the vote may differ between the two runs (`MAY_DIFFER`); the
rest is refused, named.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.ght.options import GHTOptions
from zoo.training.branch_point import FOLDER, STATE

# what may differ between the GHT run and its GHT-PS branch: names and places, evaluation after training, and the
# pruning options, which act from the vote on (prune, how the vote is taken, the fine-tuning's early stop)
MAY_DIFFER = {
    "runs_root",
    "resume",
    "branch_from",
    "evaluate_test",
    "generation",
    "device",
    "trainer.progress",
    "trainer.threads",
    "trainer.cpu_allocator",
    "model.name",
    "model.ght.prune",
    "model.ght.vote_batches",
    "model.ght.vote_maps",
    "model.ght.selection",
    "model.ght.seed",
    "model.ght.finetune_patience",
    "model.ght.init_stage",
}


def check_branch(cfg: DictConfig) -> Path:
    """The branch point (a folder) of `cfg.branch_from` for this GHT-PS run; refuses what would not continue
    identically."""
    ght = cfg.model.get("ght")
    if ght is None or not ght.get("prune"):
        raise ValueError("branch_from= starts a GHT-PS (an entry with model.ght.prune=true) from a GHT run's vote")
    if ght.get("vote_trigger", "fixed") != "fixed" or cfg.trainer.get("max_minutes"):
        raise ValueError(
            "branch_from= needs the vote at a fixed update: model.ght.vote_trigger=fixed and trainer.max_minutes=0 "
            "(a vote on convergence or wall time falls elsewhere in a run trained from scratch)"
        )
    if cfg.get("init") or cfg.get("init_from"):
        raise ValueError("branch_from= and init=/init_from= both given: a branch starts from the GHT run's state")
    run = Path(str(cfg.branch_from))
    point = point_of(run)
    if not (run / "config.yaml").is_file():
        raise ValueError(f"branch_from={run}: not a run directory (no config.yaml); give the GHT run's directory")
    if not (point / STATE).is_file():
        raise ValueError(
            f"branch_from={run}: no {FOLDER}/ in its checkpoints — the GHT run has not reached the vote update "
            "yet (resume it), or was trained before GHT runs kept it; train this GHT-PS from scratch"
        )
    differ = _differences(_flat(OmegaConf.load(run / "config.yaml")), _flat(cfg))
    if differ:
        shown = "; ".join(f"{k}: {a!r} there, {b!r} here" for k, a, b in differ[:6])
        raise ValueError(
            f"branch_from={run}: the GHT run was trained with other settings, so its updates are not this run's "
            f"({shown}); branch from a GHT run of the same seed, data, budget and GCT options"
        )
    return point


def point_of(run: Path) -> Path:
    """Where a GHT run keeps its branch point."""
    return run / "checkpoints" / FOLDER


def _flat(node: Any) -> dict[str, Any]:
    """Every setting as a dotted key, the GHT options with their defaults filled in (a GHT config names fewer)."""
    container = OmegaConf.to_container(node, resolve=True)
    assert isinstance(container, dict)
    if isinstance(container.get("model"), dict) and "ght" in container["model"]:
        container["model"]["ght"] = asdict(GHTOptions.from_config(container["model"]["ght"]))
    out: dict[str, Any] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{prefix}.{key}" if prefix else str(key))
        else:
            out[prefix] = value

    walk(container, "")
    return out


def _differences(there: dict[str, Any], here: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    keys = sorted(set(there) | set(here))
    return [
        (k, there.get(k), here.get(k))
        for k in keys
        if there.get(k) != here.get(k) and not any(k == m or k.startswith(m + ".") for m in MAY_DIFFER)
    ]
