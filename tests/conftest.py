"""Session-scoped fixtures: the real Debian-built corpus (cached), smoke-trained checkpoints shared by every test
that needs a non-degenerate model, random-init checkpoints for structural checks (export parity, pruning, caches),
and the exports of both, each made once per test run.

With pytest-xdist (`-n 2`, the README's test command) every worker is a process of its own: what these fixtures
make lives in a directory all workers of the run share, made under a file lock by the first worker that needs it
and reused by the others (`_made_once`), so a smoke model is still trained once per run."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from tests.export_testing import TRAINED_ENTRIES, export_config, pruning_overrides
from tests.zoo_testing import compose_train

SMOKE_TRAIN_PAIRS = 6000
SMOKE_EVAL_PAIRS = 48
# A random-init model emits no eos, so each verified sentence is decoded to its length limit (beam and greedy, torch
# and ORT): 8 sentences still give the verification its three batch shapes (all, a middle third, one short row),
# at a quarter of 32's decoding. Only the parity test reads these exports (tests/test_export_exporter.py).
UNTRAINED_VERIFY = "verify.sentences=8"


XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def pytest_configure(config: pytest.Config) -> None:
    # two workers on two cores: one thread each, in this process and in the subprocesses tests start
    if XDIST_WORKER:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary root, the same for every xdist worker (each worker's own base is a child of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if XDIST_WORKER else base


def _made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`make(directory)` runs once per test run, in whichever worker asks first; the others wait for it and
    reuse the directory. A `make` that failed leaves no marker, so the next caller tries again (and fails the
    same way, in its own test)."""
    directory = _shared_root(tmp_path_factory) / "shared" / name
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory) + ".lock"):
        done = directory / ".made"
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            make(directory)
            done.touch()
    return directory


@pytest.fixture(scope="session")
def smoke_corpus(tmp_path_factory) -> Path:
    """Short real German→English pairs in fairseq text format (so smoke runs also go through
    data=files): small enough to train a tiny model to non-degenerate output in seconds."""

    def write(root: Path) -> None:
        from zoo.data import build_splits

        splits = build_splits(compose_train(["+model=transformer"]).data)

        def short(examples, n):
            picked = [e for e in examples if len(e.src.split()) <= 12 and len(e.tgt.split()) <= 12]
            return picked[:n]

        for split, examples, n in (
            ("train", splits.train, SMOKE_TRAIN_PAIRS),
            ("valid", splits.valid, SMOKE_EVAL_PAIRS),
            ("test", splits.test, SMOKE_EVAL_PAIRS),
        ):
            chosen = short(examples, n)
            (root / f"{split}.de").write_text("".join(e.src + "\n" for e in chosen))
            (root / f"{split}.en").write_text("".join(e.tgt + "\n" for e in chosen))

    return _made_once(tmp_path_factory, "smoke_corpus", write)


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


def _run_made_once(tmp_path_factory: pytest.TempPathFactory, name: str, overrides: Callable[[Path], list[str]]) -> Path:
    """The run dir of one `zoo.train` run with `overrides(runs_root)`, trained once per test run."""
    from zoo.train import train

    root = _made_once(tmp_path_factory, name, lambda runs_root: train(compose_train(overrides(runs_root))))
    [run_dir] = [d.parent for d in root.glob("*/*/DONE")]
    return run_dir


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, smoke_corpus) -> Callable[[str], Path]:
    """entry → run dir of a smoke-trained model (trained once per test run, on first use)."""

    def get(entry: str) -> Path:
        return _run_made_once(
            tmp_path_factory, f"smoke_runs/{entry}", lambda root: smoke_overrides(entry, smoke_corpus, root)
        )

    return get


@pytest.fixture(scope="session")
def untrained_run(tmp_path_factory, smoke_corpus) -> Callable[[str], Path]:
    """entry → run dir of a random-init model in the real checkpoint format (one update at a warm-up lr of
    1e-7: tokenizer, config and held-out sample as a trained run has them), made once per test run: what
    structural checks need, in seconds instead of a smoke training."""
    untrained = [
        "trainer.max_updates=1",
        "trainer.warmup_updates=1000",
        "trainer.validate_every=1",
        "trainer.valid_quality_sentences=0",
        "trainer.average_last=0",
    ]

    def get(entry: str, *model_overrides: str) -> Path:
        """`model_overrides`: model.<key>=<value> settings the entry does not have (e.g. model.pre_norm=true)."""
        name = "-".join((entry, *model_overrides)).replace("=", "_")
        return _run_made_once(
            tmp_path_factory,
            f"untrained_runs/{name}",
            lambda root: smoke_overrides(entry, smoke_corpus, root) + untrained + list(model_overrides),
        )

    return get


@pytest.fixture(scope="session")
def checkpoint_run(smoke_run, untrained_run) -> Callable[[str], Path]:
    """entry → its smoke-trained run if a test needs it trained (`TRAINED_ENTRIES`), else its random-init run."""

    def get(entry: str) -> Path:
        return smoke_run(entry) if entry in TRAINED_ENTRIES else untrained_run(entry)

    return get


@pytest.fixture(scope="session")
def exported(checkpoint_run, tmp_path_factory) -> Callable[..., tuple[Path, dict]]:
    """(entry, *overrides) → (export dir, manifest), each made once per test run and shared by every test file.
    Without overrides the entry is exported with its test head plan (`pruning_overrides`); a random-init entry's
    export is verified on 8 held-out sentences (`UNTRAINED_VERIFY`)."""
    from export.exporter import export_checkpoint

    def get(entry: str, *overrides: str) -> tuple[Path, dict]:
        run = checkpoint_run(entry)
        name = "-".join((entry, *overrides)).replace("/", "_").replace("=", "_")

        def make(root: Path) -> None:
            extra = list(overrides) if overrides else pruning_overrides(run, root)[0]
            if not overrides and entry not in TRAINED_ENTRIES:
                extra.append(UNTRAINED_VERIFY)
            returned = export_checkpoint(export_config(run, root / "export", *extra))
            (root / "returned.json").write_text(json.dumps(returned))  # what the exporter returned, for every worker

        root = _made_once(tmp_path_factory, f"exports/{name}", make)
        return root / "export", json.loads((root / "returned.json").read_text())

    return get


@pytest.fixture(scope="session")
def ght_ps_unpruned(smoke_run, tmp_path_factory) -> tuple[Path, Path, dict]:
    """(export root, export dir, manifest) of the smoke GHT-PS checkpoint exported with every head kept
    (remove_heads=false), written over an existing directory: on the way it checks that an existing
    directory is refused without overwrite=true, and that a failed verification (a real export checked at
    an impossible tolerance) leaves the old directory untouched and no temporary directory behind."""
    from export.exporter import export_checkpoint
    from export.graph import ExportError

    run = smoke_run("ght_ps")

    def make(made: Path) -> None:
        root = made / "overwrite"
        existing = root / "existing"
        existing.mkdir(parents=True)
        (existing / "keep.txt").write_text("mine")
        with pytest.raises(ExportError, match=r"already exists.*overwrite=true"):
            export_checkpoint(export_config(run, existing, "remove_heads=false"))
        assert (existing / "keep.txt").read_text() == "mine"
        with pytest.raises(ExportError, match="verification failed"):  # logits differ by ~1e-6 > 1e-12
            export_checkpoint(
                export_config(run, existing, "remove_heads=false", "overwrite=true", "verify.tolerance=1e-12")
            )
        assert (existing / "keep.txt").read_text() == "mine"  # the old export survives a failed one
        assert [p.name for p in root.iterdir()] == ["existing"]  # no temporary directory left behind
        manifest = export_checkpoint(export_config(run, existing, "remove_heads=false", "overwrite=true"))
        (made / "returned.json").write_text(json.dumps(manifest))

    made = _made_once(tmp_path_factory, "ght_ps_unpruned", make)
    return made / "overwrite", made / "overwrite" / "existing", json.loads((made / "returned.json").read_text())


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
    # two cores: keep torch from oversubscribing when tests spawn subprocesses (xdist workers: 1, pytest_configure)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
