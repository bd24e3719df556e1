"""`python -m zoo.report +suite=<name>` (Hydra entry point; the stages live in their own modules)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.errors import one_line_errors
from zoo.report.baselines import run_baselines
from zoo.report.measure import run_speed
from zoo.report.publish import default_results_dir, publish
from zoo.report.simulate import simulate_second_look
from zoo.report.suite import SuiteError, require_speed_seed, suite_from_config
from zoo.report.training import run_training
from zoo.report.verdict import MIN_SEEDS

log = logging.getLogger("zoo.report")
CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
STAGES = ("train", "baselines", "speed", "simulate", "render")
SIMULATIONS = 4000  # per scenario: the simulated rate's standard error at α = 0.05 is 0.0034


def _suites() -> str:
    return ", ".join(sorted(p.stem for p in (CONF_DIR / "suite").glob("*.yaml")))


def report(cfg: DictConfig) -> Path | None:
    """Run the requested stages of one suite; returns REPORT.md's path (None on a dry run or without render)."""
    if "suite" not in cfg:
        raise SuiteError(f"no suite given: add +suite=<name>; suites: {_suites()}")
    suite = suite_from_config(cfg.suite, CONF_DIR)
    stages = list(cfg.stages)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise SuiteError(f"stages={stages}: unknown {unknown}; choose from {list(STAGES)}")
    if "speed" in stages:
        require_speed_seed(suite)
    report_dir = Path(cfg.reports_root) / suite.name
    results_dir = Path(cfg.results_dir) if cfg.get("results_dir") else default_results_dir(cfg.results_root, suite)
    start = time.perf_counter()
    if "train" in stages or cfg.dry_run:
        run_training(report_dir, results_dir, suite, dry_run=cfg.dry_run)
        if cfg.dry_run:
            return None
    if "train" in stages or "baselines" in stages:
        run_baselines(results_dir, suite)  # a summarization suite's constant and lead-k, once
    if "speed" in stages:
        run_speed(report_dir, results_dir, suite)
    if "simulate" in stages:
        if suite.second_look is None:
            raise SuiteError(f"suite {suite.name} declares no second_look: the simulate stage has nothing to simulate")
        print(f"[report] wrote {simulate_second_look(results_dir, suite.second_look, MIN_SEEDS, SIMULATIONS)}")
    if "render" not in stages:
        return None
    published = publish(suite, results_dir, bootstrap_samples=cfg.bootstrap_samples, readme=cfg.readme)
    print(published.report, flush=True)
    print(
        f"[report] wrote {results_dir / 'REPORT.md'}{' and the README block' if cfg.readme else ''} "
        f"({(time.perf_counter() - start) / 60:.1f} min this invocation)",
        flush=True,
    )
    return results_dir / "REPORT.md"


@hydra.main(config_path="../../conf", config_name="report", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors():
        report(cfg)


if __name__ == "__main__":
    main()
