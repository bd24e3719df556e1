"""``data=longsumm``: long-document summarization, a package's upstream README → its Debian long description.

The document is the upstream documentation a Debian package ships (:mod:`zoo.data.upstream`: a README, a Python
distribution's long description, a Perl module's POD ``DESCRIPTION``) as plain prose, cut to its first
``max_doc_words`` words (at a sentence end where one is near); the summary is the package's English long
description from ``Translation-en``, which the Debian maintainer wrote for someone choosing a package: what it is
and does, in a few sentences.

How the build goes, and what each step drops (counted in ``stats.json``):

1. **Choose packages from the index, before downloading anything.** The ``Packages`` index names every binary
   package with its section and download size. Candidates are the packages of six groups (``sources``): Python 3
   modules (``python3-*``), Perl modules (``lib*-perl``), Node.js modules (``node-*``), Ruby libraries
   (``ruby-*``), Emacs packages (``elpa-*``) and programs (every other package that is not a library, a
   ``-dev``/``-doc``/``-data``/… companion or in a library, font, documentation or meta section) — each at most
   ``max_package_kb`` to download. A candidate needs a long description of at least ``min_summary_sentences``
   sentences once boilerplate is removed (below): the others are never downloaded.
2. **Boilerplate out of the summaries.** A sentence that occurs in the descriptions of ``boilerplate_families``
   or more source-package families ("Node.js is an event-based server-side JavaScript engine.", "This package
   contains the Python 3 version of the library.") is Debian's framing, not the upstream document's content;
   it is removed from every summary.
3. **Download** the chosen ``.deb`` files (kept in the cache, ``debian/debs/``) and read the document members.
4. **Pair and filter.** No upstream document; fewer than ``min_doc_words`` words of prose; not English (under
   ``MIN_STOPWORD_SHARE`` of its words are common English function words); or a summary that is a copy of the
   document's start (the longest common subsequence of the summary's words with the document's first 1.2 × as
   many words covers ``max_lead_copy`` or more of the summary: Perl packages' descriptions are often the first
   paragraph of the POD ``DESCRIPTION``) — dropped. A document or a summary already paired (sibling packages of
   one source) is kept once.
5. **Split** by source-package family (:func:`zoo.data.ddtp.family_key`) with :func:`assign_splits`, all groups
   pooled (a ``python3-foo`` module and its ``foo`` program are one family; the groups differ in size by 20×, so
   each keeps its share of valid/test only in expectation); valid/test pairs whose normalised document or
   summary occurs in train are removed (:func:`zoo.data.assemble.assemble`).
"""

from __future__ import annotations

import logging
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zoo.data.assemble import assemble
from zoo.data.ddtp import Description, family_key, parse_translation
from zoo.data.debian import DebianArchive, read_deb_members
from zoo.data.splitting import assign_splits
from zoo.data.types import SPLIT_NAMES, DataError, Example, Splits
from zoo.data.upstream import is_perl_module, upstream_document, wanted_member

log = logging.getLogger("zoo.data")

LONGSUMM_DEFAULTS: dict[str, Any] = {
    "sources": ["python", "perl", "node", "ruby", "elpa", "programs"],
    "max_package_kb": 150,
    "valid_size": 300,
    "test_size": 500,
    "dedup": "either",
    "min_doc_words": 150,
    "max_doc_words": 300,
    "min_summary_sentences": 2,
    "max_lead_copy": 0.8,
    "boilerplate_families": 20,
}

# Sections whose packages carry no program or module documentation worth summarising.
SKIPPED_SECTIONS = frozenset(
    "libs libdevel oldlibs fonts localization doc metapackages tasks kernel debug introspection translations".split()
)
# Prefixes of package names that belong to no group: other languages' libraries, data and bindings.
_OTHER_PREFIXES = (
    "lib", "golang-", "librust-", "r-cran-", "r-bioc-", "r-other-", "php-", "fonts-", "xfonts-", "gir1.2-",
    "haskell-", "ghc", "ocaml", "texlive", "linux-", "firmware-", "pypy", "python-", "lua-", "hunspell-",
    "myspell-", "aspell-", "hyphen-", "mythes-", "task-",
)  # fmt: skip
_COMPANION_SUFFIXES = (
    "-dev", "-doc", "-docs", "-dbg", "-dbgsym", "-data", "-common", "-l10n", "-i18n", "-examples", "-tests",
)  # fmt: skip
_GROUP_PREFIXES = {"python": "python3-", "node": "node-", "ruby": "ruby-", "elpa": "elpa-"}
MIN_STOPWORD_SHARE = 0.1
_STOPWORDS = frozenset(
    "the a an and or of to in is are be it this that for with on as by from can you your not if at which".split()
)
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")
_WORD = re.compile(r"[a-z0-9]+")
_FIELD = re.compile(r"^(Package|Source|Section|Size|Description-md5): *(.*?) *$", re.MULTILINE)


@dataclass(frozen=True)
class IndexEntry:
    """One binary package of a ``Packages`` index: the fields the selection reads."""

    package: str
    source: str
    section: str
    size: int
    md5: str


def parse_packages(text: str) -> list[IndexEntry]:
    """The binary packages of an apt ``Packages`` index (first record of a name wins; ``Source:`` without
    version, defaulting to the package; section without its ``contrib/``-style area)."""
    entries: dict[str, IndexEntry] = {}
    for record in text.split("\n\n"):
        fields = dict(_FIELD.findall(record))
        name = fields.get("Package")
        if not name or name in entries:
            continue
        entries[name] = IndexEntry(
            package=name,
            source=(fields.get("Source") or name).split(" ", 1)[0],
            section=fields.get("Section", "").rsplit("/", 1)[-1],
            size=int(fields.get("Size") or 0),
            md5=fields.get("Description-md5", ""),
        )
    return list(entries.values())


def package_group(entry: IndexEntry) -> str | None:
    """The source group (``sources``) a binary package belongs to, or None (see the module docstring)."""
    name = entry.package
    if name.endswith(_COMPANION_SUFFIXES):
        return None
    for group, prefix in _GROUP_PREFIXES.items():
        if name.startswith(prefix):
            return group
    if is_perl_module(name):
        return "perl"
    if name.startswith(_OTHER_PREFIXES) or entry.section in SKIPPED_SECTIONS:
        return None
    return "programs"


def sentences(text: str) -> list[str]:
    """Sentences of running text: split after ``.!?`` (and a closing quote or bracket) before a capital or digit."""
    return [s for s in (part.strip() for part in _SENTENCE_END.split(text)) if s]


def boilerplate_sentences(descriptions: Iterable[tuple[str, Description]], min_families: int) -> frozenset[str]:
    """Sentences found in the long descriptions of at least ``min_families`` source-package families
    (``descriptions`` yields (family, description)); a family counts once however many binaries repeat it."""
    families: dict[str, set[str]] = {}
    for family, desc in descriptions:
        for paragraph in desc.paragraphs:
            for sentence in sentences(paragraph):
                families.setdefault(sentence, set()).add(family)
    return frozenset(s for s, f in families.items() if len(f) >= min_families)


def clean_summary(desc: Description, boilerplate: frozenset[str]) -> str:
    """The long description as one line, boilerplate sentences removed."""
    kept = [s for p in desc.paragraphs for s in sentences(p) if s not in boilerplate]
    return " ".join(kept)


def words(text: str) -> list[str]:
    """Lowercase alphanumeric runs: the units of the copy and English checks (as ROUGE's tokenizer)."""
    return _WORD.findall(text.lower())


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def lead_copy(document: str, summary: str) -> float:
    """How much of ``summary`` is the start of ``document``: the longest common subsequence of the summary's
    words and the document's first ``1.2 × len(summary) + 5`` words, over the summary's length (1.0: the summary
    is the document's opening, up to dropped words)."""
    summary_words = words(summary)
    if not summary_words:
        return 0.0
    lead = words(document)[: int(1.2 * len(summary_words)) + 5]
    return _lcs(summary_words, lead) / len(summary_words)


def cut_words(text: str, limit: int) -> str:
    """The first ``limit`` words of ``text``, ended at the last sentence end among them when that keeps at least
    two thirds of them (a document cut mid-sentence only when its sentences are very long)."""
    tokens = text.split()
    if len(tokens) <= limit:
        return " ".join(tokens)
    head = tokens[:limit]
    ends = [i for i in range(len(head) - 1, (2 * limit) // 3 - 2, -1) if head[i].endswith((".", "!", "?"))]
    return " ".join(head[: ends[0] + 1] if ends else head)


def stopword_share(text: str) -> float:
    """The share of a text's words that are common English function words (English prose: ~0.3)."""
    tokens = words(text)
    return sum(t in _STOPWORDS for t in tokens) / max(1, len(tokens))


def _descriptions(archive: DebianArchive) -> dict[str, Description]:
    merged: dict[str, Description] = {}
    for text in archive.translation_texts("en"):
        for md5, desc in parse_translation(text, "en").items():
            merged.setdefault(md5, desc)
    return merged


def _index(archive: DebianArchive) -> list[IndexEntry]:
    seen: dict[str, IndexEntry] = {}
    for text in archive.packages_texts():
        for entry in parse_packages(text):
            seen.setdefault(entry.package, entry)
    return sorted(seen.values(), key=lambda e: e.package)


@dataclass(frozen=True)
class Candidate:
    entry: IndexEntry
    group: str
    summary: str


def choose_candidates(
    index: Sequence[IndexEntry],
    descriptions: Mapping[str, Description],
    family: Mapping[str, str],
    cfg: Mapping[str, Any],
    dropped: Counter[str],
) -> list[Candidate]:
    """Packages to download: in a configured group, small enough, with a long description of enough sentences
    after boilerplate removal (``family``: binary package → source-package family). Reasons for leaving one out
    are counted in ``dropped``."""
    groups = set(cfg["sources"])
    by_family = ((family[e.package], descriptions[e.md5]) for e in index if e.md5 in descriptions)
    boilerplate = boilerplate_sentences(by_family, int(cfg["boilerplate_families"]))
    chosen: list[Candidate] = []
    for entry in index:
        group = package_group(entry)
        if group not in groups:
            continue
        if entry.size > int(cfg["max_package_kb"]) * 1000:
            dropped["package_too_large"] += 1
            continue
        desc = descriptions.get(entry.md5)
        if desc is None:
            dropped["no_english_description"] += 1
            continue
        summary = clean_summary(desc, boilerplate)
        if len(sentences(summary)) < int(cfg["min_summary_sentences"]):
            dropped["summary_too_few_sentences"] += 1
            continue
        chosen.append(Candidate(entry, group, summary))
    return chosen


def pair(
    candidate: Candidate, members: dict[str, bytes], cfg: Mapping[str, Any], dropped: Counter[str]
) -> tuple[str, str, int] | None:
    """(document, summary, the document's words before the cut) of one downloaded candidate, or None with the
    reason counted in ``dropped``."""
    doc = upstream_document(candidate.entry.package, members)
    if doc is None:
        dropped["no_upstream_document"] += 1
        return None
    if doc.words < int(cfg["min_doc_words"]):
        dropped["document_too_short"] += 1
        return None
    text = cut_words(doc.text, int(cfg["max_doc_words"]))
    if stopword_share(text) < MIN_STOPWORD_SHARE:
        dropped["document_not_english"] += 1
        return None
    if lead_copy(text, candidate.summary) >= float(cfg["max_lead_copy"]):
        dropped["summary_copies_document_start"] += 1
        return None
    return text, candidate.summary, doc.words


def _length_stats(examples: Sequence[Example]) -> dict[str, Any]:
    if not examples:
        return {"documents": 0}
    doc_words = [len(ex.src.split()) for ex in examples]
    sum_words = [len(ex.tgt.split()) for ex in examples]
    sum_sentences = [len(sentences(ex.tgt)) for ex in examples]
    return {
        "documents": len(examples),
        "document_words": {"median": statistics.median(doc_words), "mean": round(statistics.fmean(doc_words), 1)},
        "summary_words": {"median": statistics.median(sum_words), "mean": round(statistics.fmean(sum_words), 1)},
        "summary_sentences": {
            "median": statistics.median(sum_sentences),
            "two_or_more": sum(n >= 2 for n in sum_sentences),
        },
    }


def build_longsumm(cfg: Mapping[str, Any], archive: DebianArchive) -> Splits:
    """The ``longsumm`` corpus (see the module docstring) from the archive's indexes and packages."""
    sources = [cfg["sources"]] if isinstance(cfg["sources"], str) else list(cfg["sources"])
    unknown = sorted(set(sources) - set(LONGSUMM_DEFAULTS["sources"]))
    if unknown or not sources:
        raise DataError(f"data.sources={sources}: unknown or empty; choose from {LONGSUMM_DEFAULTS['sources']}")
    cfg = {**cfg, "sources": sources}
    index = _index(archive)
    family_of_source = {source: family_key(source) for source in {e.source for e in index}}
    family = {e.package: family_of_source[e.source] for e in index}
    dropped: Counter[str] = Counter()
    candidates = choose_candidates(index, _descriptions(archive), family, cfg, dropped)
    download_bytes = sum(c.entry.size for c in candidates)
    log.info(
        "longsumm: %d candidate packages (%.0f MB to download once); %s",
        len(candidates),
        download_bytes / 1e6,
        dict(dropped),
    )
    debs, failed = archive.debs([c.entry.package for c in candidates])
    dropped["download_failed"] += len(failed)
    keyed: list[tuple[str, Example]] = []
    seen_docs: set[str] = set()
    seen_summaries: set[str] = set()
    full_words: list[int] = []  # the kept documents' lengths before the cut at max_doc_words
    for i, candidate in enumerate(candidates):
        if i and i % 2000 == 0:
            log.info("longsumm: read %d of %d packages, %d pairs", i, len(candidates), len(keyed))
        name = candidate.entry.package
        if name not in debs:
            continue
        members = read_deb_members(debs[name], lambda path, name=name: wanted_member(name, path))
        paired = pair(candidate, members, cfg, dropped)
        if paired is None:
            continue
        doc, summary, words_before_cut = paired
        if doc in seen_docs or summary in seen_summaries:
            dropped["duplicate"] += 1
            continue
        seen_docs.add(doc)
        seen_summaries.add(summary)
        full_words.append(words_before_cut)
        keyed.append(("pkg:" + family[name], Example(doc, summary, candidate.group)))
    pooled = assign_splits(keyed, valid_size=int(cfg["valid_size"]), test_size=int(cfg["test_size"]))
    per_source = {s: {split: [ex for ex in pooled[split] if ex.origin == s] for split in SPLIT_NAMES} for s in sources}
    parsed = {source: sum(ex.origin == source for _, ex in keyed) for source in sources}
    log.info("longsumm: %d pairs %s; dropped %s", sum(parsed.values()), parsed, dict(dropped))
    extra = {
        "parsed": parsed,
        "filtered": dict(sorted(dropped.items())),
        "candidates": {"packages": len(candidates), "download_mb": round(download_bytes / 1e6, 1)},
        "documents_before_cut": {
            "median_words": statistics.median(full_words) if full_words else 0,
            "cut_at_max_doc_words": sum(n > int(cfg["max_doc_words"]) for n in full_words),
        },
    }
    splits = assemble(per_source, cfg["dedup"], extra)
    splits.stats["lengths"] = {name: _length_stats(splits.split(name)) for name in SPLIT_NAMES}
    return splits
