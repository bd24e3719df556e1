"""Staged directories: build a directory under a temporary name beside its target, let the caller verify it,
then swap it in so that the target path never disappears and never shows a half-written directory.

    with staged_directory(out, overwrite=overwrite, exists_error=MyError.for_path) as stage:
        write_everything(stage.path)
        verify(stage.path)
        stage.publish()
    # leaving the block without publish() — an exception, a failed check — removes the temporary directory
    # and leaves the target as it was

Every writer of a published directory uses this: the exporter (an export dir) and the Triton repository writers
(serve.repository's and serve.ngc's model dirs, through serve.model_config.staged_model_dir).

The swap (publish): an old target is replaced only after the new directory is complete, and deleted only after
the new one is in place.
- Linux (renameat2 with RENAME_EXCHANGE; ext4, xfs, btrfs, tmpfs, overlayfs): new and old trade places in one
  atomic step, so a reader of `target/...` sees either the old directory or the new one, never nothing; the old
  one, now under the temporary name, is deleted afterwards.
- Elsewhere (no renameat2, or a filesystem that refuses the exchange): the old directory is renamed aside, the
  new one renamed in (a window of one rename call without a target), then the old one deleted. If renaming in
  fails, the old directory is renamed back.

Standard library only and free of torch, so both `export` and `serve` (which must not pull torch in) import it;
it lives in `export` because `serve` depends on `export` and never the other way round (zoo/DESIGN.md §2).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# errors meaning "this system or filesystem cannot exchange", not "this exchange is wrong": fall back
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}


def _load_renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.renameat2  # glibc ≥ 2.28
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap the directory entries `a` and `b` (both must exist); False when this system or
    filesystem cannot (nothing changed then), OSError for any other failure."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _remove(path: Path) -> None:
    """Delete a replaced target: a symlink itself (never what it points to), else the directory tree."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _default_exists_error(target: Path) -> Exception:
    return FileExistsError(f"{target} exists; pass overwrite=true to replace it")


class StagedDirectory:
    """A temporary directory (`path`) that `publish()` swaps in as `target`; see the module docstring."""

    def __init__(
        self,
        target: Path,
        *,
        overwrite: bool,
        exists_error: Callable[[Path], Exception],
        staging_dir: Path | None = None,
        mode: int | None = None,
    ) -> None:
        self.target = Path(target)
        self.overwrite = overwrite
        self.exists_error = exists_error
        self.staging_dir = Path(staging_dir) if staging_dir is not None else self.target.parent
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.staging_dir))
        if mode is None:  # what mkdir would give (mkdtemp makes it private): an ordinary directory
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o777 & ~umask
        self.path.chmod(mode)
        self.published = False

    def check_target(self) -> None:
        """Refuse an existing target unless overwrite, and any target that is not a directory."""
        target = self.target
        if not (target.exists() or target.is_symlink()):
            return
        if not self.overwrite:
            raise self.exists_error(target)
        if not target.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "cannot replace a non-directory with a directory", str(target))

    def publish(self) -> None:
        """Swap the staged directory in as the target (replacing an old one only with overwrite)."""
        if self.published:
            raise RuntimeError(f"{self.path} was already published as {self.target}")
        self.check_target()
        target = self.target
        if not (target.exists() or target.is_symlink()):
            self.path.rename(target)
        elif exchange(self.path, target):
            _remove(self.path)  # the old directory, now under the temporary name
        else:
            unique = self.path.name[len(f".{target.name}.tmp-") :]  # mkdtemp's suffix
            old = self.staging_dir / f".{target.name}.old-{unique}"
            target.rename(old)
            try:
                self.path.rename(target)
            except BaseException:
                old.rename(target)
                raise
            _remove(old)
        self.published = True

    def discard(self) -> None:
        """Remove the staged directory unless it was published."""
        if not self.published:
            shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(
    target: Path,
    *,
    overwrite: bool,
    exists_error: Callable[[Path], Exception] = _default_exists_error,
    staging_dir: Path | None = None,
    mode: int | None = None,
) -> Iterator[StagedDirectory]:
    """A fresh temporary directory in `staging_dir` (default: beside `target`), removed on leaving the block
    unless `publish()` swapped it in. `exists_error(target)` is raised by publish when the target exists and
    overwrite is false; `mode` defaults to an ordinary directory's (0o777 minus the umask)."""
    stage = StagedDirectory(target, overwrite=overwrite, exists_error=exists_error, staging_dir=staging_dir, mode=mode)
    try:
        yield stage
    finally:
        stage.discard()
