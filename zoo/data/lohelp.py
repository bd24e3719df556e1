"""Paragraph pairs from the LibreOffice help (``libreoffice-help-de`` + ``libreoffice-help-en-us``).

Every help page exists once per language under the same relative path, and each paragraph or
heading carries the same element id (``par_id…``, ``hd_id…``) in every language, so pairs
align exactly without any sentence aligner. Works on the source ``.xhp`` XML pages and on the
compiled ``.html`` pages that the Debian packages actually ship (LibreOffice ≥ 6).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from zoo.data.text import collapse_ws, normalize_for_dedup

HELP_PACKAGES = ("libreoffice-help-de", "libreoffice-help-en-us")
HELP_ROOT = "usr/share/libreoffice/help"
PAGE_SUFFIXES = (".xhp", ".html")

# A paragraph-like element with an alignable id. These elements never nest in the help pages.
_PARAGRAPH = re.compile(
    r'<(p|h[1-6]|paragraph|title)\b([^>]*?)\bid="((?:par|hd)_id[^"]*)"([^>]*)>(.*?)</\1\s*>',
    re.DOTALL,
)
_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)([^>]*?)(/?)>|<!--.*?-->", re.DOTALL)
_VOID = frozenset({"br", "img", "input", "meta", "link", "hr", "wbr", "embedvar", "image"})
# XHP elements whose text is not shown as running text: editor comments, index keywords, and the
# non-default cases of application switches (we keep <defaultinline>).
_SKIP_XHP = frozenset({"comment", "bookmark_value", "caseinline", "case", "embedvar"})


def _skipped(name: str, attrs: str) -> bool:
    """Whether an element's text is invisible in the default rendering.

    Compiled HTML marks every case of an application switch ``hidden`` and gives the default
    case an id starting with ``default``; keeping only that case avoids text like
    "LibreOffice - Preferences Tools - Options" made of all alternatives.
    """
    if name in _SKIP_XHP:
        return True
    if re.search(r"\bhidden\b", attrs):
        return not re.search(r'\bid="default', attrs)
    return 'visibility="hidden"' in attrs


def element_text(inner: str) -> str:
    """Visible text of an element's inner markup, entities decoded and whitespace collapsed."""
    out: list[str] = []
    stack: list[tuple[str, bool]] = []  # (tag name, skipping)
    skipping = False
    pos = 0
    for m in _TAG.finditer(inner):
        if not skipping:
            out.append(inner[pos : m.start()])
        pos = m.end()
        if m.group(2) is None:  # comment
            continue
        closing, name, attrs, selfclose = m.group(1), m.group(2).lower(), m.group(3), m.group(4)
        if closing:
            while stack:
                top, was_skipping = stack.pop()
                if top == name:
                    skipping = was_skipping
                    break
            continue
        if selfclose or name in _VOID:
            if name == "br" and not skipping:
                out.append(" ")
            continue
        stack.append((name, skipping))
        skipping = skipping or _skipped(name, attrs)
    if not skipping:
        out.append(inner[pos:])
    return collapse_ws(html.unescape("".join(out)))


def page_paragraphs(markup: str) -> dict[str, str]:
    """Map element id → visible text for one help page (first occurrence of an id wins)."""
    paragraphs: dict[str, str] = {}
    for m in _PARAGRAPH.finditer(markup):
        pid = m.group(3)
        if pid in paragraphs:
            continue
        text = element_text(m.group(5))
        if text:
            paragraphs[pid] = text
    return paragraphs


def _pages(lang_root: Path) -> dict[str, Path]:
    return {
        p.relative_to(lang_root).as_posix(): p
        for p in lang_root.rglob("*")
        if p.suffix in PAGE_SUFFIXES and p.is_file()
    }


def align_pages(
    src_root: Path, tgt_root: Path, dropped: dict[str, int] | None = None
) -> Iterator[tuple[str, str, str]]:
    """Yield ``(relative page path, src text, tgt text)`` for every id present in both languages.

    Pages are visited in sorted path order so the output is deterministic. Identical pairs
    (untranslated paragraphs, after dedup normalisation) and repeated pairs are dropped and
    counted in ``dropped`` if given.
    """
    dropped = {} if dropped is None else dropped
    for reason in ("untranslated", "repeated", "unpaired"):
        dropped.setdefault(reason, 0)
    src_pages, tgt_pages = _pages(src_root), _pages(tgt_root)
    seen: set[tuple[str, str]] = set()
    common = sorted(src_pages.keys() & tgt_pages.keys())
    # ~2.5k page pairs take a few seconds: show progress only if it drags on (delay) on a TTY.
    for rel in tqdm(common, desc="LibreOffice help", unit="page", delay=5, disable=None, leave=False):
        src_pars = page_paragraphs(src_pages[rel].read_text(encoding="utf-8", errors="replace"))
        tgt_pars = page_paragraphs(tgt_pages[rel].read_text(encoding="utf-8", errors="replace"))
        for pid, tgt in tgt_pars.items():
            src = src_pars.get(pid)
            if src is None:
                dropped["unpaired"] += 1
            elif (src, tgt) in seen:
                dropped["repeated"] += 1
            elif normalize_for_dedup(src) == normalize_for_dedup(tgt):
                seen.add((src, tgt))
                dropped["untranslated"] += 1
            else:
                seen.add((src, tgt))
                yield rel, src, tgt


def read_libreoffice_help(
    de_package: Path, en_package: Path, dropped: dict[str, int] | None = None
) -> list[tuple[str, str, str]]:
    """Aligned (page, German, English) triples from the two extracted help packages."""
    return list(align_pages(de_package / HELP_ROOT / "de", en_package / HELP_ROOT / "en-US", dropped))
