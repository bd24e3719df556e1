"""On-disk cache of built splits: one directory per corpus config, written atomically.

A cache directory is only ever created by renaming a fully written temporary directory, so its
existence means it is complete; an interrupted build leaves at most a ``.tmp-*`` directory that
is ignored (and cleaned up by the next build).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from zoo.data.types import SPLIT_NAMES, DataError, Example, Splits

DEFAULT_CACHE = Path("~/.cache/attention_zoo")


def resolve_cache_dir(cache_dir: str | Path | None) -> Path:
    """Explicit argument, else ``$ZOO_CACHE``, else ``~/.cache/attention_zoo``."""
    if cache_dir in (None, ""):
        cache_dir = os.environ.get("ZOO_CACHE") or DEFAULT_CACHE
    path = Path(cache_dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_digest(relevant: Mapping[str, Any]) -> str:
    """Short hash of the config values that change a corpus's content (not vocab or max_len)."""
    blob = json.dumps(relevant, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def write_jsonl(path: Path, examples: list[Example]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for ex in examples:
            row = {"src": ex.src, "tgt": ex.tgt, "origin": ex.origin}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[Example]:
    with open(path, encoding="utf-8") as fh:
        return [Example(**json.loads(line)) for line in fh if line.strip()]


def load_cached(directory: Path) -> Splits | None:
    """The splits stored in ``directory``, or ``None`` if it does not exist."""
    if not (directory / "stats.json").is_file():
        return None
    try:
        parts = {name: read_jsonl(directory / f"{name}.jsonl") for name in SPLIT_NAMES}
        stats = json.loads((directory / "stats.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as exc:
        raise DataError(
            f"the corpus cache {directory} is unreadable ({exc}); delete that directory to rebuild"
        ) from exc
    return Splits(parts["train"], parts["valid"], parts["test"], stats)


def save_atomic(directory: Path, splits: Splits, config: Mapping[str, Any]) -> None:
    """Write ``{train,valid,test}.jsonl``, ``stats.json`` and ``config.json``, then publish the
    directory with a single rename. Call it under :func:`build_lock` for ``directory``."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    for stale in directory.parent.glob(f".tmp-{directory.name}-*"):  # from a killed build
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".tmp-{directory.name}-"))
    try:
        for name in SPLIT_NAMES:
            write_jsonl(tmp / f"{name}.jsonl", splits.split(name))
        dump = {"ensure_ascii": False, "indent": 2, "sort_keys": True}
        (tmp / "config.json").write_text(json.dumps(dict(config), **dump), encoding="utf-8")
        (tmp / "stats.json").write_text(json.dumps(splits.stats, **dump), encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private; a shared cache should be readable by all
        try:
            tmp.rename(directory)
        except OSError:
            if not (directory / "stats.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock, so DDP ranks or parallel jobs build a corpus only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
