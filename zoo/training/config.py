"""The trainer's settings (TrainerConfig): the `trainer` node of a run's config, checked once when the run starts.

Why apart from the loop (zoo/training/trainer.py): a run's config is read and refused — an unknown, missing or mistyped
key,
a value outside its choices — before any model or data is built, by zoo.train and by the tests, without the loop.
"""

from __future__ import annotations

import shutil
import types
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from difflib import get_close_matches
from typing import Any, get_args, get_origin, get_type_hints

from zoo.training.allocator import CPU_ALLOCATORS
from zoo.training.optim import (
    LR_SCHEDULES,
    OPTIMIZER_KERNELS,
)
from zoo.training.threads import AUTO

PRECISIONS = ("fp32", "bf16", "fp16")
BEST_METRICS = ("quality", "loss")


@dataclass(frozen=True)
class TrainerConfig:
    """The trainer's settings: the `trainer` node of a run's config (conf/trainer/*.yaml, where each key is
    explained), checked once when the run starts instead of failing as a KeyError or a wrong type mid-run.

    `threads`, `lr_schedule`, `cpu_allocator`, `optimizer_kernel` and `compile` have defaults because run
    directories saved before those keys existed must still resume (their config.yaml lacks them); every other key
    is in every saved config.
    """

    seed: int
    lr: float
    betas: tuple[float, float]
    adam_eps: float
    weight_decay: float
    warmup_updates: int
    warmup_init_lr: float
    max_tokens: int
    update_freq: int
    max_updates: int  # ≥ 1: a run ends at it (or at max_minutes first)
    max_epochs: int  # 0 = unlimited
    max_minutes: float  # 0 = no wall-clock budget
    clip_norm: float  # 0 = no clipping
    label_smoothing: float
    precision: str  # PRECISIONS
    validate_every: int
    valid_quality_sentences: int
    valid_max_len_a: float | None  # None: Search's default
    valid_max_len_b: int | None
    best_metric: str  # BEST_METRICS
    patience: int  # 0 = off
    average_last: int  # < 2 = off
    log_every: int
    progress: bool
    save_last_every_validation: bool
    threads: int | str = AUTO
    lr_schedule: str = "inverse_sqrt"  # LR_SCHEDULES
    cpu_allocator: str = "retain"  # CPU_ALLOCATORS; no effect on the numbers, so old runs resume with it
    optimizer_kernel: str = "for_loop"  # OPTIMIZER_KERNELS; the kernel runs saved before the key existed used
    compile: bool = False  # torch.compile the model's forward (and so its backward), shapes dynamic

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> TrainerConfig:
        """The one conversion of a `trainer` node (a DictConfig or a dict, e.g. a saved config.yaml's): raises
        ValueError naming an unknown, missing or mistyped key and how to fix it."""
        raw = {key: node[key] for key in node}  # a DictConfig resolves interpolations on access
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(known))
        if unknown:
            named = [
                f"{k!r}" + "".join(f" (did you mean {c!r}?)" for c in get_close_matches(k, known, 1)) for k in unknown
            ]
            raise ValueError(
                f"unknown trainer key {', '.join(named)}: the keys are those of conf/trainer/cpu.yaml (a new one "
                "needs a field in zoo.training.config.TrainerConfig)"
            )
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [k for k in required if k not in raw]
        if missing:
            raise ValueError(
                f"the trainer config lacks {missing}: add them to the trainer preset (conf/trainer/*.yaml) or pass "
                f"+trainer.<key>=<value>"
            )
        if isinstance(raw.get("betas"), Sequence) and not isinstance(raw["betas"], str):
            raw["betas"] = tuple(raw["betas"])  # a list in YAML (a ListConfig in a DictConfig)
        return cls(**raw)

    def __post_init__(self) -> None:
        for f in fields(self):
            value, hint = getattr(self, f.name), _FIELD_TYPES[f.name]
            if not _has_type(value, hint):
                shown = list(value) if isinstance(value, tuple) else value
                raise ValueError(
                    f"trainer.{f.name}={shown!r} is {_A_TYPE.get(type(value), type(value).__name__)}, but it must be "
                    f"{_type_name(hint)}: correct it in the trainer preset (conf/trainer/*.yaml) or on the command "
                    f"line (trainer.{f.name}=...)"
                )
        for name, noun, allowed in (
            ("precision", "a precision", PRECISIONS),
            ("best_metric", "a metric", BEST_METRICS),
            ("lr_schedule", "a schedule", LR_SCHEDULES),
            ("cpu_allocator", "an allocator setting", CPU_ALLOCATORS),
            ("optimizer_kernel", "an optimizer kernel", OPTIMIZER_KERNELS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"trainer.{name}={getattr(self, name)!r} is not {noun}; use one of {', '.join(allowed)}"
                )
        if self.compile and shutil.which("c++") is None and shutil.which("g++") is None:
            raise ValueError(
                "trainer.compile=true needs a C++ compiler for torch.compile's CPU kernels and none is on PATH: "
                "install one (Debian/Ubuntu: apt install g++) or leave trainer.compile=false"
            )
        for name in ("max_updates", "validate_every", "log_every", "update_freq", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name}={getattr(self, name)} must be at least 1 (trainer.{name}=<n ≥ 1>)")


_A_TYPE = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    tuple: "a list",
}


def _type_name(hint: Any) -> str:
    """How an error names the type a field wants ("an integer", "a list of 2 numbers")."""
    if isinstance(hint, types.UnionType):
        return " or ".join(_type_name(h) for h in get_args(hint))
    if get_origin(hint) is tuple:
        return f"a list of {len(get_args(hint))} numbers"
    return _A_TYPE[hint]


def _has_type(value: Any, hint: Any) -> bool:
    """Whether `value` fits a field's type: an integer is a number too (lr=1), a boolean is neither."""
    if isinstance(hint, types.UnionType):
        return any(_has_type(value, h) for h in get_args(hint))
    if get_origin(hint) is tuple:
        args = get_args(hint)
        return (
            isinstance(value, tuple)
            and len(value) == len(args)
            and all(_has_type(v, h) for v, h in zip(value, args, strict=True))
        )
    if isinstance(value, bool):
        return hint is bool
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, hint)


_FIELD_TYPES = get_type_hints(TrainerConfig)
