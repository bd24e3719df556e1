"""zoo.report end to end on a two-entry smoke suite: every number in the report comes from the runs'
own artefacts, a rerun reuses finished work, and a changed artefact changes the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zoo_testing import REPO
from zoo.report.suite import SuiteError, suite_from_config

ENTRIES = ["transformer", "mixhead_a"]


def _cli(tmp: Path, corpus: Path, *extra: str) -> list[str]:
    train = ["data.path=" + str(corpus), "data.vocab_size=1000", "data.max_len=64", "trainer.max_updates=40",
             "trainer.validate_every=20", "trainer.lr=3e-3", "generation.beam_size=2"]
    return [sys.executable, "-m", "zoo.report", "+suite=quick", f"suite.entries=[{','.join(ENTRIES)}]",
            "suite.data=files", "suite.size=tiny", "suite.trainer=smoke", "suite.seeds=[1,2]",
            "suite.overrides=[" + ",".join(f"'{o}'" for o in train) + "]", "suite.speed.sentences=12",
            "suite.speed.threads=1", "bootstrap_samples=50", "suite.speed.triton.duration_s=3",
            "suite.speed.settings=[{name:b2,beam_size:2,batch:4,max_len_a:1.2,max_len_b:5}]",
            f"reports_root={tmp}", *extra]


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory, smoke_corpus) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    proc = subprocess.run(_cli(tmp, smoke_corpus), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "quick"


def _runs(report_dir: Path) -> dict[tuple[str, int], Path]:
    out = {}
    for seed in (1, 2):
        for entry in ENTRIES:
            [run] = list((report_dir / "runs" / f"seed{seed}" / f"{entry}-files").iterdir())
            out[(entry, seed)] = run
    return out


def test_report_numbers_come_from_the_runs(smoke_report: Path) -> None:
    data = json.loads((smoke_report / "report.json").read_text())
    text = (smoke_report / "REPORT.md").read_text()
    runs = _runs(smoke_report)
    assert list(data["entries"]) == ENTRIES
    for entry in ENTRIES:
        rec = data["entries"][entry]
        bleus = [json.loads((runs[(entry, s)] / "summary.json").read_text())["test"]["bleu"] for s in (1, 2)]
        assert rec["quality"]["bleu"]["n"] == 2
        assert rec["quality"]["bleu"]["mean"] == pytest.approx(sum(bleus) / 2)
        summary = json.loads((runs[(entry, 1)] / "summary.json").read_text())
        assert rec["size"]["params"] == summary["size"]["params"]
        for engine in ("torch", "ort"):  # both engines, each measured in its own process
            speed = json.loads((smoke_report / "speed" / entry / f"b2-{engine}.json").read_text())
            assert rec["speed"][f"b2/{engine}"]["sentences_per_s"] == speed["sentences_per_s"] > 0
            assert speed["sentences"] == 12 and speed["peak_rss_mb"] > 0 and speed["engine"] == engine
        assert (smoke_report / "exports" / entry / "manifest.json").is_file()
        served = json.loads((smoke_report / "triton" / "results.json").read_text())
        point = next(p for p in served["points"] if p["model"] == rec["triton"]["model"])
        assert rec["triton"]["sentences_per_s"] == point["sentences_per_s"] > 0 and point["errors"] == 0
        row = next(line for line in text.splitlines() if line.startswith(f"| `{entry}` |"))
        assert f"{point['sentences_per_s']:.1f}" in row
        assert f"{rec['quality']['bleu']['mean']:.2f}" in row
        assert f"{speed['sentences_per_s']:.1f}" in row
    # the variant is compared with the baseline of the same seed, one paired bootstrap per seed
    boot = data["entries"]["mixhead_a"]["bootstrap"]
    assert [b["seed"] for b in boot] == [1, 2] and all(0 < b["p_value"] <= 1 for b in boot)
    assert data["entries"]["transformer"]["bootstrap"] == []
    for png in ("quality_vs_params.png", "quality_vs_speed.png", "learning_curves.png"):
        assert (smoke_report / png).stat().st_size > 1000


def test_rerun_reuses_runs_and_rerenders_from_artefacts(smoke_report: Path, smoke_corpus: Path) -> None:
    runs = _runs(smoke_report)
    summary_path = runs[("mixhead_a", 2)] / "summary.json"
    summary = json.loads(summary_path.read_text())
    original = summary["test"]["bleu"]
    summary["test"]["bleu"] = 77.77
    summary_path.write_text(json.dumps(summary))
    try:
        proc = subprocess.run(_cli(smoke_report.parent, smoke_corpus), cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert _runs(smoke_report) == runs  # nothing retrained
        assert "zoo.train" not in proc.stdout
        rec = json.loads((smoke_report / "report.json").read_text())["entries"]["mixhead_a"]
        first = json.loads((runs[("mixhead_a", 1)] / "summary.json").read_text())["test"]["bleu"]
        assert rec["quality"]["bleu"]["mean"] == pytest.approx((first + 77.77) / 2)
    finally:
        summary["test"]["bleu"] = original
        summary_path.write_text(json.dumps(summary))


def test_interrupted_report_resumes_the_unfinished_run(tmp_path: Path, smoke_report: Path) -> None:
    from zoo.report.training import train_command, unfinished_run

    suite = _suite()
    run = _runs(smoke_report)[("transformer", 1)]
    (run / "DONE").rename(run / "DONE.bak")
    try:
        assert unfinished_run(smoke_report, "transformer", 1) == run
        assert train_command(smoke_report, suite, "transformer", 1)[-1] == f"resume={run}"
    finally:
        (run / "DONE.bak").rename(run / "DONE")


def _suite(**changes):
    from omegaconf import OmegaConf

    from tests.zoo_testing import REPO as repo

    node = OmegaConf.load(repo / "conf" / "suite" / "quick.yaml")
    for key, value in changes.items():
        OmegaConf.update(node, key, value)
    return suite_from_config(node, repo / "conf")


@pytest.mark.parametrize(("changes", "message"), [
    ({"entries": ["transformer", "nope"]}, "unknown entries"),
    ({"baseline": "mgk_4head", "entries": ["transformer"]}, "baseline"),
    ({"task": "poetry"}, "suite.task"),
    ({"seeds": [1, 1]}, "repeats a seed"),
    ({"speed.seed": 9}, "speed.seed"),
])
def test_bad_suites_are_refused_with_the_reason(changes, message) -> None:
    with pytest.raises(SuiteError, match=message):
        _suite(**changes)


def test_every_suite_file_is_valid_and_paper_mt_composes_the_paper_setting() -> None:
    from omegaconf import OmegaConf

    for path in sorted((REPO / "conf" / "suite").glob("*.yaml")):
        suite = suite_from_config(OmegaConf.load(path), REPO / "conf")
        assert suite.baseline in suite.entries
    paper = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "paper_mt.yaml"), REPO / "conf")
    assert "experiment=paper_mt" in paper.train_overrides("transformer", 1, Path("r"))


def test_no_suite_lists_the_suites() -> None:
    proc = subprocess.run([sys.executable, "-m", "zoo.report"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "quick" in proc.stderr and "paper_mt" in proc.stderr
