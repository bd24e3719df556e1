"""Published tables are the render of the committed records: every generated block of README.md and the REPORT.md of
every `results/<name>/` that holds records must equal a fresh render of that directory — a hand-edited number fails
here. The runtime's table in results/runtime/README.md is likewise the render of the export.bench report it names.

A render recomputes every paired bootstrap from the records' hypotheses (seconds to minutes per suite on a busy
2-core machine), so each directory is rendered once per process and shared by the README-block and REPORT.md tests.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
from omegaconf import OmegaConf

from export.bench import shortlist as bench_shortlist
from export.bench import table as bench_table
from export.bench import threads as bench_threads
from tests.zoo_testing import REPO
from zoo.devtools import pretrained_quality, pretrained_speed
from zoo.report.publish import Published, publish
from zoo.report.readme import read_block, readme_suites, replace_block
from zoo.report.records import read_json_gz
from zoo.report.suite import suite_from_config

README_TEXT = (REPO / "README.md").read_text(encoding="utf-8")
BLOCKS = readme_suites(README_TEXT)
RUNTIME_README = REPO / "results" / "runtime" / "README.md"
# every results directory that holds a suite's records (its references are written with the first record)
RESULT_DIRS = sorted(p.parent.name for p in (REPO / "results").glob("*/references.json.gz"))


def _suite_name(name: str) -> str:
    return read_json_gz(REPO / "results" / name / "references.json.gz")["suite"]


@functools.cache
def _published(name: str) -> Published:
    """The render of results/<name>/ (not written), once per process."""
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / f"{_suite_name(name)}.yaml"), REPO / "conf")
    return publish(suite, REPO / "results" / name, write=False)


def test_the_readme_publishes_the_quick_suite() -> None:
    assert "quick" in BLOCKS
    assert set(BLOCKS) <= set(RESULT_DIRS), "a README results block names a results directory without records"


@pytest.mark.parametrize("name", BLOCKS)
def test_readme_block_is_the_render_of_the_committed_records(name: str) -> None:
    assert read_block(README_TEXT, name) == _published(name).readme_block, (
        f"README.md's results:{name} block differs from the render of results/{name}/: do not edit it by hand, "
        f"run `python -m zoo.report +suite={_suite_name(name)} stages=[render] readme=true`"
    )


@pytest.mark.parametrize("name", RESULT_DIRS)
def test_report_is_the_render_of_the_committed_records(name: str) -> None:
    """Every results directory with records, published in README.md or not: its hand-written reading (README.md
    there) sits beside a table that is provably the records' render."""
    report = REPO / "results" / name / "REPORT.md"
    command = f"python -m zoo.report +suite={_suite_name(name)} stages=[render]"
    assert report.is_file(), f"results/{name}/ holds records but no REPORT.md: run `{command}`"
    assert report.read_text(encoding="utf-8") == _published(name).report, (
        f"results/{name}/REPORT.md differs from the render of its records: do not edit it by hand, run `{command}`"
    )


def test_block_replacement_touches_only_the_block() -> None:
    text = "intro\n<!-- results:x -->\nold\n<!-- /results:x -->\noutro\n"
    assert replace_block(text, "x", "new\n") == "intro\n<!-- results:x -->\nnew\n<!-- /results:x -->\noutro\n"
    with pytest.raises(ValueError, match="no block"):
        replace_block(text, "y", "new\n")
    prose = "Publish it as its own block (`<!-- results:z -->` … `<!-- /results:z -->`).\n"
    assert readme_suites(prose + text) == ["x"]  # markers quoted in prose are not blocks


def _block_and_report(block_name: str, command: str) -> tuple[str, str, dict]:
    """results/runtime/README.md's block `block_name`, the stored report its first line names after `command`, and
    that report."""
    block = bench_table.read_block(RUNTIME_README.read_text(encoding="utf-8"), block_name)
    source = re.search(rf"`python -m {re.escape(command)} (\S+?)(?: --limits)?`", block)
    assert source is not None, f"the {block_name} block must name the report it renders"
    return block, source.group(1), json.loads((REPO / source.group(1)).read_text(encoding="utf-8"))


def test_readme_runtime_table_is_the_render_of_its_report(capsys) -> None:
    """The runtime's memory and speed table (results/runtime/README.md, beside the reports) is `python -m
    export.bench.table <report>`'s output for the stored export.bench report the block names; a report that cannot
    be read is refused naming what to give."""
    assert bench_table.README == RUNTIME_README  # where `--readme` writes is where this test reads
    block, source, report = _block_and_report(bench_table.BLOCK, "export.bench.table")
    assert block == bench_table.render(report, source), (
        f"results/runtime/README.md's bench:runtime block differs from its report: run `python -m export.bench.table "
        f"{source} --readme`"
    )
    with pytest.raises(SystemExit, match=r"cannot render .*python -m export\.bench"):
        bench_table.main(["no-such-report.json"])


def test_runtime_limits_table_is_the_render_of_its_report() -> None:
    """results/runtime/README.md's machine-limits table is `python -m export.bench.table <report> --limits`'s output
    for the stored `export.bench --roofline` report it names, whose shares count the same matmuls on both sides."""
    block, source, report = _block_and_report(bench_table.LIMITS_BLOCK, "export.bench.table")
    assert block == bench_table.render_limits(report, source), (
        f"results/runtime/README.md's bench:limits block differs from its report: run `python -m export.bench.table "
        f"{source} --limits --readme`"
    )
    fixed = [p["engines"]["ort"] for p in report["points"] if p.get("mode") == "fixed"]
    assert fixed and all(0 < e["efficiency"] <= 1 for e in fixed)


@pytest.mark.parametrize("tool", [pretrained_speed, pretrained_quality], ids=["speed", "quality"])
def test_pretrained_tables_are_the_render_of_their_results(tool) -> None:
    """results/pretrained/README.md's tables — a converted OPUS-MT-sized model's speed, unpruned and pruned, and a
    converted model trained here, its BLEU before and after pruning — are each devtool's `--render` output for the
    stored result it names."""
    assert tool.README == REPO / "results" / "pretrained" / "README.md"
    name = tool.__name__.rsplit(".", 1)[1]
    match = tool.BLOCK.search(tool.README.read_text(encoding="utf-8"))
    assert match is not None, f"results/pretrained/README.md needs the block {tool.BLOCK.pattern[:40]}…"
    assert match.group(2) == tool.readme_block(), (
        f"results/pretrained/README.md's block differs from its stored result: run `python -m zoo.devtools.{name} "
        "--render`"
    )


def test_runtime_throughput_table_is_the_render_of_its_report() -> None:
    """results/runtime/README.md's throughput-mode table is `python -m export.bench.threads --render <report>`'s
    output for the stored report it names."""
    block, source, report = _block_and_report(bench_threads.BLOCK, "export.bench.threads --render")
    assert block == bench_threads.render(report, source), (
        f"results/runtime/README.md's bench:threads block differs from its report: run `python -m "
        f"export.bench.threads --render {source}`"
    )


def test_paired_ratio_is_the_median_of_each_rounds_ratio_and_the_table_shows_it() -> None:
    """Rounds run both runtimes side by side, so a round's ratio keeps what drift in the machine's speed between
    rounds would move: here the baseline's third round ran on a machine twice as slow, which moves the ratio of
    medians (1.10×) but not the median of the rounds' ratios (2.00×); the table gives both."""
    baseline, new = [2.0, 2.2, 4.0], [1.0, 2.2, 2.0]
    assert bench_table.paired_ratio(baseline, new) == 2.0
    point = {
        "label": "fixed beam5 batch 32",
        "sentences": 4,
        "engines": {"ort-baseline": {"times_s": baseline}, "ort": {"times_s": new}},
        "pairs": [{"engine": "ort", "baseline": "ort-baseline", "ratio": 2.2 / 2.0, "identical": 4}],
    }
    report = {
        "machine": {"cpu": "test CPU", "cores": 2},
        "baseline_runtime": {"sha256": "0" * 64},
        "threads": 2,
        "repeats": 3,
        "fixed_len": 30,
        "headline": {"label": "fixed beam5 batch 32", "rounds": 3},
        "points": [point],
    }
    row = bench_table.render(report, "report.json").splitlines()[-1]
    assert row.startswith("| **fixed beam5 batch 32 × 30 tokens**") and "1.10× (paired 2.00×; 4/4 same) | — |" in row


def test_runtime_shortlist_table_is_the_render_of_its_reports() -> None:
    """results/runtime/README.md's shortlist tables are `python -m export.bench.shortlist --render <reports>`'s output
    for the stored reports they name."""
    block = bench_table.read_block(RUNTIME_README.read_text(encoding="utf-8"), bench_shortlist.BLOCK)
    sources = re.findall(r"`python -m export\.bench\.shortlist --render (\S+)`", block)
    assert sources, "the bench:shortlist block must name the reports it renders"
    reports = [(json.loads((REPO / s).read_text(encoding="utf-8")), s) for s in sources]
    assert block == bench_shortlist.render(reports), (
        "results/runtime/README.md's bench:shortlist block differs from its reports: run `python -m "
        f"export.bench.shortlist --render {' '.join(sources)}`"
    )
