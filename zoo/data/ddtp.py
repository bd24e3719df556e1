"""Debian package descriptions: parsing ``Translation-*`` indexes and grouping packages.

Used twice: German↔English description pairs for translation (the Debian Description
Translation Project, joined on ``Description-md5``) and English long description → synopsis
for summarization. Related packages (libfoo1, libfoo-dev, foo-doc) share boilerplate text, so
both corpora split by *package family* to keep near-duplicates on one side of the split.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from zoo.data.text import collapse_ws


@dataclass(frozen=True)
class Description:
    """One package description: the one-line synopsis and the long-description paragraphs."""

    package: str
    md5: str
    synopsis: str
    paragraphs: tuple[str, ...]

    @property
    def long_text(self) -> str:
        """Long description as one line of running text (paragraphs joined by a space)."""
        return " ".join(self.paragraphs)


def long_description_paragraphs(lines: Iterable[str]) -> tuple[str, ...]:
    """Turn Debian long-description continuation lines into paragraphs of running text.

    Debian policy (§5.6.13): every line starts with a space, a line of just " ." separates
    paragraphs, and lines with two or more leading spaces are shown verbatim (lists, code).
    We keep verbatim lines as text, collapse all whitespace and drop empty paragraphs.
    """
    paragraphs: list[str] = []
    current: list[str] = []
    for raw in lines:
        line = raw.strip()
        if line == ".":
            if current:
                paragraphs.append(collapse_ws(" ".join(current)))
            current = []
        elif line:
            current.append(line)
    if current:
        paragraphs.append(collapse_ws(" ".join(current)))
    return tuple(p for p in paragraphs if p)


def parse_translation(text: str, lang: str) -> dict[str, Description]:
    """Parse a ``Translation-{lang}`` index into ``{Description-md5: Description}``.

    The first record for an md5 wins (index files list each description once; duplicates only
    appear when several suites are concatenated).
    """
    field = f"Description-{lang}:"
    out: dict[str, Description] = {}
    for record in text.split("\n\n"):
        package = md5 = synopsis = None
        cont: list[str] = []
        in_desc = False
        for line in record.split("\n"):
            if line.startswith((" ", "\t")):
                if in_desc:
                    cont.append(line)
                continue
            in_desc = False
            if line.startswith("Package:"):
                package = line[8:].strip()
            elif line.startswith("Description-md5:"):
                md5 = line[16:].strip()
            elif line.startswith(field):
                synopsis = collapse_ws(line[len(field) :])
                in_desc = True
        if package and md5 and synopsis is not None and md5 not in out:
            out[md5] = Description(package, md5, synopsis, long_description_paragraphs(cont))
    return out


def join_translations(
    src: dict[str, Description], tgt: dict[str, Description], dropped: dict[str, int] | None = None
) -> list[tuple[str, str, str]]:
    """``(package, src text, tgt text)`` pairs for descriptions translated in both languages.

    The synopsis always pairs; long-description paragraphs pair one-to-one only when both sides
    have the same number of paragraphs (otherwise the paragraph alignment is unknown). Repeated
    pairs (shared boilerplate) are kept once, at their first package in md5-sorted order. Reasons
    for dropping are counted in ``dropped`` if given.
    """
    dropped = {} if dropped is None else dropped
    for reason in ("paragraph_count_mismatch", "repeated", "untranslated"):
        dropped.setdefault(reason, 0)
    seen: set[tuple[str, str]] = set()
    pairs: list[tuple[str, str, str]] = []
    for md5 in sorted(src.keys() & tgt.keys()):
        s, t = src[md5], tgt[md5]
        units = [(s.synopsis, t.synopsis)]
        if len(s.paragraphs) == len(t.paragraphs):
            units.extend(zip(s.paragraphs, t.paragraphs, strict=True))
        else:
            dropped["paragraph_count_mismatch"] += len(t.paragraphs)
        for a, b in units:
            if not a or not b or a == b:
                dropped["untranslated"] += 1
            elif (a, b) in seen:
                dropped["repeated"] += 1
            else:
                seen.add((a, b))
                pairs.append((t.package, a, b))
    return pairs


def parse_source_map(packages_text: str) -> dict[str, str]:
    """Binary package → source package from an apt ``Packages`` index.

    Binaries without a ``Source:`` field are their own source. ``Source: foo (1.2-3)`` carries
    a version when it differs from the binary's; the version is dropped.
    """
    mapping: dict[str, str] = {}
    package = None
    for line in packages_text.split("\n"):
        if line.startswith("Package: "):
            package = line[9:].strip()
            mapping.setdefault(package, package)
        elif line.startswith("Source: ") and package is not None:
            mapping[package] = line[8:].split(" ", 1)[0].strip()
    return mapping


_PREFIXES = (
    "python3-", "python-", "pypy3-", "pypy-", "ruby-", "node-", "golang-github-", "golang-",
    "r-cran-", "r-bioc-", "r-other-", "php-", "lua-", "elpa-", "gir1.2-", "ocaml-", "libghc-",
    "ghc-", "haskell-", "perl-", "fonts-", "xfonts-", "lib",
)  # fmt: skip
_SUFFIXES = (
    "-dev", "-doc", "-docs", "-data", "-common", "-dbg", "-dbgsym", "-bin", "-utils", "-tools",
    "-perl", "-java", "-jni", "-cil", "-examples", "-tests", "-test", "-runtime", "-plugins",
    "-plugin", "-headers", "-source", "-src", "-l10n", "-i18n", "-locales", "-extra", "-extras",
    "-core", "-gui", "-cli", "-server", "-client", "-static", "-all", "-dummy", "-base",
)  # fmt: skip
_VERSION_TAIL = re.compile(r"[-.]?\d+(?:[.\-+]\d+)*[a-z]?$")


def family_key(name: str) -> str:
    """Package family: the name with language/library prefixes, role suffixes and soname or
    version tails removed, so libfoo1, libfoo-dev, foo-doc and python3-foo all map to "foo".

    Over-merging only makes split groups coarser (harmless); under-merging would let shared
    boilerplate leak between train and test, so the rules err towards merging.
    """
    key = name.lower()
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if (
                key.startswith(prefix)
                and len(key) > len(prefix) + 1
                and not (prefix == "lib" and key.startswith("libre"))
            ):
                key = key[len(prefix) :]
                changed = True
                break
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix) + 1:
                key = key[: -len(suffix)]
                changed = True
                break
        tail = _VERSION_TAIL.search(key)
        if tail and tail.start() >= 2:
            key = key[: tail.start()]
            changed = True
    return key
