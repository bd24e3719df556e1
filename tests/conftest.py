"""Session-scoped fixtures: the real Debian-built corpus (cached) and smoke-trained checkpoints
shared by every test that needs a non-degenerate model (DESIGN.md §3c)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.zoo_testing import compose_train

SMOKE_TRAIN_PAIRS = 6000
SMOKE_EVAL_PAIRS = 48


@pytest.fixture(scope="session")
def deen_splits():
    from zoo.data import build_splits

    return build_splits(compose_train(["+model=transformer"]).data)


@pytest.fixture(scope="session")
def smoke_corpus(tmp_path_factory, deen_splits) -> Path:
    """Short real German→English pairs in fairseq text format (so smoke runs also go through
    data=files): small enough to train a tiny model to non-degenerate output in seconds."""
    root = tmp_path_factory.mktemp("smoke_corpus")

    def short(examples, n):
        picked = [e for e in examples if len(e.src.split()) <= 12 and len(e.tgt.split()) <= 12]
        return picked[:n]

    for split, examples, n in (
        ("train", deen_splits.train, SMOKE_TRAIN_PAIRS),
        ("valid", deen_splits.valid, SMOKE_EVAL_PAIRS),
        ("test", deen_splits.test, SMOKE_EVAL_PAIRS),
    ):
        chosen = short(examples, n)
        (root / f"{split}.de").write_text("".join(e.src + "\n" for e in chosen))
        (root / f"{split}.en").write_text("".join(e.tgt + "\n" for e in chosen))
    return root


def smoke_overrides(entry: str, corpus: Path, runs_root: Path) -> list[str]:
    return [
        f"+model={entry}",
        "size=tiny",
        "trainer=smoke",
        "data=files",
        f"data.path={corpus}",
        "data.name=smoke",
        "data.vocab_size=1000",
        "data.max_len=64",
        "model.d_model=64",
        "model.ffn_dim=256",
        "trainer.max_updates=300",
        "trainer.max_tokens=2048",
        "trainer.validate_every=100",
        "trainer.warmup_updates=50",
        "trainer.lr=3e-3",
        f"runs_root={runs_root}",
        "generation.beam_size=4",
        "evaluate_test=false",
    ]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, smoke_corpus) -> Callable[[str], Path]:
    """entry → run dir of a smoke-trained model (trained once per session, on first use)."""
    from zoo.train import train

    runs_root = tmp_path_factory.mktemp("smoke_runs")
    done: dict[str, Path] = {}

    def get(entry: str) -> Path:
        if entry not in done:
            summary = train(compose_train(smoke_overrides(entry, smoke_corpus, runs_root)))
            done[entry] = Path(summary["run_dir"])
        return done[entry]

    return get


@pytest.fixture(autouse=True)
def _torch_threads_unchanged():
    """Tests compare in-process training with subprocess runs bit for bit: a test that leaves torch's thread
    count changed (an in-process benchmark or export) would break those far away from the culprit."""
    import torch

    before = torch.get_num_threads()
    yield
    assert torch.get_num_threads() == before, "this test left torch.set_num_threads changed"


@pytest.fixture(autouse=True, scope="session")
def _quiet_threads():
    # two cores: keep torch from oversubscribing when tests spawn subprocesses
    os.environ.setdefault("OMP_NUM_THREADS", "2")
