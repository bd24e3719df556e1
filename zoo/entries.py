"""The zoo's model entries are the files of conf/model/ (zoo/DESIGN.md §3, R4–R5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.model import ModelConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def list_entries() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def missing_model_message(command: str = "zoo.train") -> str:
    entries = "\n".join(f"  {e}" for e in list_entries())
    return (
        f"no model entry chosen. Run `python -m {command} +model=<entry>` with one of:\n{entries}\n"
        f"(e.g. python -m {command} +model=transformer)"
    )


def entry_model_config(model_node: DictConfig, **fields: Any) -> ModelConfig:
    """The one conversion of a composed `model` node (entry + size preset) into a ModelConfig: its `name` names
    runs, its `ght` options configure training, neither is architecture; `fields` adds what the data decides
    (vocabulary size, special ids). Raises TypeError/ValueError for an invalid entry."""
    raw = OmegaConf.to_container(model_node, resolve=True)
    assert isinstance(raw, dict)
    raw.pop("name", None)
    raw.pop("ght", None)
    raw.update(fields)
    return ModelConfig.from_dict(raw)
