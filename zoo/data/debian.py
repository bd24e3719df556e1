"""Fetch raw text from the Debian archive with a private, user-owned apt state.

Why private: the machine-wide apt configuration here disables translation indexes
(``Acquire::Languages "none"``, which ``-o`` cannot override) and may need root. A private
``APT_CONFIG`` with an empty ``Dir::Etc::Parts`` and private list/cache directories fetches
``Translation-{en,de}`` and ``.deb`` files without touching the system and without root.
"""

from __future__ import annotations

import gzip
import logging
import lzma
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from zoo.data.cache import build_lock
from zoo.data.types import DataError

log = logging.getLogger("zoo.data")

_FALLBACK_HINT = (
    "Building this corpus needs Debian's apt-get and dpkg-deb with network access to the Debian "
    "archive. Without them, train on your own parallel files instead: "
    "data=files data.path=/dir/with/your/files (train.de + train.en, valid.*, test.*; see conf/data/files.yaml)."
)
# apt settings worth forwarding from the system configuration: proxies and mirror quirks.
_FORWARD = re.compile(
    r"^(Acquire::(?:https?|ftp)::\S+|Acquire::Check-Valid-Until|Acquire::Check-Date|"
    r'Acquire::Retries|Acquire::ForceIPv4) "(.+)";$'
)
_UPDATED_STAMP = "UPDATED"


def _need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise DataError(f"`{name}` was not found on PATH. {_FALLBACK_HINT}")
    return path


def _run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    """Run a command; on failure raise DataError with the tail of its output. Returns the
    combined output (apt reports some failures only as warnings with exit code 0)."""
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise DataError(f"could not run {' '.join(cmd)!r}: {exc}. {_FALLBACK_HINT}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise DataError(f"{' '.join(cmd)!r} failed with exit code {proc.returncode}:\n{tail}\n{_FALLBACK_HINT}")
    return (proc.stdout or "") + (proc.stderr or "")


def _forwarded_settings(env: dict[str, str]) -> list[str]:
    """Proxy and mirror settings from the system apt config, so the private config still works
    behind the same proxy as the system one."""
    try:
        out = subprocess.run(["apt-config", "dump"], env=env, capture_output=True, text=True, check=False).stdout
    except OSError:
        return []
    return [line for line in out.splitlines() if _FORWARD.match(line)]


def _read_index(path: Path) -> str:
    """Read an apt index file, transparently decompressing the formats Python supports."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    if path.suffix == ".xz":
        return lzma.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text(encoding="utf-8")


class DebianArchive:
    """Downloads apt indexes and packages into ``root`` once and reuses them afterwards."""

    def __init__(self, root: str | Path, languages: tuple[str, ...] = ("en", "de")) -> None:
        self.root = Path(root)
        self.languages = languages
        self.apt_dir = self.root / "apt"
        self.lists_dir = self.apt_dir / "lists"
        self.pkg_dir = self.root / "packages"
        self.debs_dir = self.root / "debs"

    # ----------------------------------------------------------------- apt configuration
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["APT_CONFIG"] = str(self.apt_dir / "apt.conf")
        env["LC_ALL"] = "C"
        return env

    def _write_config(self) -> None:
        for sub in ("parts", "lists/partial", "cache/archives/partial"):
            (self.apt_dir / sub).mkdir(parents=True, exist_ok=True)
        forwarded = _forwarded_settings({k: v for k, v in os.environ.items() if k != "APT_CONFIG"})
        langs = " ".join(f'"{lang}";' for lang in self.languages)
        lines = [
            f'Dir::Etc::Parts "{self.apt_dir / "parts"}";',
            f'Dir::State::Lists "{self.lists_dir}";',
            f'Dir::Cache "{self.apt_dir / "cache"}";',
            f"Acquire::Languages {{ {langs} }};",
            # no on-disk binary package caches (~80 MB); apt rebuilds them in memory when needed
            'Dir::Cache::pkgcache "";',
            'Dir::Cache::srcpkgcache "";',
            *forwarded,
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # The _apt sandbox user cannot enter root-owned private dirs such as ~/.cache.
            lines.append('APT::Sandbox::User "root";')
        (self.apt_dir / "apt.conf").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def update(self) -> None:
        """Run ``apt-get update`` against the private state unless it already succeeded."""
        if (self.apt_dir / _UPDATED_STAMP).exists():
            return
        _need_tool("apt-get")
        with build_lock(self.root / ".apt.lock"):
            if (self.apt_dir / _UPDATED_STAMP).exists():
                return
            self._write_config()
            log.info("fetching Debian package indexes and translations into %s", self.apt_dir)
            output = _run(["apt-get", "update", "-q"], self._env())
            if not list(self.lists_dir.glob("*_i18n_Translation-en*")):
                problems = [ln for ln in output.splitlines() if ln.startswith(("W:", "E:", "Err"))]
                raise DataError(
                    "apt-get update fetched no Translation-en index (network or mirror problem?):\n"
                    + "\n".join(problems[-8:])
                    + f"\n{_FALLBACK_HINT}"
                )
            (self.apt_dir / _UPDATED_STAMP).write_text("ok\n", encoding="utf-8")

    # ----------------------------------------------------------------- index files
    def _index_files(self, pattern: str) -> list[Path]:
        """Index files of the base release (suite without '-security'/'-updates'), falling back
        to every suite: point-release suites repeat the same descriptions."""
        files = sorted(p for p in self.lists_dir.glob(pattern) if not p.name.endswith(".lz4"))
        base = [p for p in files if "-" not in p.name.split("_dists_")[-1].split("_")[0]]
        return base or files

    def translation_texts(self, lang: str) -> list[str]:
        """Contents of the ``Translation-{lang}`` index files of the ``main`` component."""
        self.update()
        files = self._index_files(f"*_main_i18n_Translation-{lang}*")
        if not files:
            raise DataError(
                f"apt-get update did not produce a Translation-{lang} file in {self.lists_dir}; "
                f"delete {self.apt_dir} and retry. {_FALLBACK_HINT}"
            )
        return [_read_index(p) for p in files]

    def packages_texts(self) -> list[str]:
        """Contents of the ``Packages`` index files (used to map binary → source package)."""
        self.update()
        return [_read_index(p) for p in self._index_files("*_main_binary-*_Packages*")]

    # ----------------------------------------------------------------- packages
    def package(self, name: str) -> Path:
        """Directory holding the extracted contents of Debian package ``name``.

        Downloaded and extracted into a temporary directory first, then renamed into place, so
        an interrupted run never leaves a half-extracted package that looks complete.
        """
        target = self.pkg_dir / name
        if target.is_dir():
            return target
        self.update()
        _need_tool("dpkg-deb")
        self.pkg_dir.mkdir(parents=True, exist_ok=True)
        with build_lock(self.root / ".apt.lock"):
            if target.is_dir():
                return target
            for stale in self.pkg_dir.glob(f".{name}-*"):  # left by a killed earlier run
                shutil.rmtree(stale, ignore_errors=True)
            self._download(name, target)
        return target

    def _download(self, name: str, target: Path) -> None:
        with tempfile.TemporaryDirectory(dir=self.pkg_dir, prefix=f".{name}-") as tmp:
            tmp_path = Path(tmp)
            log.info("downloading Debian package %s", name)
            _run(["apt-get", "download", "-q", name], self._env(), cwd=tmp_path)
            debs = sorted(tmp_path.glob("*.deb"))
            if not debs:
                raise DataError(f"apt-get download {name} produced no .deb file. {_FALLBACK_HINT}")
            staged = tmp_path / "pkg"
            (staged / "root").mkdir(parents=True)
            _run(["dpkg-deb", "-x", str(debs[0]), str(staged / "root")], self._env())
            debs[0].rename(staged / debs[0].name)
            staged.rename(target)

    # ----------------------------------------------------------------- many packages, kept as .deb files
    def debs(self, names: Sequence[str], batch: int = 250) -> tuple[dict[str, Path], list[str]]:
        """``{name: .deb file}`` for many packages, downloaded once into ``debs/<name>.deb`` and kept unextracted
        (a corpus reads a few members of each with :func:`read_deb_members`); also the names apt could not
        download. One ``apt-get download`` per ``batch`` names (apt loads its package lists once per call); a
        batch that fails is halved until the failing names are alone, and those are returned, not raised."""
        wanted = {name: self.debs_dir / f"{name}.deb" for name in dict.fromkeys(names)}
        missing = [name for name, path in wanted.items() if not path.is_file()]
        failed: list[str] = []
        if missing:
            self.update()
            _need_tool("apt-get")
            self.debs_dir.mkdir(parents=True, exist_ok=True)
            with build_lock(self.root / ".apt.lock"):
                missing = [name for name in missing if not wanted[name].is_file()]
                for start in range(0, len(missing), batch):
                    failed += self._download_debs(missing[start : start + batch])
                    done = min(start + batch, len(missing))
                    log.info("downloaded %d of %d Debian packages (%d failed)", done, len(missing), len(failed))
        return {name: path for name, path in wanted.items() if path.is_file()}, failed

    def _download_debs(self, names: list[str]) -> list[str]:
        """Download ``names`` into ``debs/`` (each file renamed into place whole); the names that failed."""
        for stale in self.debs_dir.glob(".batch-*"):  # left by a killed earlier run
            shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=self.debs_dir, prefix=".batch-") as tmp:
            try:
                _run(["apt-get", "download", "-q", *names], self._env(), cwd=Path(tmp))
            except DataError as exc:
                if len(names) == 1:
                    log.warning("could not download %s: %s", names[0], str(exc).splitlines()[-2:])
                    return names
                half = len(names) // 2
                return self._download_debs(names[:half]) + self._download_debs(names[half:])
            for deb in Path(tmp).glob("*.deb"):  # apt names them <package>_<version>_<arch>.deb
                deb.rename(self.debs_dir / f"{deb.name.split('_', 1)[0]}.deb")
        return [name for name in names if not (self.debs_dir / f"{name}.deb").is_file()]


def read_deb_members(deb: Path, wanted: Callable[[str], bool], max_bytes: int = 4 << 20) -> dict[str, bytes]:
    """``{path: content}`` of the regular files of a ``.deb`` whose path (``usr/share/…``, no leading ``./``)
    ``wanted`` accepts and that are at most ``max_bytes`` long. ``dpkg-deb --fsys-tarfile`` unpacks the data
    archive whatever its compression; the tar stream is read once, nothing is written to disk."""
    cmd = [_need_tool("dpkg-deb"), "--fsys-tarfile", str(deb)]
    found: dict[str, bytes] = {}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    path = member.name.removeprefix("./")
                    if member.isfile() and member.size <= max_bytes and wanted(path):
                        handle = tar.extractfile(member)
                        if handle is not None:
                            found[path] = handle.read()
            proc.stdout.read()  # the archive's zero padding: dpkg-deb fails on a pipe closed before its end
        except tarfile.TarError as exc:
            proc.kill()
            raise DataError(f"{deb} is not a readable Debian package ({exc}); delete it to download it again") from exc
        stderr = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise DataError(f"dpkg-deb --fsys-tarfile {deb} failed: {stderr.strip()[-300:]}; delete it to download again")
    return found
