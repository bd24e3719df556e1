"""Turn per-source split assignments into final :class:`Splits` with auditable statistics.

Overlap removal runs on the combined corpus, because a sentence from one source may reappear
in another (a Ding example sentence inside a package description, say).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from zoo.data.splitting import DedupMode, OverlapIndex, remove_overlap
from zoo.data.types import SPLIT_NAMES, DataError, Example, Splits

log = logging.getLogger("zoo.data")


def _by_origin(examples: list[Example]) -> Counter[str]:
    return Counter(ex.origin for ex in examples)


def assemble(
    per_source: Mapping[str, Mapping[str, list[Example]]],
    dedup: DedupMode,
    extra_stats: Mapping[str, Any] | None = None,
) -> Splits:
    """Concatenate sources per split, drop valid/test pairs overlapping train (and valid pairs
    overlapping test), and record per-source counts and removals in ``stats``."""
    if dedup not in ("either", "pair", "none"):
        raise DataError(f"data.dedup={dedup!r} is not supported; use either, pair or none")
    combined = {name: [ex for s in per_source.values() for ex in s[name]] for name in SPLIT_NAMES}
    train = combined["train"]
    train_index = OverlapIndex(train if dedup != "none" else [])
    test, test_removed = train_index.remove_from(combined["test"], dedup)
    valid, _ = train_index.remove_from(combined["valid"], dedup)
    valid_final, _ = remove_overlap(test, valid, dedup)
    removed = {
        "test": dict(_by_origin(combined["test"]) - _by_origin(test)),
        "valid": dict(_by_origin(combined["valid"]) - _by_origin(valid_final)),
    }
    sources = list(per_source)
    counts: dict[str, dict[str, int]] = {}
    for source in sources:
        counts[source] = {
            "train": sum(ex.origin == source for ex in train),
            "valid": sum(ex.origin == source for ex in valid_final),
            "test": sum(ex.origin == source for ex in test),
        }
    counts["total"] = {"train": len(train), "valid": len(valid_final), "test": len(test)}
    stats: dict[str, Any] = {
        "counts": counts,
        "overlap_removed": {
            "dedup": dedup,
            "test": {s: removed["test"].get(s, 0) for s in sources},
            "valid": {s: removed["valid"].get(s, 0) for s in sources},
            "total": test_removed + len(combined["valid"]) - len(valid_final),
        },
    }
    if dedup == "none":
        # Kept on purpose (e.g. a standard test set), but the user should know about it.
        _, found = OverlapIndex(train).remove_from(combined["test"], "either")
        stats["overlap_removed"]["test_overlap_kept"] = found
        if found:
            log.warning("%d test pairs overlap training pairs (kept because dedup=none)", found)
    stats.update(extra_stats or {})
    return Splits(train=train, valid=valid_final, test=test, stats=stats)


def log_stats(name: str, stats: Mapping[str, Any]) -> None:
    """Log per-source counts per split and the overlap removed (logger ``zoo.data``)."""
    for source, c in stats.get("counts", {}).items():
        log.info(
            "%s %-12s train %7d  valid %5d  test %5d",
            name,
            source,
            c["train"],
            c["valid"],
            c["test"],
        )
    overlap = stats.get("overlap_removed")
    if overlap:
        log.info(
            "%s: removed %d valid/test pairs overlapping train (dedup=%s; test %s, valid %s)",
            name,
            overlap["total"],
            overlap["dedup"],
            overlap["test"],
            overlap["valid"],
        )
