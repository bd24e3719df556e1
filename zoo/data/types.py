"""Plain data containers shared by every corpus builder.

Kept free of I/O so that the model, trainer and tests can import them without pulling in the
Debian/apt machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.errors import ZooError

SPLIT_NAMES: tuple[str, str, str] = ("train", "valid", "test")


class DataError(ZooError):
    """A user-facing data problem.

    The message always names the file (and line where relevant) and says how to fix it, so the
    entry points can print it without a traceback.
    """


@dataclass(frozen=True)
class Example:
    """One source/target pair.

    ``origin`` names the corpus the pair came from ("ding", "libreoffice", "ddtp", "files") so
    that evaluation can report scores per source and the split statistics stay auditable.
    """

    src: str
    tgt: str
    origin: str


@dataclass
class Splits:
    """The three fixed splits of one corpus plus JSON-serialisable statistics about the build.

    ``stats`` holds per-source counts per split, how many valid/test pairs were removed because
    they overlap training pairs, and how many pairs each filter dropped.
    """

    train: list[Example]
    valid: list[Example]
    test: list[Example]
    stats: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> list[Example]:
        """Return a split by name ("train", "valid" or "test")."""
        if name not in SPLIT_NAMES:
            raise KeyError(f"unknown split {name!r}; expected one of {SPLIT_NAMES}")
        return getattr(self, name)

    def __len__(self) -> int:
        return len(self.train) + len(self.valid) + len(self.test)
