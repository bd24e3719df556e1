"""Markup → plain prose: Markdown, reStructuredText and Org READMEs, Perl POD sections.

The long-document corpus (``longsumm``) reads upstream documentation shipped inside Debian packages. A model
should see prose, not markup, so every converter here keeps running text and drops what is not prose: code (fenced,
indented, literal blocks, POD verbatim paragraphs), tables, images and badges, directive blocks, link targets and
bare URLs, headings (marked ones, and in READMEs a paragraph of at most five words that does not end like a
sentence: plain-text READMEs mark headings by layout only). Each returns a list of paragraphs of collapsed
whitespace; the caller joins them. The rules are deliberately simple (line-based, no full parser): the corpus
statistics measure what comes out.
"""

from __future__ import annotations

import re

from zoo.data.text import collapse_ws

_URL = re.compile(r"<?\bhttps?://[^\s<>)\]]+>?")
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_HTML_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_HTML_ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"', "&#39;": "'", "&nbsp;": " "}
_PUNCT_LINE = re.compile(r"^\s*([=\-~^\"'`#*+_:.<>])\1{2,}\s*$")  # rst adornment, md setext underline, rules


def _finish(paragraphs: list[str], headings: bool = False) -> list[str]:
    """Collapse whitespace, drop empty paragraphs and ones left with no letters; with ``headings``, also a
    paragraph of at most 5 words not ending like a sentence (a plain-text heading: "Installation", "AUTHORS")."""
    out = []
    for p in paragraphs:
        p = collapse_ws(p)
        if not p or not re.search(r"[A-Za-z]", p):
            continue
        if headings and len(p.split()) <= 5 and not p.endswith((".", "!", "?", ":", ";", ",", ")")):
            continue
        out.append(p)
    return out


def _blocks(text: str) -> list[list[str]]:
    """Blank-line separated blocks of lines (tabs expanded, trailing space stripped)."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for raw in text.expandtabs(4).split("\n"):
        line = raw.rstrip()
        if line:
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _html(text: str) -> str:
    text = _HTML_COMMENT.sub(" ", text)
    text = re.sub(r"<img\b[^>]*>", " ", text, flags=re.IGNORECASE)
    text = _HTML_TAG.sub(" ", text)
    for entity, char in _HTML_ENTITIES.items():
        text = text.replace(entity, char)
    return text


# -------------------------------------------------------------------------------------------- Markdown
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)|!\[[^\]]*\]\[[^\]]*\]")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)|\[([^\]]+)\]\[[^\]]*\]")
_MD_REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*\S+")
_MD_LIST = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_MD_TABLE_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?$")
_MD_LINK_ONLY_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\[[^\]]*\]\([^)]*\)\s*$")  # a table-of-contents entry
_MD_EMPHASIS = re.compile(r"(\*\*|__|\*|_|~~)(?=\S)(.+?)(?<=\S)\1")


def _md_inline(line: str) -> str:
    line = _MD_IMAGE.sub(" ", line)
    for _ in range(2):  # a badge is an image inside a link: [![alt](img)](target)
        line = _MD_LINK.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), line)
    line = _URL.sub(" ", line)
    line = line.replace("`", "")
    line = _MD_EMPHASIS.sub(r"\2", line)
    return line


def markdown_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a Markdown document: fenced and indented code, tables, headings, HTML images, link
    targets, bare URLs and list items that are only a link (tables of contents) dropped; emphasis and list markers
    stripped; link texts kept."""
    text = _HTML_COMMENT.sub("\n", text)
    kept: list[str] = []
    fence: str | None = None
    for raw in text.split("\n"):
        stripped = raw.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            kept.append("")
            continue
        marker = re.match(r"^(`{3,}|~{3,})", stripped)
        if marker:
            fence = marker.group(1)
            kept.append("")
            continue
        kept.append(raw)
    paragraphs: list[str] = []
    for block in _blocks("\n".join(kept)):
        if all(_indent(line) >= 4 for line in block) and not _MD_LIST.match(block[0]):
            continue  # indented code
        table = any(_MD_TABLE_RULE.match(line.strip()) for line in block)
        lines: list[str] = []
        for i, line in enumerate(block):
            s = line.strip()
            if s.startswith("#") or _MD_REFDEF.match(s) or s.startswith("|") or _PUNCT_LINE.match(s):
                continue
            if (table and "|" in s) or _MD_LINK_ONLY_ITEM.match(s):
                continue
            if i + 1 < len(block) and re.match(r"^\s*(=+|-+)\s*$", block[i + 1]):
                continue  # setext heading text
            if s.startswith(">"):
                s = s.lstrip("> ")
            s = _MD_LIST.sub("", s)
            lines.append(s)
        if lines:  # inline markup after joining: a link's text or target may span lines
            paragraphs.append(_md_inline(_html(" ".join(lines))))
    return _finish(paragraphs, headings=True)


# ------------------------------------------------------------------------------------ reStructuredText
_RST_ROLE = re.compile(r":[\w:+-]+:`([^`]*)`")
_RST_REF = re.compile(r"`([^`<]*?)\s*(?:<[^`>]*>)?`__?")
_RST_LITERAL = re.compile(r"``(.*?)``")
_RST_SUBST = re.compile(r"\|[^|\s][^|]*\|_{0,2}")
_RST_TARGET_NAME = re.compile(r"(?<=\w)__?(?=\W|$)")
_RST_LIST = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|#\.|\(?[a-z0-9]\))\s+")
_RST_EMPHASIS = re.compile(r"(\*\*|\*)(?=\S)(.+?)(?<=\S)\1")


def _rst_inline(line: str) -> str:
    line = _RST_ROLE.sub(lambda m: re.sub(r"\s*<[^>]*>$", "", m.group(1)), line)
    line = _RST_LITERAL.sub(r"\1", line)
    line = _RST_REF.sub(r"\1", line)
    line = _RST_SUBST.sub(" ", line)
    line = _URL.sub(" ", line)
    line = _RST_EMPHASIS.sub(r"\2", line)
    line = _RST_TARGET_NAME.sub("", line)
    return line


def rst_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a reStructuredText document: section titles and adornments, directive and comment
    blocks (``.. image::``, ``.. code-block::``, ``.. _target:``), literal blocks after ``::``, tables and
    substitutions dropped; roles, literals and references reduced to their text."""
    lines = text.expandtabs(4).split("\n")
    paragraphs: list[str] = []
    current: list[str] = []
    skip_deeper: int | None = None  # drop lines indented more than this (directive/literal block body)
    literal_next = False

    def flush() -> None:
        nonlocal current
        if current:
            paragraphs.append(_rst_inline(_html(" ".join(current))))
        current = []

    for i, raw in enumerate(lines):
        line = raw.rstrip()
        s = line.strip()
        if skip_deeper is not None:
            if not s or _indent(line) > skip_deeper:
                continue
            skip_deeper = None
        if not s:
            flush()
            continue
        if literal_next and _indent(line) > 0:
            skip_deeper = _indent(line) - 1
            literal_next = False
            continue
        literal_next = False
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if _PUNCT_LINE.match(s) or (nxt and _PUNCT_LINE.match(nxt) and len(nxt) >= len(s) * 0.6):
            flush()  # an adornment or the title it underlines
            continue
        if s.startswith(".."):
            flush()
            skip_deeper = _indent(line)
            continue
        if s.startswith(("+-", "+=", "|")) or re.match(r"^=+(\s+=+)+$", s):
            flush()  # grid/simple tables, line blocks
            continue
        if s.startswith(":") and re.match(r"^:[\w -]+:(\s|$)", s):
            flush()  # field list (:target:, :alt:, :Author:)
            continue
        if s.endswith("::"):
            literal_next = True
            s = s[:-2].rstrip()
            s = s + ":" if s and not s.endswith(":") else s
        if s.startswith(">>>"):
            continue
        s = _RST_LIST.sub("", s)
        current.append(s)
    flush()
    return _finish(paragraphs, headings=True)


# -------------------------------------------------------------------------------------------- Org mode
_ORG_LINK = re.compile(r"\[\[([^\]]*)\](?:\[([^\]]*)\])?\]")
_ORG_EMPHASIS = re.compile(r"(?<![\w*/=~+])([*/=~+])(?=\S)([^*/=~+\n]+?)(?<=\S)\1(?![\w*/=~+])")
_ORG_LIST = re.compile(r"^\s*(?:[-+]|\d+[.)])\s+(?:\[[ X-]\]\s+)?")


def _org_inline(text: str) -> str:
    text = _ORG_LINK.sub(lambda m: m.group(2) or "", text)
    text = _URL.sub(" ", text)
    return _ORG_EMPHASIS.sub(r"\2", text)


def org_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of an Org-mode document (Emacs packages' ``README.org``): headlines, ``#+KEYWORD`` lines,
    ``#+BEGIN_…``/``#+END_…`` blocks, ``:PROPERTIES:`` drawers, tables and ``:`` example lines dropped; links reduced
    to their description, emphasis markers stripped."""
    paragraphs: list[str] = []
    current: list[str] = []
    block: str | None = None
    drawer = False

    def flush() -> None:
        nonlocal current
        if current:
            paragraphs.append(_org_inline(" ".join(current)))
        current = []

    for raw in text.split("\n"):
        s = raw.strip()
        upper = s.upper()
        if block is not None:
            if upper.startswith("#+END_"):
                block = None
            continue
        if upper.startswith("#+BEGIN_"):
            flush()
            block = upper
            continue
        if drawer:
            drawer = upper != ":END:"
            continue
        if re.fullmatch(r":[A-Z_]+:", upper):
            drawer = upper != ":END:"
            continue
        if not s:
            flush()
        elif re.match(r"^\*+\s", raw) or s.startswith(("#", "|", ": ")) or s == ":" or _PUNCT_LINE.match(s):
            flush()
        else:
            current.append(_ORG_LIST.sub("", s))
    flush()
    return _finish(paragraphs, headings=True)


# ---------------------------------------------------------------------------------------------- POD
_POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}


def pod_inline(text: str) -> str:
    """POD formatting codes reduced to their text: ``B<x>``, ``I<x>``, ``C<< x >>`` → x, ``L<text|target>`` →
    text, ``L<Foo::Bar/"sec">`` → Foo::Bar, ``E<gt>`` → >, ``X<>``/``Z<>`` → nothing; nested codes too."""
    pattern = re.compile(r"([A-Z])(<{2,}\s)(.*?)(\s>{2,})|([A-Z])<([^<>]*)>", re.DOTALL)

    def repl(m: re.Match[str]) -> str:
        code, body = (m.group(1), m.group(3)) if m.group(1) else (m.group(5), m.group(6))
        if code in "XZ":
            return ""
        if code == "E":
            name = body.strip()
            if name.isdigit():
                return chr(int(name))
            if name.lower().startswith("0x"):
                return chr(int(name, 16))
            return _POD_ESCAPES.get(name, "")
        if code == "L":
            if "|" in body:
                return body.split("|", 1)[0]
            if re.match(r"^\w+:[^:\s]\S*$", body):
                return ""  # a bare URL
            return body.split("/", 1)[0].strip('"') or body.split("/", 1)[-1].strip('"')
        return body

    previous = None
    while previous != text:
        previous, text = text, pattern.sub(repl, text)
    return text


def pod_sections(text: str) -> dict[str, list[str]]:
    """``{=head1 title (upper case): its paragraphs}`` of the POD in a Perl module or .pod file.

    Only POD is read (from a ``=command`` at the start of a paragraph to ``=cut``). Verbatim (indented)
    paragraphs, ``=begin``/``=end`` and ``=for`` blocks, ``=over``/``=back`` and lower headings are dropped; an
    ``=item`` keeps its label unless it is a bullet or a number. The first ``=head1`` of a title wins.
    """
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_pod = False
    skipping_begin = False
    for block in _blocks(text.replace("\r\n", "\n")):
        first = block[0]
        if not in_pod:
            if re.match(r"^=[a-zA-Z]", first) and not first.startswith("=cut"):
                in_pod = True
            else:
                continue
        if first.startswith("=cut"):
            in_pod = False
            continue
        if skipping_begin:
            if first.startswith("=end"):
                skipping_begin = False
            continue
        if first.startswith("="):
            command, _, rest = " ".join(block).partition(" ")
            if command == "=head1":
                title = collapse_ws(pod_inline(rest)).upper()
                current = sections.setdefault(title, []) if title not in sections else None
            elif command == "=begin":
                skipping_begin = True
            elif command == "=item" and current is not None:
                label = rest.strip()
                if label and label not in ("*", "-") and not re.fullmatch(r"\d+\.?", label):
                    current.append(pod_inline(label))
            continue
        if current is None or first.startswith((" ", "\t")):
            continue  # outside a kept section, or verbatim
        current.append(pod_inline(" ".join(line.strip() for line in block)))
    return {title: _finish(paragraphs) for title, paragraphs in sections.items()}
