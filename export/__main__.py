"""`python -m export checkpoint=<run dir|.pt> out=<dir>`: thin Hydra entry point around `export_checkpoint`."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from export.exporter import export_checkpoint
from export.graph import ExportError
from zoo.checkpoint import CheckpointError
from zoo.data import DataError


@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        export_checkpoint(cfg)
    except (CheckpointError, DataError, ExportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
