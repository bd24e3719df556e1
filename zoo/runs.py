"""Run directories (zoo/DESIGN.md §3b): `runs/<entry>-<data>/<timestamp>/`, provenance, resume lookup."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import IO

from omegaconf import DictConfig, OmegaConf

from zoo.machine import describe_machine

DONE_MARKER = "DONE"
LOCK_FILE = ".lock"


class RunBusyError(RuntimeError):
    """Another process is training this run directory."""


def run_name(entry: str, data: str) -> str:
    return f"{entry}-{data}"


def new_run_dir(root: str | Path, entry: str, data: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / run_name(entry, data)
    path = base / stamp
    suffix = 1
    while path.exists():  # two runs started in the same second
        path = base / f"{stamp}-{suffix}"
        suffix += 1
    path.mkdir(parents=True)
    return path


def find_resumable(root: str | Path, entry: str, data: str) -> Path | None:
    """Newest run of this entry and data that has a last.pt and no DONE marker."""
    base = Path(root) / run_name(entry, data)
    if not base.is_dir():
        return None
    candidates = [
        d
        for d in base.iterdir()
        if d.is_dir() and (d / "checkpoints" / "last.pt").is_file() and not (d / DONE_MARKER).exists()
    ]
    return max(candidates, key=lambda d: d.name) if candidates else None


def resolve_resume(resume: str | bool | None, root: str | Path, entry: str, data: str) -> Path | None:
    """`resume=latest|true` → newest unfinished run; `resume=<run dir>` → that run; else None."""
    if resume in (None, False, "", "false", "False"):
        return None
    if resume in (True, "true", "True", "latest"):
        found = find_resumable(root, entry, data)
        if found is None:
            raise FileNotFoundError(
                f"resume={resume}: no unfinished run of {run_name(entry, data)} under {root} "
                "(one with checkpoints/last.pt and no DONE marker); start without resume"
            )
        return found
    path = Path(str(resume)).expanduser()
    if not (path / "checkpoints" / "last.pt").is_file():
        raise FileNotFoundError(f"resume={resume}: {path}/checkpoints/last.pt does not exist; cannot resume that run")
    return path


def lock_run_dir(run_dir: Path) -> IO[str]:
    """Hold an exclusive lock on `run_dir` while this process trains it; keep the returned file open until done.

    Why: a second `zoo.train resume=…` (or a second zoo.report worker, which resumes every unfinished run it meets)
    would otherwise train the same run from its last checkpoint, truncate metrics.csv and overwrite last.pt under the
    first. The kernel drops an flock when its process ends, killed or not, so a stale lock never blocks a resume."""
    handle = open(run_dir / LOCK_FILE, "a+")  # held open for the whole run: the caller closes it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RunBusyError(
            f"{run_dir} is being trained by another process (pid {holder}); wait for it to finish, or stop it and "
            f"then continue with resume={run_dir}"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def git_sha() -> str:
    """This code's commit, "(dirty)" when the tree has changes; what a measurement names as its code."""
    repo = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    if not sha and os.environ.get("ZOO_GIT_SHA"):
        # a tree copied without .git (a container image, a remote GPU machine): the copier names the commit
        sha = f"{os.environ['ZOO_GIT_SHA']} (from ZOO_GIT_SHA: tree copied without .git)"
    return f"{sha or 'unknown'}{' (dirty)' if dirty else ''}"


def installed_packages() -> str:
    """`name==version` of every installed distribution, sorted, one per line: `pip freeze`'s content read in-process
    (a `pip freeze` subprocess took 0.7 s of every run's start)."""
    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return "".join(f"{line}\n" for _, line in sorted(seen.items()))


def write_provenance(run_dir: Path, cfg: DictConfig) -> None:
    """Resolved config, git sha, machine and installed packages, so a number can be traced to its code
    and to the hardware that produced it (results records copy `machine.json`)."""
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / "machine.json").write_text(json.dumps(describe_machine(cfg.get("device")), indent=2) + "\n")
    (run_dir / "git_sha.txt").write_text(git_sha() + "\n")
    (run_dir / "pip_freeze.txt").write_text(installed_packages())
