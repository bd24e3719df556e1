"""A suite: which entries, on which data, under which budget, with which seeds (conf/suite/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

TASK_METRICS = {"translation": ("bleu", "chrf"), "summarization": ("rouge1", "rouge2", "rougeL")}


class SuiteError(ValueError):
    """A suite file that cannot be run as written."""


@dataclass(frozen=True)
class SpeedSetting:
    name: str
    beam_size: int
    batch: int
    max_len_a: float
    max_len_b: int


@dataclass(frozen=True)
class Suite:
    name: str
    task: str
    data: str
    size: str | None
    trainer: str | None
    experiment: str | None
    seeds: tuple[int, ...]
    baseline: str
    entries: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    speed_enabled: bool = True
    speed_seed: int = 1
    speed_sentences: int = 512
    speed_threads: int | None = None
    speed_export: bool = True
    speed_settings: tuple[SpeedSetting, ...] = field(default_factory=tuple)
    triton: dict[str, Any] = field(default_factory=dict)
    comparisons: tuple[tuple[str, str], ...] = ()  # extra (system, baseline) paired bootstraps, e.g. vs lite baselines

    @property
    def metrics(self) -> tuple[str, ...]:
        return TASK_METRICS[self.task]

    @property
    def headline(self) -> str:
        """The metric tables are sorted and plotted by: BLEU or ROUGE-L."""
        return "bleu" if self.task == "translation" else "rougeL"

    def train_overrides(self, entry: str, seed: int, runs_root: Path) -> list[str]:
        """The `zoo.train` command line of one (entry, seed) run of this suite."""
        args = [f"+model={entry}", f"data={self.data}"]
        if self.size:
            args.append(f"size={self.size}")
        if self.trainer:
            args.append(f"trainer={self.trainer}")
        if self.experiment:
            args.append(f"experiment={self.experiment}")
        args += [f"trainer.seed={seed}", f"runs_root={runs_root}", *self.overrides]
        return args


def available_entries(conf_dir: Path) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "model").glob("*.yaml"))


def suite_from_config(node: DictConfig, conf_dir: Path) -> Suite:
    """Validate a composed `suite` node up front: a typo should fail before hours of training, not after."""
    raw: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    missing = [k for k in ("name", "task", "data", "seeds", "baseline", "entries") if raw.get(k) in (None, [], "")]
    if missing:
        raise SuiteError(f"suite is missing {', '.join(missing)}; see conf/suite/quick.yaml for a complete one")
    if raw["task"] not in TASK_METRICS:
        raise SuiteError(f"suite.task={raw['task']!r}; expected one of {', '.join(TASK_METRICS)}")
    known = available_entries(conf_dir)
    unknown = [e for e in raw["entries"] if e not in known]
    if unknown:
        raise SuiteError(f"suite.entries has unknown entries {unknown}; known entries: {', '.join(known)}")
    if raw["baseline"] not in known:
        raise SuiteError(f"suite.baseline={raw['baseline']!r} is not an entry; known entries: {', '.join(known)}")
    if raw["baseline"] not in raw["entries"]:  # `suite.entries=[mixhead_a]` grows a suite: Δ needs the baseline
        raw["entries"] = [raw["baseline"], *raw["entries"]]
    if len(set(raw["entries"])) != len(raw["entries"]):
        raise SuiteError("suite.entries lists an entry twice")
    seeds = tuple(int(s) for s in raw["seeds"])
    if len(set(seeds)) != len(seeds):
        raise SuiteError(f"suite.seeds={list(seeds)} repeats a seed")
    comparisons = tuple(tuple(pair) for pair in raw.get("comparisons") or ())
    for pair in comparisons:
        if len(pair) != 2 or any(e not in raw["entries"] for e in pair) or pair[0] == pair[1]:
            raise SuiteError(f"suite.comparisons entry {list(pair)}: expected [system, baseline], two different "
                             f"entries of suite.entries")
    speed = raw.get("speed") or {}
    settings = tuple(
        SpeedSetting(name=str(s["name"]), beam_size=int(s["beam_size"]), batch=int(s["batch"]),
                     max_len_a=float(s.get("max_len_a", 1.2)), max_len_b=int(s.get("max_len_b", 10)))
        for s in speed.get("settings", []))
    speed_seed = int(speed.get("seed", seeds[0]))
    if speed.get("enabled", True) and speed_seed not in seeds:
        raise SuiteError(f"suite.speed.seed={speed_seed} is not one of suite.seeds={list(seeds)}")
    return Suite(
        name=str(raw["name"]), task=str(raw["task"]), data=str(raw["data"]), size=raw.get("size"),
        trainer=raw.get("trainer"), experiment=raw.get("experiment"), seeds=seeds, baseline=str(raw["baseline"]),
        entries=tuple(raw["entries"]), overrides=tuple(raw.get("overrides") or ()),
        speed_enabled=bool(speed.get("enabled", True)), speed_seed=speed_seed,
        speed_sentences=int(speed.get("sentences", 512)), speed_threads=speed.get("threads"),
        speed_export=bool(speed.get("export", True)), speed_settings=settings,
        triton=dict(speed.get("triton") or {}), comparisons=comparisons,  # type: ignore[arg-type]
    )
