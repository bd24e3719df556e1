"""Re-render every results directory from its committed records: what to run after a change to the render code
or to report.json's format (tests/test_results.py then holds each REPORT.md to the render).

usage: python -m zoo.devtools.render_all [RESULTS_ROOT=results]   (from the repository root)

Each directory is rendered as `python -m zoo.report +suite=<its suite> stages=[render]` would (REPORT.md,
report.json, plots); results/README.md's status block is rewritten once at the end, from every report.json, so a
report.json of an older format elsewhere in the tree cannot stop the run halfway.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from zoo.report.publish import publish, write_status
from zoo.report.records import REFERENCES_FILE, read_json_gz
from zoo.report.suite import suite_from_config

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    root = Path(args[0] if args else "results")
    dirs = sorted(p.parent for p in root.glob(f"*/{REFERENCES_FILE}"))
    if not dirs:
        print(f"{root} holds no results directory (none has {REFERENCES_FILE}); give the results root", file=sys.stderr)
        return 2
    for results_dir in dirs:
        start = time.perf_counter()
        name = read_json_gz(results_dir / REFERENCES_FILE)["suite"]
        suite = suite_from_config(OmegaConf.load(CONF_DIR / "suite" / f"{name}.yaml"), CONF_DIR)
        publish(suite, results_dir, write=True, status=False)
        print(f"rendered {results_dir} (suite {name}) in {time.perf_counter() - start:.0f} s", flush=True)
    print(f"status block {'rewritten' if write_status(root) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
