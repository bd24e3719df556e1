"""Document-disjoint split assignment and train/held-out overlap removal.

There is no standard test set for these corpora, so we make a fixed one: documents (help pages,
package families, Ding sentences) are ordered by a stable hash of their key and the first ones
fill test, then valid. Whole documents move together, so near-duplicate text inside a document
cannot straddle the train/test boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from zoo.data.text import normalize_for_dedup, stable_hash
from zoo.data.types import Example

DedupMode = Literal["either", "pair", "none"]


def assign_splits(items: Iterable[tuple[str, Example]], valid_size: int, test_size: int) -> dict[str, list[Example]]:
    """Split ``(document key, example)`` items so that every document lands in one split.

    Documents are visited in stable-hash order; a document joins test (then valid) while that
    split is below its target and would not overshoot it by more than 10 %. Everything else is
    training data. Each split keeps the input order of its examples.
    """
    groups: dict[str, list[int]] = {}
    items = list(items)
    for i, (key, _) in enumerate(items):
        groups.setdefault(key, []).append(i)
    targets = {"test": test_size, "valid": valid_size}
    counts = {"test": 0, "valid": 0}
    where: dict[str, str] = {}
    for key in sorted(groups, key=lambda k: (stable_hash(k), k)):
        n = len(groups[key])
        where[key] = "train"
        for split in ("test", "valid"):
            target = targets[split]
            if counts[split] < target and counts[split] + n <= target + max(1, target // 10):
                where[key] = split
                counts[split] += n
                break
    out: dict[str, list[Example]] = {"train": [], "valid": [], "test": []}
    for key, ex in items:
        out[where[key]].append(ex)
    return out


def _keys(ex: Example) -> tuple[str, str]:
    return normalize_for_dedup(ex.src), normalize_for_dedup(ex.tgt)


class OverlapIndex:
    """Normalised source/target keys of a reference split (usually train), built once and
    reused for every held-out split because normalising ~100k pairs is the slow part."""

    def __init__(self, reference: Sequence[Example]) -> None:
        keys = [_keys(ex) for ex in reference]
        self.src = {s for s, _ in keys}
        self.tgt = {t for _, t in keys}
        self.pairs = set(keys)

    def remove_from(self, held_out: Sequence[Example], mode: DedupMode = "either") -> tuple[list[Example], int]:
        """Drop held-out examples the model could have seen in the reference.

        ``either``: the normalised source *or* target occurs in the reference (strict: a
        memorised source sentence inflates scores even with a different reference translation);
        ``pair``: both occur together; ``none``: keep all. Repeats inside ``held_out`` are
        dropped as well. Returns the kept examples and how many were removed.
        """
        if mode not in ("either", "pair", "none"):
            raise ValueError(f"dedup mode must be 'either', 'pair' or 'none', got {mode!r}")
        if mode == "none":
            return list(held_out), 0
        kept: list[Example] = []
        seen: set[tuple[str, str]] = set()
        for ex in held_out:
            key = _keys(ex)
            if mode == "either":
                overlaps = key[0] in self.src or key[1] in self.tgt
            else:
                overlaps = key in self.pairs
            if overlaps or key in seen:
                continue
            seen.add(key)
            kept.append(ex)
        return kept, len(held_out) - len(kept)


def remove_overlap(
    reference: Sequence[Example], held_out: Sequence[Example], mode: DedupMode = "either"
) -> tuple[list[Example], int]:
    """One-shot form of :meth:`OverlapIndex.remove_from`."""
    if mode == "none":
        return list(held_out), 0
    return OverlapIndex(reference).remove_from(held_out, mode)
