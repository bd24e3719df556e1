"""zoo.report end to end on a two-entry smoke suite: every finished run leaves a results record, every number
in the report comes from the records, the render needs nothing else and reproduces itself byte for byte, a
rerun trains only what has no record, and a bad record stops the render with a one-line error."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from export.runtime.generation import best_tokens, padded, search_batch
from tests.zoo_testing import REPO
from zoo.report.suite import SuiteError, require_speed_seed, suite_from_config

ENTRIES = ["transformer", "mixhead_a"]


def _cli(tmp: Path, corpus: Path, *extra: str, reports_root: Path | None = None) -> list[str]:
    train = [
        "data.path=" + str(corpus),
        "data.vocab_size=1000",
        "data.max_len=64",
        "trainer.max_updates=40",
        "trainer.validate_every=20",
        "trainer.lr=3e-3",
        "generation.beam_size=2",
        "model.encoder_layers=1",  # the pipeline does not depend on depth: one layer each trains and exports faster
        "model.decoder_layers=1",
    ]
    return [
        sys.executable,
        "-m",
        "zoo.report",
        "+suite=quick",
        f"suite.entries=[{','.join(ENTRIES)}]",
        "suite.data=files",
        "suite.size=tiny",
        "suite.trainer=smoke",
        "suite.seeds=[1,2]",
        "suite.overrides=[" + ",".join(f"'{o}'" for o in train) + "]",
        "suite.speed.sentences=12",
        "suite.speed.threads=1",
        "bootstrap_samples=50",
        "suite.speed.triton.duration_s=1",  # a served point needs only some answered requests here
        "suite.speed.rounds=3",  # the suites' 5 rounds are for verdicts; this smoke run judges no claim
        "suite.speed.settings=[{name:b2,beam_size:2,batch:4,max_len_a:1.2,max_len_b:5}]",
        "suite.speed.claims=[]",
        f"reports_root={reports_root or tmp}",
        f"results_root={tmp}/results",
        *extra,
    ]


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory, smoke_corpus) -> Path:
    """A two-entry, two-seed smoke suite trained; then its speed measured and rendered from the records alone, in
    another working dir that has no runs (what a fresh clone has). Returns the training's working dir."""
    tmp = tmp_path_factory.mktemp("report")
    proc = subprocess.run(
        _cli(tmp, smoke_corpus, "stages=[train]"), cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(
        _cli(tmp, smoke_corpus, "stages=[speed,render]", reports_root=tmp / "no_runs"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp / "no_runs" / "quick" / "runs").exists()
    return tmp / "quick"


def _results(report_dir: Path) -> Path:
    return report_dir.parent / "results" / "quick"


def _runs(report_dir: Path) -> dict[tuple[str, int], Path]:
    out = {}
    for seed in (1, 2):
        for entry in ENTRIES:
            [run] = list((report_dir / "runs" / f"seed{seed}" / f"{entry}-files").iterdir())
            out[(entry, seed)] = run
    return out


def _record(report_dir: Path, entry: str, seed: int) -> dict:
    from zoo.report.records import read_json_gz

    return read_json_gz(_results(report_dir) / f"{entry}-seed{seed}.json.gz")


def test_every_run_leaves_a_self_describing_record(smoke_report: Path) -> None:
    runs = _runs(smoke_report)
    for (entry, seed), run in runs.items():
        path = _results(smoke_report) / f"{entry}-seed{seed}.json.gz"
        assert path.stat().st_size < 100_000
        rec = _record(smoke_report, entry, seed)
        summary = json.loads((run / "summary.json").read_text())
        assert (rec["record_format"], rec["suite"], rec["entry"], rec["seed"]) == (1, "quick", entry, seed)
        assert rec["test"] == summary["test"] and rec["size"] == summary["size"]
        assert rec["updates"] == summary["updates"] == 40
        assert rec["hypotheses"] == (run / "test_hypotheses.txt").read_text().split("\n")[:-1]
        assert rec["config"]["model"]["name"] == entry and rec["config"]["trainer"]["seed"] == seed
        assert rec["budget"]["overrides"][1] == "data.vocab_size=1000"
        assert rec["machine"]["cores"] >= 1 and rec["machine"]["class"].startswith("cpu:")
        assert len(rec["git_sha"]) >= 7 and rec["learning_curve"][-1]["step"] == 40


def test_report_numbers_come_from_the_records(smoke_report: Path) -> None:
    results = _results(smoke_report)
    data = json.loads((results / "report.json").read_text())
    text = (results / "REPORT.md").read_text()
    assert list(data["entries"]) == ENTRIES and data["missing"] == []
    for entry in ENTRIES:
        rec = data["entries"][entry]
        bleus = [_record(smoke_report, entry, s)["test"]["bleu"] for s in (1, 2)]
        assert rec["quality"]["bleu"]["n"] == 2
        assert rec["quality"]["bleu"]["mean"] == pytest.approx(sum(bleus) / 2)
        assert rec["size"]["params"] == _record(smoke_report, entry, 1)["size"]["params"]
        row = next(line for line in text.splitlines() if line.startswith(f"| `{entry}` |"))
        assert f"{rec['quality']['bleu']['mean']:.2f}" in row
    # the compute line: the records' training minutes × torch threads, in core-hours
    records = [_record(smoke_report, entry, seed) for entry in ENTRIES for seed in (1, 2)]
    core_minutes = sum(r["train_minutes"] * r["machine"]["torch_threads"] for r in records)
    assert data["compute"] == {
        "runs": len(records),
        "shared": 0,
        "core_hours": round(core_minutes / 60, 1),
        "device_hours": 0.0,
    }
    assert f"Compute: {len(records)} runs, {round(core_minutes / 60, 1):.1f} core-hours (training minutes" in text
    # speed: one file per machine class, every round as measured; the rendered medians and ratios come from it
    [speed_file] = list(results.glob("speed-cpu-*.json"))
    speed = json.loads(speed_file.read_text())
    assert speed["suite"] == "quick" and speed["rounds"] == 3 and speed["sentences"] == 12
    assert speed["format"] == 2 and "cpu_signature" in speed["machine"]
    section = text[text.index("## Speed") :]
    base = speed["entries"]["transformer"]["points"]
    for entry in ENTRIES:
        points = speed["entries"][entry]["points"]
        row = next(line for line in section.splitlines() if line.startswith(f"| `{entry}` |"))
        for key in ("b2/fp32", "b2/int8"):
            rounds = points[key]["sentences_per_s"]
            assert len(rounds) == 3 and min(rounds) > 0 and min(points[key]["peak_rss_mb"]) > 0
            ratios = [a / b for a, b in zip(rounds, base[key]["sentences_per_s"], strict=True)]
            assert f"{statistics.median(rounds):.1f} (×{statistics.geometric_mean(ratios):.2f})" in row
            # every entry decoded the baseline's lengths: the same tokens, the same lengths' digest
            assert points[key]["output_tokens"] == base[key]["output_tokens"]
            assert points[key]["lengths_sha256"] == base[key]["lengths_sha256"]
        # served by a real tritonserver, each request one sentence with its forced length, 3 interleaved rounds
        served = speed["entries"][entry]["served"]
        assert len(served["sentences_per_s"]) == 3 and min(served["sentences_per_s"]) > 0 and served["errors"] == 0
        assert f"{statistics.median(served['sentences_per_s']):.1f} (×" in row
    # the A/A control: the baseline's export timed again, in its own table
    control = speed["entries"]["transformer@control"]
    assert control["control_of"] == "transformer" and len(control["points"]["b2/fp32"]["sentences_per_s"]) == 3
    assert "| `transformer@control` vs `transformer` |" in section[section.index("Negative controls") :]
    # the variant is compared with the baseline of the same seed, one paired bootstrap per seed, recomputed
    # from the records' hypotheses
    from zoo.metrics import paired_bootstrap
    from zoo.report.records import read_json_gz

    refs = read_json_gz(results / "references.json.gz")["references"]
    boot = data["entries"]["mixhead_a"]["bootstrap"]
    assert [b["seed"] for b in boot] == [1, 2] and all(0 < b["p_value"] <= 1 for b in boot)
    direct = paired_bootstrap(
        _record(smoke_report, "transformer", 2)["hypotheses"],
        _record(smoke_report, "mixhead_a", 2)["hypotheses"],
        refs,
        n_samples=50,
    )
    assert boot[1]["p_value"] == direct["p_value"]
    assert data["entries"]["transformer"]["bootstrap"] == []
    for png in ("quality_vs_params.png", "quality_vs_speed.png", "learning_curves.png"):
        assert (results / png).stat().st_size > 1000


def test_compute_counts_core_hours_on_cpus_and_hours_on_an_accelerator() -> None:
    """The budget unit of issue 37: a CPU run costs minutes × torch threads, an accelerator run its minutes; a
    shared run counts (it is behind this table) and says so; a record without a training time adds nothing."""
    from zoo.report.collect import compute_spent

    cpu = {"machine": {"accelerator": None, "torch_threads": 2}}
    records = {
        ("a", 1): {**cpu, "train_minutes": 90.0},
        ("a", 2): {**cpu, "train_minutes": 30.0, "shared_from": "other/a-seed2.json.gz"},
        ("b", 1): {"machine": {"accelerator": "NVIDIA H200", "torch_threads": 16}, "train_minutes": 12.0},
        ("c", 1): {**cpu, "train_minutes": None},
    }
    assert compute_spent(records) == {"runs": 3, "shared": 1, "core_hours": 4.0, "device_hours": 0.2}


def test_rebuilt_models_decode_exactly_the_records_hypothesis_lengths(smoke_report: Path, tmp_path: Path) -> None:
    """The speed workload: the record's hypotheses, tokenized by the tokenizer training builds, give each sentence's
    length, and the export of the rebuilt model decodes every sentence to exactly that many tokens."""
    import export
    from export import runtime as rt
    from zoo.report.speed_models import forced_lengths, speed_corpus

    rec = _record(smoke_report, "mixhead_a", 1)
    corpus = speed_corpus(rec, "mixhead_a-seed1", 12, tmp_path)
    lengths = forced_lengths(rec, "mixhead_a-seed1", corpus)
    assert lengths == [len(corpus.tokenizer.encode(h)) for h in rec["hypotheses"][:12]] and max(lengths) > 0
    for precision in ("fp32", "int8"):  # exports are kept once per key, shared between suites
        [directory] = (smoke_report.parent / "no_runs" / "speed-exports").glob(f"*/{precision}/mixhead_a")
        model = export.load(directory, threads=1)
        src = padded(model.encode_texts(corpus.texts), model.pad_id)
        limits = rt.forced_limits(lengths, model.max_positions)
        out = best_tokens(search_batch(model, src, rt.Search(beam_size=2), limits))
        assert [len(ids) for ids in out] == lengths


def test_speed_refuses_a_record_whose_model_cannot_be_rebuilt(
    smoke_report: Path, smoke_corpus: Path, tmp_path: Path
) -> None:
    from zoo.report.records import read_json_gz, write_json_gz

    clone = tmp_path / "results" / "quick"
    shutil.copytree(_results(smoke_report), clone)
    path = clone / "transformer-seed1.json.gz"
    rec = read_json_gz(path)
    rec["config"]["model"]["attention"] = "no_such_mechanism"
    write_json_gz(path, rec, overwrite=True)
    proc = subprocess.run(
        _cli(tmp_path, smoke_corpus, "stages=[speed]"), cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "results/quick/transformer-seed1.json.gz" in last and "cannot be rebuilt" in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_render_needs_the_records_alone_and_reproduces_the_report(
    smoke_report: Path, smoke_corpus: Path, tmp_path: Path
) -> None:
    """A fresh clone has records but no runs, exports or corpus: the render must give the same bytes."""
    clone = tmp_path / "clone" / "results" / "quick"
    shutil.copytree(_results(smoke_report), clone)
    before = (clone / "REPORT.md").read_bytes()
    (clone / "REPORT.md").unlink()
    proc = subprocess.run(
        _cli(tmp_path / "clone", smoke_corpus, "stages=[render]"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=_no_corpus_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "clone" / "quick").exists()  # no working dir was needed or made
    assert (clone / "REPORT.md").read_bytes() == before


def test_rerun_trains_nothing_recorded_and_dry_run_lists_what_is_missing(
    smoke_report: Path, smoke_corpus: Path
) -> None:
    record = _results(smoke_report) / "mixhead_a-seed2.json.gz"
    aside = record.with_name("aside.bak")
    record.rename(aside)
    try:
        proc = subprocess.run(
            _cli(smoke_report.parent, smoke_corpus, "dry_run=true"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "3 recorded" in proc.stdout and "1 to list" in proc.stdout
        listed = [line for line in proc.stdout.splitlines() if line.startswith("[report 1/1]")]
        assert len(listed) == 1 and "mixhead_a seed 2: finished run" in listed[0]
        assert not record.exists()
        # without dry_run the finished run is recorded again, not retrained, and gives the same record
        proc = subprocess.run(
            _cli(smoke_report.parent, smoke_corpus, "stages=[train]"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "zoo.train" not in proc.stdout and record.read_bytes() == aside.read_bytes()
    finally:
        record.unlink(missing_ok=True)
        aside.rename(record)


def _no_corpus_env(tmp_path: Path) -> dict[str, str]:
    """An empty corpus cache: a render that tried to rebuild the test split would fail."""
    (tmp_path / "empty_cache").mkdir(exist_ok=True)
    return {**os.environ, "ZOO_CACHE": str(tmp_path / "empty_cache")}


def _render_error(results: Path, corpus: Path, tmp_path: Path) -> str:
    proc = subprocess.run(
        _cli(results.parent.parent, corpus, "stages=[render]"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=_no_corpus_env(tmp_path),
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@dataclass(frozen=True)
class _Raw:
    edit: Callable[[bytes], bytes]


def _mutated(smoke_report: Path, tmp_path: Path, name: str, change) -> tuple[Path, bytes]:
    """A copy of the smoke results with one file changed: `change` edits the record's JSON, or with
    `_raw` its bytes."""
    from zoo.report.records import read_json_gz, write_json_gz

    clone = tmp_path / "c" / "results" / "quick"
    shutil.copytree(_results(smoke_report), clone)
    path = clone / name
    if isinstance(change, _Raw):
        path.write_bytes(change.edit(path.read_bytes()))
    else:
        rec = read_json_gz(path)
        change(rec)
        write_json_gz(path, rec, overwrite=True)
    return path, (clone / "REPORT.md").read_bytes()


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("mixhead_a-seed1.json.gz", _Raw(lambda b: b[: len(b) // 2]), "corrupt or truncated"),
        ("mixhead_a-seed1.json.gz", _Raw(lambda b: b"not gzip"), "corrupt or truncated"),
        ("mixhead_a-seed1.json.gz", lambda r: r.update(suite="paper_mt"), "move it to results/paper_mt/"),
        ("mixhead_a-seed1.json.gz", lambda r: r.update(references_sha256="0" * 64), "test split changed"),
        ("mixhead_a-seed1.json.gz", lambda r: r.pop("hypotheses"), "lacks hypotheses"),
        (
            "mixhead_a-seed1.json.gz",
            lambda r: r["budget"].update(overrides=["trainer.max_updates=9"]),
            "another budget",
        ),
        (
            "transformer-seed2.json.gz",
            lambda r: r["machine"].update({"class": "gpu:NVIDIA H200"}),
            "never mixed in one table",
        ),
        ("references.json.gz", lambda r: r["references"].__setitem__(0, "edited"), "edited by hand"),
    ],
)
def test_a_bad_record_stops_the_render_with_one_line_naming_the_file(
    smoke_report: Path, smoke_corpus: Path, tmp_path: Path, name, change, message
) -> None:
    path, report_before = _mutated(smoke_report, tmp_path, name, change)
    line = _render_error(path.parent, smoke_corpus, tmp_path)
    assert path.name in line and message in line
    assert (path.parent / "REPORT.md").read_bytes() == report_before  # nothing was overwritten


def test_records_are_never_overwritten_silently(smoke_report: Path) -> None:
    from zoo.report.records import RecordError, write_json_gz

    path = _results(smoke_report) / "transformer-seed1.json.gz"
    before = path.read_bytes()
    with pytest.raises(RecordError, match="already exists"):
        write_json_gz(path, {"x": 1})
    assert path.read_bytes() == before


def _ght_cli(tmp: Path, corpus: Path, *extra: str) -> list[str]:
    """The smoke budget under another suite's name (`ght`, speed off): the same runs as the smoke `quick`."""
    quick = _cli(tmp, corpus)
    overrides = next(a for a in quick if a.startswith("suite.overrides="))
    return [
        sys.executable,
        "-m",
        "zoo.report",
        "+suite=ght",
        f"suite.entries=[{','.join(ENTRIES)}]",
        "suite.data=files",
        "suite.size=tiny",
        "suite.trainer=smoke",
        "suite.seeds=[1,2]",
        overrides,
        "bootstrap_samples=50",
        "suite.speed.enabled=false",
        f"reports_root={tmp}",
        f"results_root={tmp}/results",
        *extra,
    ]


def test_a_sibling_suites_record_of_the_same_run_is_shared_not_retrained(
    smoke_report: Path, smoke_corpus: Path, tmp_path: Path
) -> None:
    """`ght` repeats `quick`'s transformer/ght/ght_ps under the same budget: those records are copied (with
    `shared_from`) instead of trained again; under another budget nothing is shared."""
    from zoo.report.records import read_json_gz

    root = tmp_path / "r"
    shutil.copytree(_results(smoke_report), root / "results" / "quick")
    other = [a.replace("trainer.max_updates=40", "trainer.max_updates=41") for a in _ght_cli(root, smoke_corpus)]
    proc = subprocess.run([*other, "dry_run=true"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 to list" in proc.stdout and "same budget" not in proc.stdout
    proc = subprocess.run(
        _ght_cli(root, smoke_corpus, "stages=[train,render]"), cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "zoo.train" not in proc.stdout and proc.stdout.count("shared, not retrained") == 4
    assert not (root / "ght").exists()  # nothing trained, no working dir
    for entry in ENTRIES:
        for seed in (1, 2):
            original = read_json_gz(root / "results" / "quick" / f"{entry}-seed{seed}.json.gz")
            shared = read_json_gz(root / "results" / "ght" / f"{entry}-seed{seed}.json.gz")
            assert shared["suite"] == "ght" and shared["shared_from"] == f"quick/{entry}-seed{seed}.json.gz"
            assert shared["speed"] is None  # the ght suite measures no speed
            assert shared["hypotheses"] == original["hypotheses"] and shared["test"] == original["test"]
    report = (root / "results" / "ght" / "REPORT.md").read_text()
    assert "Shared with suite `quick`" in report and "transformer seed 2" in report
    runs = 2 * len(ENTRIES)
    assert f"Compute: {runs} runs, {runs} of them shared from another suite," in report
    assert "Not measured for this suite (`speed.enabled: false`" in report  # not "not measured yet"


def test_a_variant_trains_under_its_own_name_and_its_claim_gets_a_measured_verdict(
    smoke_report: Path, smoke_corpus: Path, tmp_path: Path
) -> None:
    """`heads` sweeps the head count with variants (an entry + model overrides, recorded under their name);
    the claims table renders its per-seed bootstrap and a verdict by the rule (one seed: too few for one). The
    baseline is shared from `quick`."""
    from zoo.report.records import read_json_gz

    root = tmp_path / "r"
    shutil.copytree(_results(smoke_report), root / "results" / "quick")
    cli = [a.replace("+suite=ght", "+suite=heads") for a in _ght_cli(root, smoke_corpus, "stages=[train,render]")]
    cli = [a for a in cli if not a.startswith(("suite.entries=", "suite.seeds="))]
    cli += [
        "suite.entries=[transformer_4head]",
        "suite.seeds=[1]",
        "suite.claims=[{paper:ours,claim:'fewer heads of 16 differ',design:'equal params',"
        "system:transformer_4head,baseline:transformer,expect:worse}]",
    ]
    proc = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = [line for line in proc.stdout.splitlines() if "zoo.train" in line]
    assert len(trained) == 1 and "+model=transformer" in trained[0]
    assert trained[0].endswith("model.name=transformer_4head model.num_heads=4")
    assert "transformer seed 1: the same run is recorded" in proc.stdout
    rec = read_json_gz(root / "results" / "heads" / "transformer_4head-seed1.json.gz")
    assert rec["config"]["model"]["name"] == "transformer_4head" and rec["config"]["model"]["num_heads"] == 4
    report = (root / "results" / "heads" / "REPORT.md").read_text()
    report = report[report.index("## Our questions") :]  # paper: ours -> its own table
    [row] = [line for line in report.splitlines() if line.startswith("| ours |")]
    assert "`transformer_4head` vs `transformer`" in row and "equal params" in row
    assert "(p=" in row and "| **too few seeds (1)" in row, row  # the rule: tests/test_verdicts.py


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


def test_an_uptrained_variant_starts_from_its_source_entrys_run_of_the_same_seed(smoke_report: Path) -> None:
    """Issue 89's uptraining in a suite: `{entry: gqa, init_from: transformer, updates: N}` trains gqa from the
    transformer's finished run of the same seed (its key/value heads mean-pooled by zoo.train), N more updates."""
    from zoo.report.training import train_command

    variants = {"gqa_up": {"entry": "gqa", "init_from": "transformer", "updates": 5}}
    suite = _suite(variants=variants, entries=["transformer", "gqa_up"])
    cmd = train_command(smoke_report, suite, "gqa_up", 1)
    assert cmd[-1] == f"init_from={_runs(smoke_report)[('transformer', 1)]}"
    assert "+model=gqa" in cmd and cmd.index("model.name=gqa_up") < cmd.index("trainer.max_updates=5")


def test_a_branched_variant_goes_on_from_its_ght_runs_branch_point_where_it_has_one(tmp_path: Path) -> None:
    """Issue 85: `{entry: ght_ps, branch_from: ght}` starts GHT-PS at the vote from the GHT run of the same seed when
    that run (finished or not) kept its branch point; without one it trains from scratch (the same run)."""
    from zoo.report.training import train_command

    suite = _suite(variants={"ps": {"entry": "ght_ps", "overrides": [], "branch_from": "ght"}}, entries=["ght", "ps"])
    assert not any(a.startswith("branch_from=") for a in train_command(tmp_path, suite, "ps", 1))
    run = tmp_path / "runs" / "seed1" / "ght-deen" / "20261207-000000"
    (run / "checkpoints" / "branch_point").mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  name: ght\n")
    assert not any(a.startswith("branch_from=") for a in train_command(tmp_path, suite, "ps", 1))  # not reached
    (run / "checkpoints" / "branch_point" / "state.pt").write_bytes(b"")
    assert train_command(tmp_path, suite, "ps", 1)[-1] == f"branch_from={run}"
    assert not any(a.startswith("branch_from=") for a in train_command(tmp_path, suite, "ps", 2))  # another seed
    alone = _suite(variants={"ps": {"entry": "ght_ps", "overrides": [], "branch_from": "ght"}}, entries=["ps"])
    assert train_command(tmp_path, alone, "ps", 1)[-1] == f"branch_from={run}"  # GHT-PS alone, its GHT run here


def _suite(**changes):
    from omegaconf import OmegaConf

    from tests.zoo_testing import REPO as repo

    node = OmegaConf.load(repo / "conf" / "suite" / "quick.yaml")
    for key, value in changes.items():
        OmegaConf.update(node, key, value)
    return suite_from_config(node, repo / "conf")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"entries": ["transformer", "nope"]}, "unknown entries"),
        ({"baseline": "nope"}, "suite.baseline='nope' is not an entry"),
        ({"task": "poetry"}, "suite.task"),
        ({"seeds": [1, 1]}, "repeats a seed"),
        ({"variants": {"transformer": {"entry": "transformer", "overrides": []}}}, "not an existing entry"),
        ({"variants": {"t2": {"entry": "nope", "overrides": []}}}, "expected {entry"),
        (
            {"variants": {"t2": {"entry": "transformer", "overrides": ["trainer.max_updates=1"]}}},
            "model.<key>=<value>, trainer.precision",
        ),
        ({"variants": {"up": {"entry": "gqa", "init_from": "transformer"}}}, "gives both init_from"),
        (
            {"variants": {"ps": {"entry": "ght_ps", "branch_from": "ght", "init_from": "ght", "updates": 5}}},
            "init_from and branch_from both given",
        ),
        (
            {"variants": {"ps": {"entry": "ght_ps", "branch_from": "ght"}}, "entries": ["ps", "ght"]},
            "branch_from='ght' must be an entry of suite.entries listed before ps",
        ),
        (
            {"variants": {"up": {"entry": "gqa", "init_from": "fixhead", "updates": 5}}, "entries": ["up", "fixhead"]},
            "init_from='fixhead' must be an entry of suite.entries listed before up",
        ),
        (
            {
                "claims": [
                    {
                        "paper": "P",
                        "claim": "c",
                        "design": "d",
                        "system": "nope",
                        "baseline": "transformer",
                        "expect": "better",
                    }
                ]
            },
            "neither an entry nor one of suite.variants",
        ),
        (
            {
                "claims": [
                    {
                        "paper": "P",
                        "claim": "c",
                        "design": "d",
                        "system": "fixhead",
                        "baseline": "transformer",
                        "expect": "greater",
                    }
                ]
            },
            "choose from better, worse, match",
        ),
    ],
)
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
    # a precision variant: the same entry and budget, recorded under its own name, trained under bf16 autocast
    precision = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "precision.yaml"), REPO / "conf")
    args = precision.train_overrides("transformer_bf16", 1, Path("r"))
    assert args[0] == "+model=transformer" and args[-2:] == ["model.name=transformer_bf16", "trainer.precision=bf16"]
    assert "trainer.max_updates=1200" in args


def test_first_model_suite_measures_exactly_the_short_presets_change() -> None:
    """conf/trainer/short.yaml is the CPU preset plus what `first_model`'s variant overrides (and a shorter wall-clock
    budget, which the suite replaces by an update budget for both): one recipe, one home."""
    from omegaconf import OmegaConf

    from tests.zoo_testing import compose_train

    cpu = OmegaConf.to_container(compose_train(["+model=transformer_lite_layers"]).trainer)
    short = OmegaConf.to_container(compose_train(["+model=transformer_lite_layers", "trainer=short"]).trainer)
    changed = {k: v for k, v in short.items() if cpu.get(k) != v}
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "first_model.yaml"), REPO / "conf")
    (variant,) = suite.variants.values()
    assert suite.trainer == "cpu" and changed == {"lr": 2e-3, "max_minutes": 14}
    assert "trainer.max_minutes=0" in suite.overrides and "trainer.max_updates=1200" in suite.overrides
    overridden = dict(o.split("=", 1) for o in variant.overrides)
    assert {k: float(v) for k, v in overridden.items()} == {"trainer.lr": changed["lr"]}


def test_parameter_matched_entries_are_within_three_percent_at_size_small() -> None:
    """The concise paper's half-width fixed-head model against `transformer` (non-embedding parameters)."""

    from tests.zoo_testing import compose_train
    from zoo.entries import entry_model_config
    from zoo.flops import count_parameters
    from zoo.model import build_model

    def params(entry: str) -> int:
        config = entry_model_config(compose_train([f"+model={entry}", "size=small"]).model, vocab_size=8000)
        return count_parameters(build_model(config), include_embeddings=False)

    matched, base = params("fixhead_matched"), params("transformer")
    assert (matched, base) == (5_589_408, 5_529_600)  # the counts stated in conf/model/fixhead_matched.yaml
    assert abs(matched / base - 1) <= 0.03


def test_training_one_seed_alone_is_allowed_and_timing_an_untrained_seed_is_refused() -> None:
    assert _suite(seeds=[3]).seeds == (3,)  # speed.seed is 1: only the speed stage needs it among the seeds
    with pytest.raises(SuiteError, match=r"suite.speed.seed=9 is not one of suite.seeds=\[1, 2\]"):
        require_speed_seed(_suite(**{"speed.seed": 9}))
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.report", "+suite=quick", "suite.speed.seed=9", "stages=[speed]"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "suite.speed.seed=9" in proc.stderr


def test_growing_a_suite_by_one_entry_keeps_its_baseline() -> None:
    suite = _suite(entries=["mixhead_a"])
    assert suite.entries == ("transformer", "mixhead_a")


def test_no_suite_lists_the_suites() -> None:
    proc = subprocess.run([sys.executable, "-m", "zoo.report"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "quick" in proc.stderr and "paper_mt" in proc.stderr
