"""Tests of `data=longsumm`: markup → prose (Markdown, reStructuredText, Org, POD), which file of a package is its
upstream document (Python METADATA, README, Perl POD), reading members of real `.deb` files (built here with
dpkg-deb), and the corpus rules end to end on a small constructed archive: boilerplate out of the summaries,
packages chosen from the index before any download, the filters, and a deterministic split that keeps a source
family on one side. Offline and a few seconds; the real corpus is checked only where it was already built."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from zoo.data import build_splits
from zoo.data.cache import resolve_cache_dir
from zoo.data.debian import read_deb_members
from zoo.data.longsumm import (
    LONGSUMM_DEFAULTS,
    IndexEntry,
    build_longsumm,
    cut_words,
    lead_copy,
    package_group,
    parse_packages,
    sentences,
    stopword_share,
)
from zoo.data.markup import markdown_paragraphs, org_paragraphs, pod_inline, pod_sections, rst_paragraphs
from zoo.data.upstream import metadata_paragraphs, perl_document, upstream_document, wanted_member

REPO = Path(__file__).resolve().parent.parent
NEEDS_DPKG = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")

# ------------------------------------------------------------------------------------------ markup → prose

MARKDOWN = """# Widget

[![Build](https://ci.example.org/badge.svg)](https://ci.example.org) ![logo](logo.png)

Widget is a **small** library for
[drawing](https://example.org/draw
"title") widgets. It is `fast`.

- [Install](#install)
- [Usage](#usage)

```python
import widget
```

| a | b |
|---|---|
| 1 | 2 |

    indented = "code"

* Supports <b>HTML</b> tags, see <https://example.org>.
Setext
------
Done.

Installation
"""

RST = """======
Widget
======

.. image:: https://ci.example.org/badge.svg
   :target: https://ci.example.org

Widget is a *small* library for `drawing <https://example.org>`_
widgets, see :func:`widget.draw` and ``Widget()``. |badge|

Usage
-----

Install it::

    pip install widget

.. code-block:: python

    import widget

+---+---+
| a | b |
+---+---+

It also reads `the docs`_.

.. _the docs: https://example.org/docs
"""

ORG = """#+TITLE: Widget
* Widget
Widget is a *small* package for [[https://gnu.org/emacs][Emacs]] users;
see [[https://example.org]] for more.
#+BEGIN_SRC emacs-lisp
(require 'widget)
#+END_SRC
:PROPERTIES:
:ID: 42
:END:
- It draws /widgets/ with =widget-draw=.
| a | b |
"""

POD = """package Foo::Bar;
use strict;
our $VERSION = '1.0';
1;
__END__

=encoding utf8

=head1 NAME

Foo::Bar - frobnicate widgets

=head1 SYNOPSIS

  use Foo::Bar;
  my $x = Foo::Bar->new;

=head1 DESCRIPTION

B<Foo::Bar> frobnicates I<widgets> with C<< $x->frob >> and
L<the manual|Foo::Manual> (see L<Baz::Qux/"METHODS"> and L<https://example.org>), E<lt>fastE<gt>.

=over 4

=item *

First point.

=item frob

Frobs.

=back

=begin html

<p>ignored</p>

=end html

=for comment ignored too

=head2 Details

  verbatim code

More words.

=cut

sub frob { 1 }

=head1 AUTHOR

Someone

=cut
"""


def test_markdown_keeps_prose_and_drops_markup() -> None:
    assert markdown_paragraphs(MARKDOWN) == [
        "Widget is a small library for drawing widgets. It is fast.",
        "Supports HTML tags, see . Done.",
    ]


def test_rst_keeps_prose_and_drops_markup() -> None:
    assert rst_paragraphs(RST) == [
        "Widget is a small library for drawing widgets, see widget.draw and Widget().",
        "Install it:",
        "It also reads the docs.",
    ]


def test_org_keeps_prose_and_drops_markup() -> None:
    assert org_paragraphs(ORG) == [
        "Widget is a small package for Emacs users; see for more.",
        "It draws widgets with widget-draw.",
    ]


def test_pod_sections_and_formatting_codes() -> None:
    sections = pod_sections(POD)
    assert sections["NAME"] == ["Foo::Bar - frobnicate widgets"]
    assert sections["SYNOPSIS"] == []  # verbatim only
    assert sections["DESCRIPTION"] == [
        "Foo::Bar frobnicates widgets with $x->frob and the manual (see Baz::Qux and ), <fast>.",
        "First point.",
        "frob",
        "Frobs.",
        "More words.",
    ]
    assert sections["AUTHOR"] == ["Someone"]
    assert pod_inline('L</"Section"> E<0x41>E<66> X<index>Z<>S<a b>') == "Section AB a b"


# ------------------------------------------------------------------------------- which file is the document

METADATA = """Metadata-Version: 2.1
Name: widget
Version: 1.0
Summary: Draw widgets
Description-Content-Type: text/markdown

# Widget

Widget draws **widgets**.
"""

OLD_PKG_INFO = "\n".join(  # older setuptools fold the long description into the header, 8 spaces deep
    ["Metadata-Version: 1.1", "Name: widget", "Description: Widget", " " * 8 + "======", " " * 8]
    + [" " * 8 + "Widget draws *widgets* quickly.", " " * 8, "Platform: UNKNOWN", ""]
)


def test_python_metadata_long_description() -> None:
    assert metadata_paragraphs(METADATA) == ["Widget draws widgets."]
    assert metadata_paragraphs(OLD_PKG_INFO) == ["Widget draws widgets quickly."]


@pytest.mark.parametrize(
    ("package", "path", "wanted"),
    [
        ("python3-widget", "usr/share/doc/python3-widget/README.rst.gz", True),
        ("python3-widget", "usr/share/doc/python3-widget/README", True),
        ("python3-widget", "usr/share/doc/python3-widget/README.Debian", False),  # the maintainer's, not upstream's
        ("python3-widget", "usr/share/doc/python3-widget/README.source", False),
        ("python3-widget", "usr/share/doc/other/README.md", False),
        ("python3-widget", "usr/share/doc/python3-widget/examples/README.md", False),
        ("python3-widget", "usr/lib/python3/dist-packages/widget-1.0.dist-info/METADATA", True),
        ("python3-widget", "usr/lib/python3/dist-packages/widget-1.0.egg-info/PKG-INFO", True),
        ("node-widget", "usr/share/nodejs/widget/README.md", True),
        ("node-widget", "usr/share/nodejs/@scope/widget/README.md", True),
        ("node-widget", "usr/share/nodejs/widget/lib/README.md", False),
        ("libfoo-bar-perl", "usr/share/perl5/Foo/Bar.pm", True),
        ("libfoo-bar-perl", "usr/lib/x86_64-linux-gnu/perl5/5.36/Foo/Bar.pm", True),
        ("libfoo-bar-perl", "usr/share/doc/libfoo-bar-perl/README", False),  # a Perl module's document is its POD
    ],
)
def test_wanted_members(package: str, path: str, wanted: bool) -> None:
    assert wanted_member(package, path) is wanted


def _pod(description: str) -> bytes:
    return f"=head1 NAME\n\nX - y\n\n=head1 DESCRIPTION\n\n{description}\n\n=cut\n".encode()


def test_perl_document_is_the_main_modules_description() -> None:
    members = {"usr/share/perl5/Foo.pm": _pod("The parent."), "usr/share/perl5/Foo/Bar.pm": _pod("The module.")}
    assert perl_document("libfoo-bar-perl", members).paragraphs == ("The module.",)  # type: ignore[union-attr]
    assert perl_document("libother-perl", members).member == "usr/share/perl5/Foo.pm"  # type: ignore[union-attr]
    assert perl_document("libfoo-perl", {"usr/share/perl5/Foo.pm": b"package Foo; 1;"}) is None


def test_the_longest_readme_or_long_description_is_the_document() -> None:
    readme = "Widget draws widgets. " * 5
    members = {
        "usr/lib/python3/dist-packages/widget-1.0.dist-info/METADATA": METADATA.encode(),
        "usr/share/doc/python3-widget/README.rst.gz": gzip.compress(readme.encode()),
    }
    doc = upstream_document("python3-widget", members)
    assert doc is not None and doc.member.endswith("README.rst.gz") and doc.words == 15
    latin1 = {"usr/share/doc/tool/README": "Café au lait, à la carte.".encode("latin-1")}
    assert upstream_document("tool", latin1).text == "Café au lait, à la carte."  # type: ignore[union-attr]
    assert upstream_document("tool", {}) is None


# -------------------------------------------------------------------------------------------- small helpers


def test_sentences_copy_cut_and_english() -> None:
    assert sentences('It draws. "It is fast." 2 modes exist! e.g. here') == [
        "It draws.",
        '"It is fast."',
        "2 modes exist! e.g. here",
    ]
    doc = "Widget draws widgets fast. It has many options and a small core. " * 3
    assert lead_copy(doc, "Widget draws widgets fast. It has many options.") == 1.0
    assert lead_copy(doc, "A tool to render gadgets on screens quickly.") < 0.2
    assert cut_words("a b c. d e f g h", 6) == "a b c. d e f"  # no sentence end in the last third: a hard cut
    assert cut_words("a b c d e. f g h", 6) == "a b c d e."
    assert stopword_share("The widget is a library for the web.") > 0.4
    assert stopword_share("Das Widget ist eine Bibliothek für Webseiten.") < 0.1


PACKAGES_SAMPLE = """Package: python3-widget
Source: widget (1.0-2)
Version: 1.0-2+b1
Section: python
Size: 12345
Description-md5: aaa

Package: widget
Section: contrib/utils
Size: 99
Description-md5: bbb
"""


def test_index_entries_and_groups() -> None:
    entries = parse_packages(PACKAGES_SAMPLE)
    assert entries == [
        IndexEntry("python3-widget", "widget", "python", 12345, "aaa"),
        IndexEntry("widget", "widget", "utils", 99, "bbb"),
    ]

    def group(name: str, section: str = "utils") -> str | None:
        return package_group(IndexEntry(name, name, section, 1, ""))

    assert [group(n) for n in ("python3-x", "libx-y-perl", "node-x", "ruby-x", "elpa-x", "xtool")] == [
        "python",
        "perl",
        "node",
        "ruby",
        "elpa",
        "programs",
    ]
    assert group("python3-x-doc") is None and group("libx1") is None and group("xtool", "libs") is None
    assert group("golang-github-x-dev") is None and group("fonts-x") is None


# ------------------------------------------------------------------------------ the corpus, end to end

BOILERPLATE = "This package contains the Python 3 version of the library."


def _deb(work: Path, name: str, files: dict[str, bytes]) -> Path:
    """A real binary package built by dpkg-deb, holding `files`."""
    root = work / "src" / name
    (root / "DEBIAN").mkdir(parents=True)
    control = f"Package: {name}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: T <t@example.org>\nDescription: t\n t\n"
    (root / "DEBIAN" / "control").write_text(control)
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    out = work / "debs" / f"{name}.deb"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["dpkg-deb", "--root-owner-group", "-Znone", "-b", str(root), str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def _prose(topic: str, words: int) -> str:
    """`words` words of English: "The <topic> helps people." repeated."""
    sentence = f"The {topic} helps people. "
    return " ".join((sentence * words).split()[:words])


class LocalArchive:
    """Stands in for DebianArchive offline (no apt, no network): index texts built here and the .deb files built
    by dpkg-deb; records which packages the build asked to download."""

    def __init__(self, packages: str, translation: str, debs: dict[str, Path]) -> None:
        self.packages, self.translation, self.deb_files = packages, translation, debs
        self.requested: list[str] = []

    def packages_texts(self) -> list[str]:
        return [self.packages]

    def translation_texts(self, lang: str) -> list[str]:
        assert lang == "en"
        return [self.translation]

    def debs(self, names: list[str]) -> tuple[dict[str, Path], list[str]]:
        self.requested += names
        found = {n: self.deb_files[n] for n in names if n in self.deb_files}
        return found, [n for n in names if n not in found]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> LocalArchive:
    """12 source families of a Python module and its program (their own READMEs and descriptions, one shared
    boilerplate sentence), a Perl module, and one package for each filter."""
    work = tmp_path_factory.mktemp("longsumm")
    packages: list[str] = []
    translations: list[str] = []
    debs: dict[str, Path] = {}

    def add(name: str, source: str, description: list[str], files: dict[str, bytes], size: int = 5000) -> None:
        md5 = hashlib.md5(name.encode()).hexdigest()
        packages.append(f"Package: {name}\nSource: {source}\nSection: utils\nSize: {size}\nDescription-md5: {md5}\n")
        long = "\n .\n".join(" " + p for p in description)
        translations.append(f"Package: {name}\nDescription-md5: {md5}\nDescription-en: {name} synopsis\n{long}\n")
        debs[name] = _deb(work, name, files)

    for i in range(12):
        fam = "fam" + "".join(chr(97 + int(d)) for d in f"{i:02d}")  # letters: digits are stripped as versions
        metadata = f"Metadata-Version: 2.1\nName: {fam}\n\n{_prose(fam + ' module', 60)}\n"
        add(
            f"python3-{fam}",
            fam,
            [f"Module {fam} renders gadgets. It works well for {fam}.", BOILERPLATE],
            {f"usr/lib/python3/dist-packages/{fam}-1.0.dist-info/METADATA": metadata.encode()},
        )
        readme = f"# {fam}\n\n{_prose(fam + ' command', 70)}\n"
        files = {f"usr/share/doc/{fam}/README.md": readme.encode()}
        add(fam, fam, [f"Command {fam} prints gadgets. Use {fam} daily."], files)
    add("libfoo-bar-perl", "libfoo-bar-perl", ["Foo::Bar parses gadgets. It is quick."], {
        "usr/share/perl5/Foo/Bar.pm": _pod(_prose("Foo::Bar", 50))
    })  # fmt: skip
    add("onesentence", "onesentence", [f"Only one sentence here. {BOILERPLATE}"], {})  # never downloaded
    add("toolarge", "toolarge", ["Too big. Never fetched."], {}, size=10_000_000)
    add("noreadme", "noreadme", ["No readme. Nothing to pair."], {"usr/share/doc/noreadme/NEWS": b"news"})
    add("shortdoc", "shortdoc", ["Short doc. Too short."], {"usr/share/doc/shortdoc/README": b"Tiny tool."})
    german = " ".join(["Das Werkzeug zeichnet Bilder für Menschen."] * 10)
    add("german", "german", ["German doc. Not English."], {"usr/share/doc/german/README": german.encode()})
    lead = _prose("copycat", 60)  # the summary: its first 12 words and 2 more
    add("copycat", "copycat", [" ".join(lead.split()[:12]), "It copies."], {
        "usr/share/doc/copycat/README": lead.encode()
    })  # fmt: skip
    return LocalArchive("\n".join(packages), "\n".join(translations), debs)


CFG = {
    **LONGSUMM_DEFAULTS,
    "valid_size": 4,
    "test_size": 6,
    "min_doc_words": 20,
    "max_doc_words": 40,
    "boilerplate_families": 10,
}


@NEEDS_DPKG
def test_reading_members_of_a_real_deb(archive: LocalArchive) -> None:
    deb = archive.deb_files["python3-famaa"]
    members = read_deb_members(deb, lambda path: path.endswith("METADATA"))
    assert list(members) == ["usr/lib/python3/dist-packages/famaa-1.0.dist-info/METADATA"]
    assert read_deb_members(deb, lambda path: path.endswith("METADATA"), max_bytes=10) == {}


@NEEDS_DPKG
def test_the_corpus_rules_end_to_end(archive: LocalArchive) -> None:
    splits = build_longsumm(CFG, archive)  # type: ignore[arg-type]
    stats = splits.stats
    assert "onesentence" not in archive.requested and "toolarge" not in archive.requested  # chosen from the index
    assert stats["filtered"] == {
        "document_not_english": 1,
        "document_too_short": 1,
        "download_failed": 0,
        "no_upstream_document": 1,
        "package_too_large": 1,
        "summary_copies_document_start": 1,
        "summary_too_few_sentences": 1,
    }
    assert stats["parsed"] == {"python": 12, "perl": 1, "node": 0, "ruby": 0, "elpa": 0, "programs": 12}
    examples = [*splits.train, *splits.valid, *splits.test]
    assert len(examples) == 25 and not any(BOILERPLATE in ex.tgt for ex in examples)  # boilerplate removed
    assert all(20 <= len(ex.src.split()) <= 40 for ex in examples)  # cut at max_doc_words, at a sentence end
    assert all(ex.src.endswith(".") for ex in examples)
    assert stats["documents_before_cut"] == {"median_words": 60, "cut_at_max_doc_words": 25}
    assert stats["lengths"]["test"]["summary_sentences"]["two_or_more"] == len(splits.test)

    # a family's module and program stay on one side; the split is the same on every build
    side = {}
    for name in ("train", "valid", "test"):
        for ex in splits.split(name):
            family = ex.tgt.split()[1]
            assert side.setdefault(family, name) == name, f"{family} straddles {side[family]} and {name}"
    assert 5 <= len(splits.test) <= 8 and len(splits.valid) >= 2
    again = build_longsumm(CFG, archive)  # type: ignore[arg-type]
    assert [(ex.src, ex.tgt) for ex in again.test] == [(ex.src, ex.tgt) for ex in splits.test]
    assert [ex.tgt for ex in again.valid] == [ex.tgt for ex in splits.valid]


def test_the_data_config_selects_the_builder() -> None:
    node = OmegaConf.load(REPO / "conf" / "data" / "longsumm.yaml")
    assert node.kind == "longsumm" and node.task == "summarization"
    assert {k: node[k] for k in LONGSUMM_DEFAULTS} == {**LONGSUMM_DEFAULTS, "sources": list(node.sources)}


def test_the_built_corpus_where_it_exists() -> None:
    """The real corpus (≈640 MB of packages, minutes) is built only by `python -m zoo.corpus data=longsumm`;
    where it is in the cache, its statistics are the ones zoo/data/README.md states the shape of."""
    node = OmegaConf.load(REPO / "conf" / "data" / "longsumm.yaml")
    built = sorted((resolve_cache_dir(None) / "corpora").glob("longsumm-*/stats.json"))
    if not built:
        pytest.skip("no longsumm corpus in the cache; build it with python -m zoo.corpus data=longsumm")
    splits = build_splits(node)
    lengths = json.loads(Path(splits.stats["cache_dir"], "stats.json").read_text())["lengths"]
    assert lengths["test"]["document_words"]["median"] >= 200
    assert all(len(sentences(ex.tgt)) >= 2 for ex in splits.test)
    assert len(splits.train) > 3000 and len(splits.test) > 300
