"""Hydra rules R1–R5 (zoo/DESIGN.md §3), the entry point's behaviour without/with a model, and every command's
without a setting its config leaves to the command line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.zoo_testing import ENTRIES, REPO, compose_train
from zoo.entries import CONF_DIR

MODEL_KEYS_FROM_SIZE = {
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "ffn_dim",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "pre_norm",
    "share_decoder_embeddings",
    "share_all_embeddings",
    "max_positions",
}


def _yaml(path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def test_r1_model_is_in_no_defaults_list() -> None:
    for path in CONF_DIR.rglob("*.yaml"):
        defaults = _yaml(path).get("defaults", [])
        for item in defaults:
            text = str(item)
            assert "model" not in text.replace("hydra/job_logging", ""), f"{path} puts model in a defaults list"


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_composes_and_r5_name_is_stem(entry: str) -> None:
    cfg = compose_train([f"+model={entry}"])
    assert cfg.model.name == entry  # R5
    assert cfg.model.attention  # a registry key, not a _target_ path
    assert "_target_" not in str(_yaml(CONF_DIR / "model" / f"{entry}.yaml"))
    from zoo.attention import ATTENTION_REGISTRY

    assert cfg.model.attention in ATTENTION_REGISTRY


def test_r2_only_entries_and_sizes_set_model() -> None:
    for path in CONF_DIR.rglob("*.yaml"):
        rel = path.relative_to(CONF_DIR)
        text = path.read_text()
        if rel.parts[0] == "model":
            continue
        if rel.parts[0] == "size":
            assert text.startswith("# @package model"), f"{rel} must write into the model package"
            assert set(_yaml(path)) <= MODEL_KEYS_FROM_SIZE, f"{rel} sets non-architecture keys"
            continue
        assert "model" not in _yaml(path), f"{rel} sets model.* (R2)"


def test_r3_experiments_are_global_and_never_override_model() -> None:
    for path in (CONF_DIR / "experiment").glob("*.yaml"):
        text = path.read_text()
        assert text.startswith("# @package _global_"), path
        assert "/model" not in text, f"{path} overrides /model (Hydra #3318 would replace the user's entry)"
        assert "model" not in _yaml(path), path


def test_experiment_keeps_the_model_the_user_asked_for() -> None:
    cfg = compose_train(["+model=transformer", "experiment=paper_mt"])
    assert cfg.model.name == "transformer"
    assert (cfg.model.d_model, cfg.model.encoder_layers, cfg.model.ffn_dim, cfg.model.dropout) == (512, 6, 2048, 0.3)
    assert cfg.model.num_heads == 8
    t = cfg.trainer
    assert (t.lr, t.warmup_updates, t.label_smoothing, list(t.betas)) == (5e-4, 4000, 0.1, [0.9, 0.98])


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zoo.train", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_r4_no_model_exits_nonzero_and_lists_entries() -> None:
    proc = _run()
    assert proc.returncode != 0
    for entry in ENTRIES:
        assert entry in proc.stderr
    assert "+model=" in proc.stderr


def test_help_and_cfg_job() -> None:
    proc = _run("--help")
    assert proc.returncode == 0 and "zoo.train" in proc.stdout and "size:" in proc.stdout
    proc = _run("+model=transformer", "--cfg", "job")
    assert proc.returncode == 0, proc.stderr
    assert "name: transformer" in proc.stdout and "d_model: 256" in proc.stdout


def _commands_with_required_settings() -> list[tuple[str, list[str]]]:
    """(module, settings) for every Hydra command whose config leaves settings to the command line (`???`), found
    from the `@hydra.main` of each command's source, so that a new command is covered when it is added."""
    found = []
    for path in sorted(p for top in ("zoo", "export", "serve") for p in (REPO / top).rglob("*.py")):
        match = re.search(r'@hydra\.main\(config_path="[^"]*", config_name="(\w+)"', path.read_text())
        if match is None:
            continue
        required = [k for k, v in _yaml(CONF_DIR / f"{match.group(1)}.yaml").items() if v == "???"]
        parts = path.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
        if required:
            found.append((module, required))
    return found


REQUIRED_SETTINGS = _commands_with_required_settings()


def test_the_commands_with_required_settings_are_found() -> None:
    assert {m for m, _ in REQUIRED_SETTINGS} >= {"zoo.evaluate", "export", "serve.repository", "serve.start"}


@pytest.mark.parametrize(("module", "required"), REQUIRED_SETTINGS, ids=[m for m, _ in REQUIRED_SETTINGS])
def test_a_command_run_without_a_required_setting_says_which_in_one_line(module: str, required: list[str]) -> None:
    """No traceback: exit status 2 and one `error:` line naming a setting the command needs and how to give it."""
    proc = subprocess.run([sys.executable, "-m", module], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert any(f"{key}=" in lines[0] for key in required) and f"python -m {module}" in lines[0], lines[0]
