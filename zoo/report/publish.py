"""The render stage: results records → REPORT.md, report.json, plots (in the results dir) and, on request,
the README block. Reads `results/` and nothing else — the suite's records and speed files, and, only to size an
epoch when those cannot, the records other suites made under the same budget: no run directories, no corpus."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zoo.report.baselines import constant_outputs, score_baselines
from zoo.report.collect import collect, epoch_length
from zoo.report.readme import README, ReadmeError, write_block
from zoo.report.records import load_records, sibling_records
from zoo.report.render import markdown, readme_block, render
from zoo.report.second_look import second_look_data
from zoo.report.speed_results import read_speed_files, summarize
from zoo.report.suite import Suite
from zoo.report.tally import STATUS_BLOCK, read_reports, status_table, verdict_counts


@dataclass(frozen=True)
class Published:
    data: dict[str, Any]
    report: str  # REPORT.md's text
    readme_block: str  # the README block's text


def default_results_dir(results_root: str | Path, suite: Suite) -> Path:
    return Path(results_root) / suite.name


def display_dir(results_dir: Path) -> str:
    """`results/<name>` however the dir was given (absolute, relative), so renders hold no machine paths."""
    return f"results/{results_dir.name}" if results_dir.parent.name == "results" else results_dir.as_posix()


def render_command(suite: Suite, results_dir: Path, readme: bool = False) -> str:
    """The command that reproduces a rendering, as printed inside it (stable: no machine paths)."""
    shown = display_dir(results_dir)
    extra = "" if shown == f"results/{suite.name}" else f" results_dir={shown}"
    return f"python -m zoo.report +suite={suite.name} stages=[render]{extra}{' readme=true' if readme else ''}"


def publish(
    suite: Suite,
    results_dir: Path,
    bootstrap_samples: int = 1000,
    write: bool = True,
    readme: bool = False,
    readme_path: Path = README,
    status: bool = True,
) -> Published:
    """Collect the suite's records and render them; `write` puts REPORT.md, report.json and plots into the
    results dir, `readme` rewrites README.md's block named after the results dir (`results:quick`, or
    `results:quick-gpu-h200` for a GPU record set of the same suite); `status` rewrites results/README.md's status
    block after writing."""
    refs, records = load_records(results_dir, suite)
    epoch = epoch_length(records) or epoch_length(sibling_records(results_dir, suite))
    data = {
        **collect(
            suite,
            refs,
            records,
            bootstrap_samples=bootstrap_samples,
            epoch=epoch,
            floor_outputs=constant_outputs(results_dir, refs) if suite.task != "translation" else None,
        ),
        "results_dir": display_dir(results_dir),
        "speed": [summarize(f) for f in read_speed_files(results_dir, suite.name, suite.baseline)],
        "speed_claims": [asdict(c) for c in suite.speed_claims],
        "speed_enabled": suite.speed_enabled,
        "baselines": score_baselines(results_dir, refs) if suite.task != "translation" else None,
    }
    if suite.second_look:
        data["second_look"] = second_look_data(suite.second_look, results_dir, data["claims"], data["entries"])
    data["verdict_counts"] = verdict_counts(data)
    command = render_command(suite, results_dir)
    block = readme_block(data, render_command(suite, results_dir, readme=True))
    if write:
        render(results_dir, data, command)
        if status:
            write_status(results_dir.parent)
    if readme:
        write_block(results_dir.name, block, readme_path)
    return Published(data=data, report=markdown(data, command), readme_block=block)


def write_status(results_root: Path) -> bool:
    """Rewrite the status block of `<results_root>/README.md` from every report.json there (no block: nothing to
    do — a results dir of one's own need not have one); returns whether the file changed."""
    readme = results_root / "README.md"
    if not readme.is_file():
        return False
    try:
        return write_block(STATUS_BLOCK, status_table(read_reports(results_root)), readme)
    except ReadmeError:
        return False


__all__ = ["Published", "default_results_dir", "display_dir", "publish", "render_command", "write_status"]
