"""Sentence pairs from the Ding German–English dictionary (Debian package ``trans-de-en``).

A dictionary line is ``de1 | de2 | … :: en1 | en2 | …``; sub-entry *i* on the German side
translates sub-entry *i* on the English side. Most sub-entries are headwords or phrases; the
example sentences among them are everyday language, the closest thing to IWSLT/Tatoeba style
available offline, so we keep only those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from zoo.data.text import collapse_ws

DING_PACKAGE = "trans-de-en"
DING_FILE = "usr/share/trans/de-en"

_ANNOTATION = re.compile(r"\s*(?:\{[^{}]*\}|\[[^\[\]]*\])")
# "a/b" or "a / b" word alternatives → "a"; abbreviations ("jdm./etw.") first. Alternatives
# starting with a digit (dates, ratios) stay.
_ABBREV_ALTERNATIVE = re.compile(r"(?<![\w/])([^\W\d][\w'’-]*\.)(?: ?/ ?[^\W\d][\w'’-]*\.)+")
_ALTERNATIVE = re.compile(r"(?<![\w/])([^\W\d][\w'’-]*)(?: ?/ ?[^\W\d][\w'’-]*)+(?![\w/])")
_SENTENCE_END = (".", "!", "?")
# Cheap pre-filter: a sentence ends in .!? possibly followed by annotations.
_MAYBE_SENTENCE = re.compile(r"[.!?](?:\s*(?:\{[^{}]*\}|\[[^\[\]]*\]))*\s*$")


def clean_side(text: str) -> str:
    """Strip ``{…}``/``[…]`` annotations and reduce ``a/b`` alternatives to the first one."""
    text = _ANNOTATION.sub("", text)
    text = _ABBREV_ALTERNATIVE.sub(r"\1", text)
    text = _ALTERNATIVE.sub(r"\1", text)
    text = re.sub(r"\s+([.!?,;:])", r"\1", text)
    return collapse_ws(text)


def _is_sentence(text: str) -> bool:
    return text.endswith(_SENTENCE_END) and ";" not in text


def parse_line(line: str, min_words: int = 4) -> list[tuple[str, str]]:
    """Sentence pairs in one dictionary line.

    Keeps sub-entries where both sides end in ``.!?`` and the German side has at least
    ``min_words`` words; sub-entries listing ``;``-separated alternatives are dropped because
    which alternative matches which is unknown.
    """
    line = line.strip()
    if not line or line.startswith("#") or " :: " not in line:
        return []
    de_part, en_part = line.split(" :: ", 1)
    de_subs, en_subs = de_part.split(" | "), en_part.split(" | ")
    if len(de_subs) != len(en_subs):
        return []
    pairs = []
    for de_raw, en_raw in zip(de_subs, en_subs, strict=True):
        if ";" in de_raw or ";" in en_raw or not _MAYBE_SENTENCE.search(de_raw):
            continue
        de, en = clean_side(de_raw), clean_side(en_raw)
        if _is_sentence(de) and _is_sentence(en) and len(de.split()) >= min_words:
            pairs.append((de, en))
    return pairs


def parse_lines(
    lines: Iterable[str], min_words: int = 4, dropped: dict[str, int] | None = None
) -> Iterator[tuple[str, str]]:
    """Unique sentence pairs of a whole dictionary, in file order (repeats counted in
    ``dropped["repeated"]`` if given)."""
    dropped = {} if dropped is None else dropped
    dropped.setdefault("repeated", 0)
    seen: set[tuple[str, str]] = set()
    for line in lines:
        for pair in parse_line(line, min_words):
            if pair in seen:
                dropped["repeated"] += 1
            else:
                seen.add(pair)
                yield pair


def read_ding(package_root: Path, min_words: int = 4, dropped: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """Sentence pairs from an extracted ``trans-de-en`` package."""
    with open(package_root / DING_FILE, encoding="utf-8") as fh:
        return list(parse_lines(fh, min_words, dropped))
