"""Training-loop behaviour: exact resume after a kill, DDP with 2 CPU processes (gloo), the bf16
autocast path, the paper_mt experiment, summarization with ROUGE, and the CLI tools."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.conftest import smoke_overrides
from tests.zoo_testing import REPO, compose_train
from zoo.checkpoint import load_checkpoint
from zoo.runs import lock_run_dir
from zoo.train import train

FAST = ["trainer.max_updates=24", "trainer.validate_every=8", "evaluate_test=false"]


def _cli(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "zoo.train", *overrides]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]


def _only_run(root: Path) -> Path:
    runs = [p for p in root.glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_resume_after_kill_gives_identical_weights(tmp_path, smoke_corpus) -> None:
    base = smoke_overrides("transformer", smoke_corpus, tmp_path / "a") + FAST
    reference = Path(train(compose_train(base))["run_dir"])

    interrupted_root = tmp_path / "b"
    cmd = _cli(smoke_overrides("transformer", smoke_corpus, interrupted_root) + FAST)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if list(interrupted_root.glob("*/*/checkpoints/last.pt")):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.kill()  # SIGKILL: no chance to save anything more
    proc.wait()
    run_dir = _only_run(interrupted_root)
    killed_at = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]["step"]
    assert 0 < killed_at < 24
    assert not (run_dir / "DONE").exists()

    resumed = subprocess.run(
        _cli(smoke_overrides("transformer", smoke_corpus, interrupted_root) + FAST + ["resume=latest"]),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (run_dir / "DONE").exists()
    a, b = _weights(reference), _weights(run_dir)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed run diverged from the uninterrupted one"
    steps = [int(line.split(",")[0]) for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == sorted(steps), "metrics.csv has rows from before the resume point repeated"


def test_sigterm_saves_and_resume_dir_continues(tmp_path, smoke_corpus) -> None:
    root = tmp_path / "runs"
    overrides = smoke_overrides("transformer", smoke_corpus, root) + [
        "trainer.max_updates=100",  # SIGTERM comes ~1 s after training starts: a few updates in
        "trainer.validate_every=1000",
        "evaluate_test=false",
    ]
    proc = subprocess.Popen(_cli(overrides), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(root.glob("*/*/metrics.csv")):
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "resume=" in err  # tells the user how to continue
    run_dir = _only_run(root)
    step = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]["step"]
    assert 0 < step < 100
    done = subprocess.run(
        _cli([f"resume={run_dir}", "trainer.max_updates=999"]), cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 100  # the run's own saved config wins over new overrides


def test_a_run_another_process_trains_is_refused_and_left_untouched(tmp_path) -> None:
    """Two workers must never train one run directory (zoo.report resumes every unfinished run it meets): a resume
    of a run whose lock another live process holds is refused in one line naming that process, before anything in
    the directory is read or written; the lock goes with its process, so a killed trainer never blocks a resume."""
    run_dir = tmp_path / "runs" / "transformer-files" / "20260101-000000"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"the first trainer's checkpoint")
    (run_dir / "metrics.csv").write_text("step,epoch\n1,0\n")
    hold = "import sys, time; from pathlib import Path; from zoo.runs import lock_run_dir; "
    hold += "lock = lock_run_dir(Path(sys.argv[1])); print('locked', flush=True); time.sleep(300)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        second = subprocess.run(_cli([f"resume={run_dir}"]), cwd=REPO, capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        assert f"is being trained by another process (pid {holder.pid})" in second.stderr
        assert f"resume={run_dir}" in second.stderr and "Traceback" not in second.stderr
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    finally:
        holder.kill()
        holder.wait()
    lock_run_dir(run_dir).close()  # the holder was killed: its lock went with it


def test_ddp_two_cpu_processes(tmp_path, smoke_corpus) -> None:
    overrides = smoke_overrides("transformer", smoke_corpus, tmp_path) + [
        "trainer.max_updates=12",
        "trainer.validate_every=6",
        "evaluate_test=false",
        "device=cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "zoo.train",
            *overrides,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _only_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 12
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) > 2
    assert all(torch.isfinite(v).all() for v in _weights(run_dir).values() if v.is_floating_point())


def test_bf16_autocast_path(tmp_path, smoke_corpus) -> None:
    summary = train(
        compose_train(
            smoke_overrides("transformer", smoke_corpus, tmp_path)
            + ["trainer.precision=bf16", "trainer.max_updates=10", "trainer.validate_every=5", "evaluate_test=false"]
        )
    )
    rows = (Path(summary["run_dir"]) / "metrics.csv").read_text().splitlines()[1:]
    losses = [float(r.split(",")[4]) for r in rows if r.split(",")[4]]
    assert losses and all(v == v and v < 20 for v in losses)  # finite, not NaN


def test_paper_mt_experiment_runs_two_steps(tmp_path, smoke_corpus) -> None:
    """The GHT paper's MT setting, shrunk only where a CPU test must (dims, steps)."""
    smoke = [
        o
        for o in smoke_overrides("transformer", smoke_corpus, tmp_path)
        if not o.startswith(
            ("trainer.lr=", "trainer.warmup_updates=", "trainer=", "size=", "model.d_model=", "model.ffn_dim=")
        )
    ]
    cfg = compose_train(
        smoke
        + [
            "experiment=paper_mt",
            "model.d_model=32",
            "model.ffn_dim=64",
            "model.encoder_layers=1",
            "model.decoder_layers=1",
            "trainer.max_updates=2",
            "trainer.validate_every=2",
            "trainer.precision=fp32",
            "evaluate_test=false",
            "trainer.valid_quality_sentences=4",
        ]
    )
    assert cfg.trainer.warmup_updates == 4000 and cfg.model.dropout == 0.3 and cfg.trainer.lr == 5e-4
    summary = train(cfg)
    assert summary["updates"] == 2


def test_summarizer_trains_and_evaluate_prints_rouge(tmp_path) -> None:
    proc = subprocess.run(
        _cli(
            [
                "+model=transformer",
                "data=summ",
                "size=tiny",
                "trainer=smoke",
                "data.tokenizer=bpe",
                "data.vocab_size=2000",
                "trainer.max_updates=30",
                "trainer.validate_every=30",
                f"runs_root={tmp_path}",
                "evaluate_test=false",
            ]
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _only_run(tmp_path)
    assert run_dir.parent.name == "transformer-summ"
    # each validation records the share of distinct outputs among its valid_quality_sentences (16 at trainer=smoke)
    (row,) = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r["valid_quality"]]
    distinct = float(row["valid_distinct"]) * 16
    assert 1 <= round(distinct) <= 16 and abs(distinct - round(distinct)) < 1e-9
    ev = subprocess.run(
        [
            sys.executable,
            "-m",
            "zoo.evaluate",
            f"checkpoint={run_dir}",
            "split=test",
            "limit=40",
            "generation.beam_size=2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "rouge1" in ev.stdout and "rougeL" in ev.stdout
    metrics = json.loads((run_dir / "eval" / "test_metrics.json").read_text())
    assert {"rouge1", "rouge2", "rougeL"} <= metrics.keys() and metrics["sentences"] == 40


def test_translate_cli_and_python_api(smoke_run) -> None:
    import zoo

    run_dir = smoke_run("transformer")
    expected = zoo.load(str(run_dir)).translate(["Guten Morgen.", "Das ist ein Haus."], beam_size=2)
    assert len(expected) == 2 and all(isinstance(s, str) for s in expected)
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.translate", "--checkpoint", str(run_dir), "--beam", "2", "Guten Morgen."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected[:1]
    piped = subprocess.run(
        [sys.executable, "-m", "zoo.translate", "-c", str(run_dir), "--beam", "2"],
        cwd=REPO,
        input="Guten Morgen.\nDas ist ein Haus.\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.stdout.splitlines() == expected


def test_bad_checkpoint_is_a_clear_error(tmp_path) -> None:
    bogus = tmp_path / "broken.pt"
    bogus.write_bytes(b"not a checkpoint")
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.translate", "-c", str(bogus), "Hallo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "cannot read checkpoint" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.evaluate", f"checkpoint={tmp_path}/missing"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_spread_sample_covers_the_whole_split() -> None:
    from zoo.training.trainer import spread_sample

    assert spread_sample(list(range(10)), 3) == [0, 3, 6]
    assert spread_sample(list(range(3)), 5) == [0, 1, 2]
    assert spread_sample([], 4) == [] and spread_sample([1, 2], 0) == []


def test_checkpoint_average_is_kept_only_if_it_validates_at_least_as_well_as_best(tmp_path, smoke_run) -> None:
    """avg.pt must earn its place on the validation score best.pt was chosen by."""
    from zoo.checkpoint import REQUIRED_KEYS, model_from_checkpoint, save_checkpoint
    from zoo.data import Example, Tokenizer
    from zoo.data.batching import encode_examples
    from zoo.training.trainer import Trainer

    payload = load_checkpoint(smoke_run("transformer") / "checkpoints" / "last.pt")
    model = model_from_checkpoint(payload)
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    valid = [
        Example(s, t, "heldout") for s, t in zip(payload["heldout"]["src"], payload["heldout"]["tgt"], strict=True)
    ][:8]
    pairs, _ = encode_examples(valid, tok, 64)
    tcfg = compose_train(["+model=transformer", "trainer=smoke", "trainer.valid_quality_sentences=8"]).trainer
    trainer = Trainer(
        model,
        tok,
        pairs,
        valid,
        pairs,
        tcfg,
        tmp_path,
        {key: payload[key] for key in REQUIRED_KEYS},  # a run's keys; model_payload() adds its own weights
        "translation",
        torch.device("cpu"),
    )
    trainer.ckpt_dir.mkdir()
    for name in ("step_1.pt", "step_2.pt"):
        save_checkpoint(trainer.ckpt_dir / name, trainer.model_payload())  # averaging reads them as checkpoints
    trainer.state.kept_checkpoints = ["step_1.pt", "step_2.pt"]
    score = trainer._score(trainer.validate())
    trainer.state.best = score + 1.0
    assert trainer.average() is None and not (trainer.ckpt_dir / "avg.pt").exists()
    trainer.state.best = score  # the average of two identical checkpoints scores exactly the same
    assert trainer.average() == trainer.ckpt_dir / "avg.pt"
