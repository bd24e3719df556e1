"""One error base for the zoo and one way for every command to report it.

A `ZooError` is a problem the user can fix (a bad config value, a missing file, a corrupt record); its
message names the problem and the fix. Commands wrap their work in `one_line_errors()`, which prints
`error: <message>` on stderr and exits with status 2 — anything else is a bug and keeps its traceback.
`serve` has its own base (`serve.errors.ServeError`) and the torch-free runtime its own
(`export.runtime.ExportRuntimeError`); their commands pass those to the same wrapper.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class ZooError(Exception):
    """A problem the user can fix; the message names it and the fix."""


def _two() -> int:
    return 2


@contextmanager
def one_line_errors(*kinds: type[BaseException], status: Callable[[], int] = _two) -> Iterator[None]:
    """Turn a ZooError (or one of `kinds`) into one `error: …` line on stderr and exit with `status()` (2;
    `serve.start` says 130 when the user interrupted the start)."""
    try:
        yield
    except (ZooError, *kinds) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(status()) from None


__all__ = ["ZooError", "one_line_errors"]
