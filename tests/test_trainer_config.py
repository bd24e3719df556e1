"""TrainerConfig: every trainer preset becomes one, a run directory saved by an older commit still does (resume),
and a wrong key or value is refused before a run directory exists, naming the key and the fix. No training here."""

from __future__ import annotations

import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.zoo_testing import REPO, compose_train
from zoo.entries import CONF_DIR
from zoo.train import UsageError, train
from zoo.training.config import TrainerConfig

PRESETS = sorted(p.stem for p in (CONF_DIR / "trainer").glob("*.yaml"))


@pytest.mark.parametrize("experiment", [[], ["experiment=paper_mt"]], ids=["", "paper_mt"])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_trainer_preset_is_a_trainer_config(preset: str, experiment: list[str]) -> None:
    node = compose_train(["+model=transformer", f"trainer={preset}", *experiment]).trainer
    settings = TrainerConfig.from_node(node)
    raw = OmegaConf.to_container(node, resolve=True)
    assert isinstance(raw, dict) and set(raw) == {f.name for f in fields(TrainerConfig)}  # no key left out
    for key, value in raw.items():
        assert getattr(settings, key) == (tuple(value) if isinstance(value, list) else value), key


def test_the_first_commits_trainer_config_still_loads() -> None:
    """A run saved before `threads`, `lr_schedule`, `optimizer_kernel` and `compile` existed resumes: its config.yaml
    lacks them, and the defaults are what that code did (auto threads, the inverse-sqrt schedule, AdamW's for-loop
    kernel, eager); `cpu_allocator` changes no number, so such a run resumes with the faster setting."""
    first = subprocess.run(
        ["git", "log", "--format=%H", "--diff-filter=A", "--", "conf/trainer/cpu.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    if not first:
        pytest.skip("no git history here")
    text = subprocess.run(
        ["git", "show", f"{first[-1]}:conf/trainer/cpu.yaml"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    saved = OmegaConf.create(text)
    assert "threads" not in saved and "lr_schedule" not in saved
    settings = TrainerConfig.from_node(saved)
    assert (settings.threads, settings.lr_schedule) == ("auto", "inverse_sqrt")
    assert (settings.optimizer_kernel, settings.compile) == ("for_loop", False)
    assert settings.cpu_allocator == "retain"
    assert settings.betas == (0.9, 0.98) and settings.max_updates == 3000


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+trainer.lrr=1", r"unknown trainer key 'lrr' \(did you mean 'lr'\?\)"),
        ("trainer.max_updates=3000.5", r"trainer\.max_updates=3000\.5 is a number, but it must be an integer"),
        ("trainer.betas=[0.9]", r"trainer\.betas=\[0\.9\] is a list, but it must be a list of 2 numbers"),
        ("trainer.progress=1", r"trainer\.progress=1 is an integer, but it must be a boolean"),
        ("trainer.precision=fp8", r"trainer\.precision='fp8' is not a precision; use one of fp32, bf16, fp16"),
        ("trainer.best_metric=bleu", r"trainer\.best_metric='bleu' is not a metric; use one of quality, loss"),
        ("trainer.validate_every=0", r"trainer\.validate_every=0 must be at least 1"),
        ("trainer.max_updates=-1", r"trainer\.max_updates=-1 must be at least 1"),  # it trained one update
        ("trainer.cpu_allocator=jemalloc", r"'jemalloc' is not an allocator setting; use one of retain, system"),
        ("trainer.optimizer_kernel=apex", r"'apex' is not an optimizer kernel; use one of for_loop, foreach, fused"),
        ("~trainer.lr", r"the trainer config lacks \['lr'\]"),
    ],
)
def test_a_wrong_trainer_key_is_refused_before_a_run_dir_exists(tmp_path: Path, override: str, message: str) -> None:
    cfg = compose_train(["+model=transformer", f"runs_root={tmp_path}", override])
    with pytest.raises(UsageError, match=message):
        train(cfg)
    assert not any(tmp_path.iterdir())


def test_trainer_config_is_frozen() -> None:
    settings = TrainerConfig.from_node(compose_train(["+model=transformer"]).trainer)
    with pytest.raises(AttributeError):
        settings.lr = 1.0  # type: ignore[misc]
