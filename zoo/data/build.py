"""``build_splits``: the one entry point that turns a data config into train/valid/test.

Dispatches on ``cfg["kind"]`` (falling back to ``cfg["name"]``) so a new data config such as
``conf/data/iwslt14.yaml`` can reuse a builder under its own name. Debian-derived corpora are
cached under ``cache_dir/corpora/<kind>-<config hash>``: a second run downloads and parses
nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.data.assemble import log_stats
from zoo.data.cache import (
    build_lock,
    config_digest,
    load_cached,
    resolve_cache_dir,
    save_atomic,
)
from zoo.data.corpora import BUILD_VERSION, DEEN_DEFAULTS, SUMM_DEFAULTS, build_deen, build_summ
from zoo.data.debian import DebianArchive
from zoo.data.files import FILES_DEFAULTS, build_files
from zoo.data.longsumm import LONGSUMM_DEFAULTS, build_longsumm
from zoo.data.types import DataError, Splits

log = logging.getLogger("zoo.data")

CachedBuilder = Callable[[Mapping[str, Any], DebianArchive], Splits]
CACHED_BUILDERS: dict[str, tuple[CachedBuilder, dict[str, Any]]] = {
    "deen": (build_deen, DEEN_DEFAULTS),
    "summ": (build_summ, SUMM_DEFAULTS),
    "longsumm": (build_longsumm, LONGSUMM_DEFAULTS),
}
KINDS = (*CACHED_BUILDERS, "files")


def to_plain(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A plain, resolved dict from a ``DictConfig`` or any mapping (interpolations resolved)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def _kind(cfg: Mapping[str, Any]) -> str:
    kind = cfg.get("kind") or cfg.get("name")
    if kind not in KINDS:
        raise DataError(
            f"data.kind={kind!r} (data.name={cfg.get('name')!r}) is unknown; use one of {KINDS}, "
            "e.g. data=deen, data=summ, data=longsumm or data=files data.path=..."
        )
    return str(kind)


def _relevant(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Config values that determine the corpus content, with defaults filled in."""
    return {key: default if cfg.get(key) is None else cfg[key] for key, default in defaults.items()}


def build_splits(cfg: Mapping[str, Any], cache_dir: str | Path | None = None) -> Splits:
    """Build (or load from cache) the train/valid/test splits described by a data config.

    ``cache_dir`` defaults to ``cfg["cache_dir"]``, then ``$ZOO_CACHE``, then
    ``~/.cache/attention_zoo``. Raises :class:`DataError` for every user-facing problem.
    """
    plain = to_plain(cfg)
    kind = _kind(plain)
    start = time.perf_counter()
    if kind == "files":
        splits = build_files({**FILES_DEFAULTS, **{k: v for k, v in plain.items() if v is not None}})
        log_stats(str(plain.get("name", kind)), splits.stats)
        return splits
    builder, defaults = CACHED_BUILDERS[kind]
    relevant = {**_relevant(plain, defaults), "kind": kind, "version": BUILD_VERSION}
    root = resolve_cache_dir(cache_dir if cache_dir is not None else plain.get("cache_dir"))
    target = root / "corpora" / f"{kind}-{config_digest(relevant)}"
    splits = load_cached(target)
    if splits is None:
        with build_lock(root / "corpora" / f".{target.name}.lock"):
            splits = load_cached(target)  # another process may have finished meanwhile
            if splits is None:
                splits = _build_and_save(kind, builder, relevant, root, target, start)
                splits.stats["cache_dir"] = str(target)
                return splits
    splits.stats["cache_dir"] = str(target)
    log.info("loaded the %s corpus from %s in %.2f s", kind, target, time.perf_counter() - start)
    log_stats(kind, splits.stats)
    return splits


def _build_and_save(
    kind: str,
    builder: CachedBuilder,
    relevant: dict[str, Any],
    root: Path,
    target: Path,
    start: float,
) -> Splits:
    log.info("building the %s corpus (cache: %s)", kind, target)
    splits = builder(relevant, DebianArchive(root / "debian"))
    splits.stats["build_seconds"] = round(time.perf_counter() - start, 2)
    splits.stats["config"] = relevant
    save_atomic(target, splits, relevant)
    log.info("built the %s corpus in %.1f s", kind, splits.stats["build_seconds"])
    log_stats(kind, splits.stats)
    return splits
