"""Shared helpers of the export tests: export configs, the test head plans, and the export signatures that decide
which entries an export test must cover.

An export exercises different code for a different *signature* — the attention kind, shared keys, a head size
other than d_model / H, a Mixhead variant, a head plan stored in the checkpoint (GHT-PS) — not for a different
depth, width or training recipe. The parity test exports one representative per signature; a cheap test maps
every registered entry to a covered signature, so a new kind of entry cannot slip past the export tests.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.zoo_testing import compose_train
from zoo.attention import HeadPruningUnsupported
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.entries import CONF_DIR, entry_model_config

PLAN = {
    "decoder.layers.0.self_attn": [1, 6],
    "encoder.layers.1.self_attn": [0, 2, 5],
    "decoder.layers.1.cross_attn": [7],
}  # what plan_for(8) gives: the transformer's plan

# Entries a test needs *trained* (smoke checkpoints): ORT's beam search and n-best lists are compared with torch's
# on the smoke test split, and an untrained model's near-tied scores would make that a test of tie-breaking.
# One per attention computation the decoder step exports differently (softmax heads, the GHT-PS voted plan, MGK,
# Mixhead); every other export test uses random-init checkpoints (`untrained_run`).
TRAINED_ENTRIES = ("transformer", "ght_ps", "mgk_4head", "mixhead_b")


@dataclass(frozen=True, order=True)
class ExportSignature:
    """What an export does differently from one entry to another."""

    attention: str  # the mechanism kind: what the graphs compute
    shared_key: bool  # sMGK / sMLK: one key projection, other per-component parameters
    variant: str  # Mixhead's a / b / avg ("" for the others): different mixing graphs and inexact head removal
    free_head_size: bool  # head_dim ≠ d_model / H: the projections' widths do not follow from d_model
    plan_in_checkpoint: bool  # GHT-PS: the head plan comes from the checkpoint, not from a file


@functools.cache
def export_signature(entry: str) -> ExportSignature:
    """The signature of a registered entry, read off its composed config (tiny size: signatures do not depend on it);
    composed once per entry and process (the coverage test asks for most entries twice)."""
    node = compose_train([f"+model={entry}", "size=tiny"]).model
    cfg = entry_model_config(node, vocab_size=64)
    options = cfg.attention_options
    ght = node.get("ght") or {}
    return ExportSignature(
        attention=cfg.attention,
        shared_key=bool(options.get("shared_key", False)),
        variant=str(options.get("variant", "")) if cfg.attention == "mixhead" else "",
        free_head_size=cfg.head_dim is not None and cfg.head_dim * cfg.num_heads != cfg.d_model,
        plan_in_checkpoint=bool(ght.get("prune", False)),
    )


# One entry per signature, exported and verified by the parity test (trained where a trained one exists anyway).
# The order is the parity test's: random-init entries first, then the trained ones in the reverse of
# TRAINED_ENTRIES, the order the other files need them in. Under pytest-xdist each smoke model is trained by whichever
# worker asks first while the other waits for it (tests/conftest.py); walking the trained entries in opposite orders,
# the two workers rarely ask for the same one at the same time.
REPRESENTATIVES = (
    "fixhead",
    "linear_8head",
    "mgk_8head",
    "smgk_4head",
    "mlk_4head",
    "smlk_4head",
    "mixhead_a",
    "mixhead_avg",
    "gqa",
    "mixhead_b",
    "mgk_4head",
    "ght_ps",
    "transformer",
)


def plan_for(num_heads: int) -> dict[str, list[int]]:
    """A head plan valid for any head count ≥ 4: 2, 3 and 1 kept heads in three different modules."""
    h = num_heads
    return {
        "decoder.layers.0.self_attn": [1, h - 2],
        "encoder.layers.1.self_attn": sorted({0, 2, h - 3}),
        "decoder.layers.1.cross_attn": [h - 1],
    }


def export_config(checkpoint: Path | str, out: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            config_name="export", overrides=[f"checkpoint={checkpoint}", f"out={out}", "runtime.threads=1", *overrides]
        )


def pruning_overrides(run_dir: Path, root: Path) -> tuple[list[str], dict[str, list[int]]]:
    """How every entry is exported in these tests: with a head plan, so physical pruning is exercised
    for every mechanism — the checkpoint's own (GHT-PS), else `plan_for(H)`; mechanisms whose head
    removal is inexact (Mixhead) keep the planned-away heads gated (remove_heads=false)."""
    model = model_from_checkpoint(load_checkpoint(run_dir))
    if model.cfg.head_plan:
        return [], {name: sorted(heads) for name, heads in model.cfg.head_plan.items()}
    plan = plan_for(model.cfg.num_heads)
    path = root / f"plan-{run_dir.parent.name}.json"
    path.write_text(json.dumps(plan))
    overrides = [f"head_plan={path}"]
    try:
        model.attention_modules()["decoder.layers.0.self_attn"].check_head_removal()
    except HeadPruningUnsupported:
        overrides.append("remove_heads=false")
    return overrides, plan
