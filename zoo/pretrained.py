"""A training run that starts from a pretrained checkpoint (`zoo.train +model=<entry> init=<checkpoint>`).

The checkpoint — one zoo.convert wrote from an OPUS-MT model, or one of our own runs — keeps its tokenizer, its
architecture (layers, widths, head count) and its weights; the entry contributes its training procedure (GHT-PS:
group-constrained training, Voting-to-Stay, fine-tuning), so the entry's attention mechanism must be the
checkpoint's. Everything is checked
before a run directory exists, and the architecture is written into the run directory beside the tokenizer, so a
resumed run no longer needs the checkpoint. (`init_from=` is different: trained GHT weights, voting first.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from zoo.checkpoint import load_checkpoint
from zoo.entries import CONF_DIR, list_entries
from zoo.errors import ZooError
from zoo.model import ModelConfig

INIT_FILE = "init.json"  # in the run directory: the architecture the run trains and the checkpoint it came from
MECHANISM_FIELDS = ("attention", "attention_options")  # what the entry must share with the checkpoint


class PretrainedError(ZooError):
    """A checkpoint that cannot start this entry's training; the message names the field and the fix."""


@dataclass(frozen=True)
class Pretrained:
    """What a run takes from the checkpoint, and what its own checkpoints record about where it started."""

    model_config: dict[str, Any]
    tokenizer: bytes
    weights: dict[str, torch.Tensor]
    origin: dict[str, Any]  # path, entry, converted_from and generation (if zoo.convert wrote them)
    replaced: tuple[str, ...]  # the entry's architecture values the checkpoint's replace, "field: entry's → its"


def load_pretrained(location: str, entry: DictConfig) -> Pretrained:
    """Read `location` and check that the composed entry `entry` (the `model` node) can train on its weights."""
    payload = load_checkpoint(location)
    config = dict(payload["model_config"])
    if config.get("head_plan"):
        raise PretrainedError(
            f"init={location}: the checkpoint is already pruned (head_plan for {len(config['head_plan'])} modules); "
            "init= starts from an unpruned model — export this one (python -m export checkpoint=…), or start "
            "from the checkpoint before pruning"
        )
    mismatched = {f: (_entry_value(entry, f), config.get(f)) for f in MECHANISM_FIELDS}
    mismatched = {f: pair for f, pair in mismatched.items() if pair[0] != pair[1]}
    if mismatched:
        ours = ", ".join(f"{f}={theirs!r} (entry {entry.name}: {mine!r})" for f, (mine, theirs) in mismatched.items())
        fitting = entries_with_mechanism(config)
        raise PretrainedError(
            f"init={location}: the checkpoint's weights have {ours}; a pretrained model keeps its attention — "
            f"pick an entry that has it ({', '.join(fitting) or 'none of conf/model/'}) or train without init="
        )
    origin = {"path": payload["path"], "entry": payload.get("entry")}
    for key in ("converted_from", "generation"):  # provenance; the model's own search defaults, which exports take
        if key in payload:
            origin[key] = payload[key]
    return Pretrained(config, bytes(payload["tokenizer"]), payload["model"], origin, _replaced(entry, config))


def _replaced(entry: DictConfig, config: dict[str, Any]) -> tuple[str, ...]:
    """'field: entry's → checkpoint's' for each architecture value of the composed entry the checkpoint replaces."""
    out = []
    for name, value in config.items():
        if name in entry and name not in MECHANISM_FIELDS and entry.get(name) != value:
            out.append(f"{name}: {entry.get(name)} → {value}")
    return tuple(out)


def entries_with_mechanism(config: dict[str, Any]) -> list[str]:
    """The entries of conf/model/ whose attention mechanism (kind and options) is `config`'s."""
    fitting = []
    for name in list_entries():
        node = OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
        assert isinstance(node, DictConfig)
        try:
            values = [_entry_value(node, f) for f in MECHANISM_FIELDS]
        except InterpolationResolutionError:  # an option given relative to the size preset
            continue
        if values == [config.get(f) for f in MECHANISM_FIELDS]:
            fitting.append(name)
    return fitting


def _entry_value(entry: DictConfig, name: str) -> Any:
    if name == "attention_options":
        value = entry.get(name)
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else {}
    return entry.get(name, ModelConfig.__dataclass_fields__[name].default)


def write_init(run_dir: Path, pretrained: Pretrained) -> None:
    """The run's architecture and origin, beside its tokenizer: a resumed run needs the checkpoint no more."""
    document = {"model_config": pretrained.model_config, "origin": pretrained.origin}
    (run_dir / INIT_FILE).write_text(json.dumps(document, indent=2) + "\n")


def read_init(run_dir: Path) -> tuple[ModelConfig, dict[str, Any]] | None:
    """(architecture, origin) of a run started from a pretrained checkpoint; None for a run built from its entry."""
    path = run_dir / INIT_FILE
    if not path.is_file():
        return None
    document = json.loads(path.read_text())
    return ModelConfig.from_dict(document["model_config"]), document["origin"]
