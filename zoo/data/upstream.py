"""A Debian package's upstream documentation as plain prose: the long document of ``data=longsumm``.

Which file of a package is its upstream document:

* a Perl module package (``lib…-perl``): the ``DESCRIPTION`` section of the POD of its main module — the ``.pm`` /
  ``.pod`` whose path spells the package name (``libjifty-dbi-perl`` → ``Jifty/DBI.pm``), else the shallowest
  module that has a ``DESCRIPTION``;
* every other package: the longest (in words, as prose) of the upstream README in its documentation directory
  (``usr/share/doc/<package>/README``, ``README.md``, ``.rst``, ``.txt``, ``.markdown``, ``.org``, gzipped or not; never
  ``README.Debian`` or ``README.source``, which Debian maintainers write), a Node.js module's ``README.md`` beside
  its code, and a Python distribution's long description (``*.dist-info/METADATA``, ``*.egg-info/PKG-INFO``:
  the upstream README, as on PyPI).

:func:`wanted_member` says which members of a ``.deb`` to read at all (see ``read_deb_members``), and
:func:`upstream_document` picks and converts one of them (:mod:`zoo.data.markup`).
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from email.parser import HeaderParser

from zoo.data.markup import markdown_paragraphs, org_paragraphs, pod_sections, rst_paragraphs

_README = re.compile(r"readme(\.(md|markdown|rst|txt|org))?(\.gz)?", re.IGNORECASE)
_PYTHON_METADATA = re.compile(r"usr/lib/python3/dist-packages/[^/]+\.(dist-info/METADATA|egg-info/PKG-INFO|egg-info)")
_NODE_README = re.compile(r"usr/(share|lib)/nodejs/(@[^/]+/)?[^/@]+/" + _README.pattern, re.IGNORECASE)
_PERL_MODULE = re.compile(r"usr/(share/perl5|lib/[^/]+/perl5/[^/]+)/(.+)\.(pm|pod)")
_RST_HINT = re.compile(r"^\.\. [\w-]+::|^\.\. _|::\s*$|^`[^`]+`_", re.MULTILINE)


@dataclass(frozen=True)
class Document:
    """A package's upstream document as prose paragraphs, and the member it was read from."""

    paragraphs: tuple[str, ...]
    member: str

    @property
    def text(self) -> str:
        return " ".join(self.paragraphs)

    @property
    def words(self) -> int:
        return len(self.text.split())


def is_perl_module(package: str) -> bool:
    return package.startswith("lib") and package.endswith("-perl") and len(package) > len("lib-perl")


def wanted_member(package: str, path: str) -> bool:
    """Whether the ``.deb`` member at ``path`` may hold ``package``'s upstream document."""
    if is_perl_module(package):
        return bool(_PERL_MODULE.fullmatch(path))
    if path.startswith(f"usr/share/doc/{package}/"):
        return bool(_README.fullmatch(path[len(f"usr/share/doc/{package}/") :]))
    return bool(_PYTHON_METADATA.fullmatch(path) or _NODE_README.fullmatch(path))


def decode(raw: bytes, path: str) -> str:
    """Text of a member: gunzipped when its name ends in ``.gz``; UTF-8, else Latin-1 (old READMEs)."""
    if path.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            return ""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def readme_paragraphs(text: str, name: str) -> list[str]:
    """A README's prose by its file name: ``.rst`` as reStructuredText, ``.md``/``.markdown`` as Markdown,
    ``.org`` as Org; a bare ``README`` or ``.txt`` as reStructuredText when it has rst's marks (directives,
    targets, ``::`` literal blocks), else as Markdown (which keeps plain text as it is)."""
    lower = name.lower().removesuffix(".gz")
    if lower.endswith(".org"):
        return org_paragraphs(text)
    if lower.endswith(".rst") or (not lower.endswith((".md", ".markdown")) and _RST_HINT.search(text)):
        return rst_paragraphs(text)
    return markdown_paragraphs(text)


def metadata_paragraphs(text: str) -> list[str]:
    """The long description of a Python distribution's ``METADATA``/``PKG-INFO`` as prose: the message body
    (metadata 2.1+), else the folded ``Description`` header (older setuptools indent its lines by 8 spaces or
    ``|``); Markdown when ``Description-Content-Type`` says so, else reStructuredText (PEP 566's default)."""
    head, _, body = text.replace("\r\n", "\n").partition("\n\n")
    headers = HeaderParser().parsestr(head + "\n\n")
    if not body.strip():
        description = headers.get("Description", "")
        lines = description.split("\n")
        body = "\n".join([lines[0]] + [re.sub(r"^( {7}\||\s{8})", "", line) for line in lines[1:]])
    content_type = (headers.get("Description-Content-Type") or "").lower()
    return markdown_paragraphs(body) if "markdown" in content_type else rst_paragraphs(body)


def _perl_module_key(path: str) -> str:
    """``Jifty/DBI`` → ``jifty-dbi``: how Debian spells a module in its package name (``lib<key>-perl``)."""
    match = _PERL_MODULE.fullmatch(path)
    module = match.group(2) if match else path
    return module.lower().replace("/", "-").replace("_", "-")


def perl_document(package: str, members: dict[str, bytes]) -> Document | None:
    """The POD ``DESCRIPTION`` of the package's main module (see the module docstring)."""
    key = package[len("lib") : -len("-perl")]
    paths = sorted(members, key=lambda p: (_perl_module_key(p) != key, p.count("/"), p))
    for path in paths:
        description = pod_sections(decode(members[path], path)).get("DESCRIPTION")
        if description:
            return Document(tuple(description), path)
    return None


def upstream_document(package: str, members: dict[str, bytes]) -> Document | None:
    """``package``'s upstream document among the ``members`` :func:`wanted_member` selected, or None."""
    if is_perl_module(package):
        return perl_document(package, members)
    best: Document | None = None
    for path in sorted(members):
        text = decode(members[path], path)
        name = path.rsplit("/", 1)[-1]
        paragraphs = metadata_paragraphs(text) if _PYTHON_METADATA.fullmatch(path) else readme_paragraphs(text, name)
        doc = Document(tuple(paragraphs), path)
        if paragraphs and (best is None or doc.words > best.words):
            best = doc
    return best
