"""`python -m zoo.corpus data=<corpus>`: build a corpus into the cache (or load it) and print its statistics.

Training builds its corpus too; this command does only that, so a corpus can be fetched and checked first (for
`data=longsumm`, ~640 MB of Debian packages and some minutes once). It prints the split sizes, the cache
directory and the path of `stats.json`, which records every filter's count.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from zoo.data import build_splits
from zoo.errors import one_line_errors


def build(cfg: DictConfig) -> dict:
    """Build or load `cfg.data`'s corpus; returns its statistics (also printed)."""
    splits = build_splits(cfg.data)
    stats = splits.stats
    sizes = " / ".join(f"{len(splits.split(name)):,}" for name in ("train", "valid", "test"))
    print(f"[corpus] {cfg.data.name}: {sizes} train / valid / test pairs")
    for key in ("lengths", "filtered", "candidates", "documents_before_cut"):
        if key in stats:
            print(f"    {key}: {json.dumps(stats[key], sort_keys=True)}")
    if "cache_dir" in stats:
        print(f"    cache: {stats['cache_dir']} (stats.json there)")
    return stats


@hydra.main(config_path="../conf", config_name="corpus", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors():
        build(cfg)


if __name__ == "__main__":
    main()
