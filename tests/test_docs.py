"""The documentation stays true to the repository: README.md lists every entry of conf/model/ in its entry table,
stays short enough to read in five minutes, and every relative link in it and in the docs beside the code (every
*.md under zoo/, export/, serve/ and results/) resolves to a file of the repository. Text only: no imports of
the package, well under a second."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_MAX_LINES = 250
DOC_DIRS = ("zoo", "export", "serve", "results")

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, …


def doc_files() -> list[Path]:
    files = [README]
    for top in DOC_DIRS:
        files += sorted(p for p in (REPO / top).rglob("*.md") if ".venv" not in p.parts)
    return files


def relative_links(text: str) -> list[str]:
    """Targets of the inline and reference links of a markdown text that point into the repository: code blocks
    and code spans are not links, external URLs and same-page anchors are left out, an anchor is cut off."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)
    return [t.split("#", 1)[0] for t in targets if not EXTERNAL.match(t) and not t.startswith("#")]


def test_link_finder() -> None:
    text = (
        '[a](zoo/README.md) ![img](x/y.png "title") [b](https://example.com) [c](#anchor) [d](e.md#part)\n'
        "`[not](a-link.md)`\n```sh\n[nor](this.md)\n```\n[ref]: ../other.md\n"
    )
    assert relative_links(text) == ["zoo/README.md", "x/y.png", "e.md", "../other.md"]


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_to_files_of_the_repository(doc: Path) -> None:
    broken = []
    for target in relative_links(doc.read_text(encoding="utf-8")):
        path = (REPO / target.lstrip("/")) if target.startswith("/") else (doc.parent / target)
        path = path.resolve()
        if not path.is_relative_to(REPO) or not path.is_file():
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: links to no file of the repository: {broken}"


def entry_table_keys(text: str) -> list[str]:
    """The first column of README.md's entry table (the table whose header starts `| key | paper |`)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"^\|\s*key\s*\|\s*paper\s*\|", line)), None)
    assert start is not None, "README.md has no entry table (a header line starting `| key | paper |`)"
    keys = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5 and all(cells), f"an entry row needs 5 filled cells: {line}"
        match = re.fullmatch(r"`([a-z0-9_]+)`", cells[0])
        assert match, f"the first cell names the entry key in backticks: {line}"
        keys.append(match.group(1))
    return keys


def test_readme_entry_table_lists_every_entry() -> None:
    keys = entry_table_keys(README.read_text(encoding="utf-8"))
    entries = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))
    assert len(keys) == len(set(keys)), f"entries listed twice: {sorted(k for k in set(keys) if keys.count(k) > 1)}"
    missing, extra = sorted(set(entries) - set(keys)), sorted(set(keys) - set(entries))
    assert not missing and not extra, (
        f"README.md's entry table differs from conf/model/*.yaml: add rows for {missing}, remove rows for {extra}"
    )


def test_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): reference goes beside its code, readings beside "
        "their tables in results/<suite>/README.md"
    )
