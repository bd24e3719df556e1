"""One error base for the zoo and one way for every command to report it.

A `ZooError` is a problem the user can fix (a bad config value, a missing file, a corrupt record); its
message names the problem and the fix. Commands wrap their work in `one_line_errors()`, which prints
`error: <message>` on stderr and exits with status 2 — as it does for a Hydra command run without a setting its
config leaves to the command line (`???`), naming the setting; anything else is a bug and keeps its traceback.
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
    except Exception as exc:
        key = _unset_setting(exc)
        if key is None:
            raise
        print(f"error: {key} is not set; give it on the command line: {_command()} {key}=<value>", file=sys.stderr)
        raise SystemExit(status()) from None


def _unset_setting(exc: Exception) -> str | None:
    """The setting a Hydra command's config leaves to the command line (`???`) and the command was run without —
    omegaconf's MissingMandatoryValue, raised where the command first reads it — else None. Looked up in
    sys.modules: where omegaconf was never imported, no exception can be one of its own."""
    errors = sys.modules.get("omegaconf.errors")
    if errors is None or not isinstance(exc, errors.MissingMandatoryValue):
        return None
    return str(exc.full_key) or None


def _command() -> str:
    """How this process was started, as a user would type it again (`python -m zoo.evaluate`)."""
    argv = getattr(sys, "orig_argv", [])
    if "-m" in argv[:-1]:
        return f"python -m {argv[argv.index('-m') + 1]}"
    return f"python {sys.argv[0]}"


__all__ = ["ZooError", "one_line_errors"]
