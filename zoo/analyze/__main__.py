"""`python -m zoo.analyze checkpoint=<run dir|.pt>` / `checkpoints=[a,b,…]` (Hydra entry point; the work is
in zoo.analyze.run, the measurements in zoo.analyze.scores and zoo.analyze.maps)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from zoo.analyze.run import analyze
from zoo.errors import one_line_errors


@hydra.main(config_path="../../conf", config_name="analyze", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors():
        analyze(cfg)


if __name__ == "__main__":
    main()
