"""`python -m export checkpoint=<run dir|.pt> out=<dir>`: thin Hydra entry point around `export_checkpoint`."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from export.exporter import export_checkpoint
from export.runtime import ExportRuntimeError
from zoo.errors import one_line_errors


@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(ExportRuntimeError):
        export_checkpoint(cfg)


if __name__ == "__main__":
    main()
