"""The README's generated tables: the block between `<!-- results:<name> -->` and `<!-- /results:<name> -->`
is the render of `results/<name>/` (a suite's records), rewritten by `zoo.report ... readme=true` and checked
by a test, so a hand edit of a published number cannot pass CI."""

from __future__ import annotations

import re
from pathlib import Path

from zoo.errors import ZooError

README = Path(__file__).resolve().parent.parent.parent / "README.md"


class ReadmeError(ZooError, ValueError):
    """README.md has no (or a broken) block for the suite."""


def _pattern(suite: str) -> re.Pattern[str]:
    name = re.escape(suite)
    return re.compile(rf"(^<!-- results:{name} -->\n)(.*?)(^<!-- /results:{name} -->$)", re.DOTALL | re.MULTILINE)


def readme_suites(text: str) -> list[str]:
    """The suites that have a generated block in a README text."""
    return re.findall(r"^<!-- results:([A-Za-z0-9_.-]+) -->$", text, re.MULTILINE)  # marker lines, not prose


def read_block(text: str, suite: str) -> str:
    match = _pattern(suite).search(text)
    if match is None:
        raise ReadmeError(
            f"README.md has no block <!-- results:{suite} --> … <!-- /results:{suite} -->; add the two "
            "marker lines where the table belongs, then rerun with readme=true"
        )
    return match.group(2)


def replace_block(text: str, suite: str, block: str) -> str:
    read_block(text, suite)  # the same error when the markers are missing
    return _pattern(suite).sub(lambda m: m.group(1) + block + m.group(3), text, count=1)


def write_block(suite: str, block: str, readme: Path = README) -> bool:
    """Rewrite the suite's block in README.md; returns whether the file changed."""
    text = readme.read_text(encoding="utf-8")
    new = replace_block(text, suite, block)
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


__all__ = ["README", "ReadmeError", "read_block", "readme_suites", "replace_block", "write_block"]
