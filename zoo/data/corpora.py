"""The two built-in corpora assembled from Debian packages: ``deen`` and ``summ``.

Each builder takes the resolved data config and a :class:`DebianArchive` and returns
:class:`Splits`; caching is the caller's job (:mod:`zoo.data.build`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from zoo.data.assemble import assemble
from zoo.data.ddtp import Description, family_key, join_translations, parse_source_map, parse_translation
from zoo.data.debian import DebianArchive
from zoo.data.ding import DING_PACKAGE, read_ding
from zoo.data.lohelp import HELP_PACKAGES, read_libreoffice_help
from zoo.data.splitting import assign_splits
from zoo.data.text import normalize_for_dedup
from zoo.data.types import DataError, Example, Splits

log = logging.getLogger("zoo.data")

# Bump when parsing or splitting rules change: it is part of every cache key.
BUILD_VERSION = 2

DEEN_DEFAULTS: dict[str, Any] = {
    "sources": ["ding", "libreoffice", "ddtp"],
    "valid_size": 1000,
    "test_size": 1500,
    "dedup": "either",
    "ding_min_words": 4,
    "src_lang": "de",
    "tgt_lang": "en",
}
SUMM_DEFAULTS: dict[str, Any] = {
    "valid_size": 1000,
    "test_size": 1500,
    "dedup": "either",
    "min_doc_words": 30,
}

Keyed = list[tuple[str, Example]]
Dropped = dict[str, int]


def _share(total: int, parts: int, index: int) -> int:
    """Split ``total`` into ``parts`` near-equal integers; this is part ``index``."""
    return total // parts + (1 if index < total % parts else 0)


def _merged_descriptions(archive: DebianArchive, lang: str) -> dict[str, Description]:
    merged: dict[str, Description] = {}
    for text in archive.translation_texts(lang):
        for md5, desc in parse_translation(text, lang).items():
            merged.setdefault(md5, desc)
    return merged


def _source_map(archive: DebianArchive) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for text in archive.packages_texts():
        for binary, source in parse_source_map(text).items():
            mapping.setdefault(binary, source)
    return mapping


def _family(package: str, sources: Mapping[str, str]) -> str:
    return family_key(sources.get(package, package))


# ------------------------------------------------------------------------------ deen sources
def _ding(archive: DebianArchive, cfg: Mapping[str, Any], dropped: Dropped) -> Keyed:
    pairs = read_ding(archive.package(DING_PACKAGE) / "root", int(cfg["ding_min_words"]), dropped)
    return [("ding:" + normalize_for_dedup(de), Example(de, en, "ding")) for de, en in pairs]


def _libreoffice(archive: DebianArchive, cfg: Mapping[str, Any], dropped: Dropped) -> Keyed:
    de_pkg, en_pkg = (archive.package(name) / "root" for name in HELP_PACKAGES)
    triples = read_libreoffice_help(de_pkg, en_pkg, dropped)
    return [("lo:" + page, Example(de, en, "libreoffice")) for page, de, en in triples]


def _ddtp(archive: DebianArchive, cfg: Mapping[str, Any], dropped: Dropped) -> Keyed:
    de, en = _merged_descriptions(archive, "de"), _merged_descriptions(archive, "en")
    sources = _source_map(archive)
    return [
        ("ddtp:" + _family(package, sources), Example(de_text, en_text, "ddtp"))
        for package, de_text, en_text in join_translations(de, en, dropped)
    ]


DEEN_SOURCES: dict[str, Callable[[DebianArchive, Mapping[str, Any], Dropped], Keyed]] = {
    "ding": _ding,
    "libreoffice": _libreoffice,
    "ddtp": _ddtp,
}


def build_deen(cfg: Mapping[str, Any], archive: DebianArchive) -> Splits:
    """German→English pairs from Ding, LibreOffice help and DDTP, split per source.

    Split targets are shared equally among the configured sources so every source is
    represented in valid/test. ``src_lang=en, tgt_lang=de`` reverses the direction.
    """
    sources = [cfg["sources"]] if isinstance(cfg["sources"], str) else list(cfg["sources"])
    unknown = [s for s in sources if s not in DEEN_SOURCES]
    if unknown or not sources:
        raise DataError(f"data.sources={sources}: unknown or empty; choose from {sorted(DEEN_SOURCES)}")
    direction = (cfg["src_lang"], cfg["tgt_lang"])
    if direction not in (("de", "en"), ("en", "de")):
        raise DataError(
            f"data.src_lang/tgt_lang={direction}: the deen corpus has only German and English; "
            "use src_lang=de tgt_lang=en or the reverse"
        )
    per_source: dict[str, dict[str, list[Example]]] = {}
    parsed: dict[str, int] = {}
    filtered: dict[str, Dropped] = {}
    for i, source in enumerate(sources):
        filtered[source] = {}
        keyed = DEEN_SOURCES[source](archive, cfg, filtered[source])
        if direction == ("en", "de"):
            keyed = [(k, Example(ex.tgt, ex.src, ex.origin)) for k, ex in keyed]
        parsed[source] = len(keyed)
        log.info("%s: %d unique pairs", source, len(keyed))
        per_source[source] = assign_splits(
            keyed,
            valid_size=_share(int(cfg["valid_size"]), len(sources), i),
            test_size=_share(int(cfg["test_size"]), len(sources), i),
        )
    return assemble(per_source, cfg["dedup"], {"parsed": parsed, "filtered": filtered})


def build_summ(cfg: Mapping[str, Any], archive: DebianArchive) -> Splits:
    """English long package description → one-line synopsis, split by package family.

    Descriptions shorter than ``min_doc_words`` words are not worth summarising; identical long
    descriptions (shared by sibling packages) are kept once so one document never has several
    competing references.
    """
    descriptions = sorted(_merged_descriptions(archive, "en").values(), key=lambda d: (d.package, d.md5))
    sources = _source_map(archive)
    min_words = int(cfg["min_doc_words"])
    keyed: Keyed = []
    seen: set[str] = set()
    short = duplicate = 0
    for desc in descriptions:
        doc = desc.long_text
        if len(doc.split()) < min_words or not desc.synopsis:
            short += 1
            continue
        if doc in seen:
            duplicate += 1
            continue
        seen.add(doc)
        keyed.append(("pkg:" + _family(desc.package, sources), Example(doc, desc.synopsis, "ddtp")))
    log.info(
        "summ: %d documents (%d shorter than %d words, %d duplicate descriptions dropped)",
        len(keyed),
        short,
        min_words,
        duplicate,
    )
    per_source = {
        "ddtp": assign_splits(keyed, int(cfg["valid_size"]), int(cfg["test_size"])),
    }
    extra = {
        "parsed": {"ddtp": len(keyed)},
        "filtered": {"short_description": short, "duplicate_description": duplicate},
    }
    return assemble(per_source, cfg["dedup"], extra)
