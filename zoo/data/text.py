"""Small text helpers: dedup normalisation, stable hashing and BPE-marker removal."""

from __future__ import annotations

import functools
import hashlib
import re
import sys
import unicodedata

_WS = re.compile(r"\s+")

SENTENCEPIECE_MARKER = "sentencepiece"


def collapse_ws(text: str) -> str:
    """Collapse every whitespace run to one space and strip, so formatting never splits a pair."""
    return _WS.sub(" ", text).strip()


@functools.cache
def _punct_table() -> dict[int, None]:
    """``str.translate`` table deleting every Unicode punctuation code point (built once)."""
    return {cp: None for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)).startswith("P")}


def normalize_for_dedup(text: str) -> str:
    """Key under which two sentences count as the same for train/test overlap removal.

    Lowercases, drops all Unicode punctuation and collapses whitespace, so "Hello, world!" and
    "hello world" collide: the model has effectively seen a test pair if only casing or
    punctuation differs.
    """
    text = unicodedata.normalize("NFKC", text).lower().translate(_punct_table())
    return collapse_ws(text)


def stable_hash(key: str) -> int:
    """64-bit hash that is identical across runs and machines (unlike ``hash()``).

    Split assignment depends on it, so it must never change for a given key.
    """
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


def remove_bpe(text: str, marker: str | None = "@@ ") -> str:
    """Undo subword segmentation the way fairseq's ``--remove-bpe`` does.

    Users arriving with fairseq-preprocessed data (e.g. ``prepare-iwslt14.sh``) have BPE'd
    references; metrics must be computed on detokenised words. ``marker="sentencepiece"`` joins
    ``▁``-prefixed pieces instead. ``None`` returns the text unchanged.
    """
    if marker is None:
        return text
    if marker == SENTENCEPIECE_MARKER:
        return text.replace(" ", "").replace("\u2581", " ").strip()
    return (text + " ").replace(marker, "").rstrip()
