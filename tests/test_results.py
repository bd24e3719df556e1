"""Published tables are the render of the committed records: every generated block of README.md and each
rendered REPORT.md must equal a fresh render of its `results/<name>/` — a hand-edited number fails here."""

from __future__ import annotations

import json
import re

import pytest
from omegaconf import OmegaConf

from export import bench_table
from tests.zoo_testing import REPO
from zoo.report.publish import publish
from zoo.report.readme import read_block, readme_suites, replace_block
from zoo.report.records import read_json_gz
from zoo.report.suite import suite_from_config

README_TEXT = (REPO / "README.md").read_text(encoding="utf-8")
BLOCKS = readme_suites(README_TEXT)


def test_the_readme_publishes_the_quick_suite() -> None:
    assert "quick" in BLOCKS


@pytest.mark.parametrize("name", BLOCKS)
def test_readme_block_and_report_are_the_render_of_the_committed_records(name: str) -> None:
    results_dir = REPO / "results" / name
    suite_name = read_json_gz(results_dir / "references.json.gz")["suite"]
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / f"{suite_name}.yaml"), REPO / "conf")
    published = publish(suite, results_dir, write=False)
    assert read_block(README_TEXT, name) == published.readme_block, (
        f"README.md's results:{name} block differs from the render of results/{name}/: do not edit it by hand, "
        f"run `python -m zoo.report +suite={suite_name} stages=[render] readme=true`"
    )
    assert (results_dir / "REPORT.md").read_text() == published.report, (
        f"results/{name}/REPORT.md differs from the render of its records: rerun the render"
    )


def test_block_replacement_touches_only_the_block() -> None:
    text = "intro\n<!-- results:x -->\nold\n<!-- /results:x -->\noutro\n"
    assert replace_block(text, "x", "new\n") == "intro\n<!-- results:x -->\nnew\n<!-- /results:x -->\noutro\n"
    with pytest.raises(ValueError, match="no block"):
        replace_block(text, "y", "new\n")
    prose = "Publish it as its own block (`<!-- results:z -->` … `<!-- /results:z -->`).\n"
    assert readme_suites(prose + text) == ["x"]  # markers quoted in prose are not blocks


def test_readme_runtime_table_is_the_render_of_its_report(capsys) -> None:
    """The runtime's memory and speed table is `python -m export.bench_table <report>`'s output for the stored
    export.bench report the block names; a report that cannot be read is refused naming what to give."""
    block = bench_table.read_block(README_TEXT)
    source = re.search(r"`python -m export\.bench_table (\S+)`", block)
    assert source is not None, "the bench:runtime block must name the report it renders"
    report = json.loads((REPO / source.group(1)).read_text(encoding="utf-8"))
    assert block == bench_table.render(report, source.group(1)), (
        f"README.md's bench:runtime block differs from its report: run `python -m export.bench_table "
        f"{source.group(1)} --readme`"
    )
    with pytest.raises(SystemExit, match=r"cannot render .*python -m export\.bench"):
        bench_table.main(["no-such-report.json"])


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
