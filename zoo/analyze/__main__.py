"""`python -m zoo.analyze checkpoint=<run dir|.pt>` / `checkpoints=[a,b,…]` (Hydra entry point; the work is
in zoo.analyze.run, the measurements in zoo.analyze.scores and zoo.analyze.maps)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from zoo.analyze.run import AnalyzeError, analyze
from zoo.checkpoint import CheckpointError
from zoo.data import DataError


@hydra.main(config_path="../../conf", config_name="analyze", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        analyze(cfg)
    except (CheckpointError, DataError, AnalyzeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
