"""`python -m serve.bench exports=[…]`: served sentences/s and latency (serve/bench/sweep.py, conf/bench.yaml).

The Hydra entry point lives here, not in sweep.py: Hydra resolves `config_path` against the file of a function
defined in `__main__`, but against the package of one imported from a module (where conf/ is no package).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from export.runtime import ExportRuntimeError
from serve.bench.sweep import bench
from serve.errors import ServeError
from zoo.errors import one_line_errors


@hydra.main(config_path="../../conf", config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(ServeError, ExportRuntimeError):
        bench(cfg)


if __name__ == "__main__":
    main()
