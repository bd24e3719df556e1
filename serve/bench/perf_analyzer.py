"""NVIDIA's `perf_analyzer` for our served models: installed into a cache from PyPI and Debian, run, parsed.

Why this module exists: engineers who deploy on Triton measure with `perf_analyzer`, so `serve.bench` reports its
numbers next to our own load generator's. The binary is not a Python package of its own: the last
`tritonclient` wheel that ships it is 2.51.0 (the same release as our tritonserver; later wheels dropped it and
the `perf-analyzer` name on PyPI is a placeholder). It needs two shared libraries that are not on this machine:
`libb64.so.0d` (Debian package `libb64-0d`) and `libcudart.so.12` (PyPI wheel `nvidia-cuda-runtime-cu12`, which
loads without a GPU). `install()` puts all three in one cache directory, without touching the venv (its
`tritonclient` stays the newer Python client) or the system, and checks that the binary starts:

    <cache>/2.51.0/bin/perf_analyzer            from the tritonclient wheel's data directory
    <cache>/2.51.0/lib/libb64.so.0d             from Debian's libb64-0d (apt-get download + dpkg-deb -x)
    <cache>/2.51.0/lib/libcudart.so.12          from the nvidia-cuda-runtime-cu12 wheel
    <cache>/2.51.0/install.json                 written last: its presence means the install is complete

`<cache>` is `$ZOO_PERF_ANALYZER_DIR`, else `$ZOO_CACHE/perf_analyzer`, else `~/.cache/attention_zoo/perf_analyzer`.
Wheels are fetched with this interpreter's pip (so the user's index and proxy settings apply) and checked against
pinned sha256 digests; the Debian package through the corpus tools' private apt state (zoo.data.debian). An
interrupted install leaves only verified downloads and a `.tmp-*` directory; the next one reuses the former and
removes the latter. `python -m serve.bench.perf_analyzer install` does it from the command line.

`run()` drives one model at one concurrency with real texts (`--input-data` JSON of BYTES `TEXT`
tensors, shape [1] per batch row), in synchronous mode (one client thread per request in flight, like our
generator), and parses the CSV it writes (`-f`). perf_analyzer also reads Triton's statistics API to split
latency into queue and compute time; that API is restricted to the server's admin key (serve.server), which it
sends as an HTTP header or as gRPC metadata (`-H`, which 2.51 sends on both despite its --help). Over HTTP it must
therefore talk to Triton's own loopback listener: the nginx proxy in front of the public port passes inference
and metadata only. `--version` is the start-up check: 2.51 has no `--help` option (it prints its usage and exits
99 for any option it does not know).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from export.runtime.manifest import sha256_file
from serve.errors import ServeError
from zoo.data.cache import DEFAULT_CACHE, resolve_cache_dir
from zoo.data.debian import DebianArchive
from zoo.data.types import DataError
from zoo.errors import one_line_errors

VERSION = "2.51.0"


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel and the one file taken out of it."""

    requirement: str
    platform: str  # pip download --platform
    filename: str
    sha256: str
    member: str  # path inside the wheel
    target: str  # path inside the install directory


PERF_ANALYZER_WHEEL = Wheel(
    f"tritonclient=={VERSION}",
    "manylinux1_x86_64",
    f"tritonclient-{VERSION}-py3-none-manylinux1_x86_64.whl",
    "c485bb0123bdf310f90bc8b03d3489b28df2ffed55b30c7eee0b795b48113d52",
    f"tritonclient-{VERSION}.data/data/bin/perf_analyzer",
    "bin/perf_analyzer",
)
# CUDA 12.6, the toolkit Triton 2.51 (NGC 24.10) was built with; perf_analyzer links it but needs no GPU to start
CUDART_WHEEL = Wheel(
    "nvidia-cuda-runtime-cu12==12.6.77",
    "manylinux2014_x86_64",
    "nvidia_cuda_runtime_cu12-12.6.77-py3-none-manylinux2014_x86_64.whl",
    "a84d15d5e1da416dd4774cb42edf5e954a3e60cc945698dc1d5be02321c44dc8",
    "nvidia/cuda_runtime/lib/libcudart.so.12",
    "lib/libcudart.so.12",
)
LIBB64_PACKAGE = "libb64-0d"
LIBB64 = "lib/libb64.so.0d"
LIBB64_IN_PACKAGE = "usr/lib/x86_64-linux-gnu/libb64.so.0d"
STAMP = "install.json"
ENV_DIR = "ZOO_PERF_ANALYZER_DIR"
INSTALL_HINT = "then re-run `python -m serve.bench.perf_analyzer install`"
# what --version prints (on stderr) when the binary and both libraries load
VERSION_LINE = re.compile(r"Perf Analyzer Version (\S+)")
# the CSV columns we read (-f; microseconds); --verbose-csv adds "Avg latency"
CONCURRENCY, THROUGHPUT = "Concurrency", "Inferences/Second"
LATENCY_COLUMNS = {"p50": "p50 latency", "p90": "p90 latency", "p95": "p95 latency", "p99": "p99 latency"}
AVG_LATENCY = "Avg latency"
SERVER_QUEUE, SERVER_INFER = "Server Queue", "Server Compute Infer"
REQUEST_COUNT = re.compile(r"Client:\s+Request count: (\d+)")  # in its stdout summary
# it reports the mean of the last this-many windows, once they agree within the stability percentage
REPORTED_WINDOWS = 3
CHECK_TIMEOUT_S = 60.0  # `--version` answers at once; this only bounds a hung start
# a run's time limit: every window it may take (warm-up, max_trials, the final one) twice over, plus start-up
TIMEOUT_SLACK_S = 60.0


class PerfAnalyzerError(ServeError):
    """perf_analyzer could not be installed or run, or wrote no usable CSV; the message names the fix."""


@dataclass(frozen=True)
class Installation:
    """An installed perf_analyzer: the binary and the directory its two libraries are in."""

    binary: Path
    lib_dir: Path
    version: str

    def env(self) -> dict[str, str]:
        """This process's environment with the cached libraries first on LD_LIBRARY_PATH."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.lib_dir), env.get("LD_LIBRARY_PATH")) if p)
        return env

    def shell_command(self) -> str:
        """How to run it by hand."""
        return f"LD_LIBRARY_PATH={self.lib_dir} {self.binary}"


@dataclass(frozen=True)
class Measurement:
    """perf_analyzer's stabilisation settings. It measures windows of `interval_ms` until the last three agree
    within `stability_percentage` (throughput and latency), at most `max_trials` windows, and reports their mean;
    it fails when they never agree (a busy machine: widen the percentage or lengthen the window)."""

    interval_ms: int = 5000
    stability_percentage: float = 10.0
    max_trials: int = 10

    def timeout_s(self) -> float:
        return 2 * (self.max_trials + 2) * self.interval_ms / 1000 + TIMEOUT_SLACK_S


@dataclass(frozen=True)
class Row:
    """One line of perf_analyzer's CSV: one concurrency. Latencies in milliseconds (the CSV has microseconds)."""

    concurrency: int
    inferences_per_s: float  # = sentences/s: one inference is one batch row, one text
    latency_ms: dict[str, float]  # p50, p90, p95, p99 and, with --verbose-csv, mean
    server_queue_ms: float
    server_compute_infer_ms: float
    requests: int | None = None  # requests in the reported windows (from its stdout; None if not found)


@dataclass(frozen=True)
class Result:
    """A finished run at one concurrency: its row, the CSV it came from and the command that wrote it."""

    row: Row
    csv: Path
    command: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------- install


def cache_dir(root: str | Path | None = None) -> Path:
    """Explicit `root`, else $ZOO_PERF_ANALYZER_DIR, else the zoo cache's `perf_analyzer/`."""
    if root:
        return Path(root).expanduser()
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    # zoo.data.cache's rule without resolve_cache_dir's mkdir: looking for an installation creates nothing
    zoo_cache = os.environ.get("ZOO_CACHE") or DEFAULT_CACHE
    return Path(zoo_cache).expanduser() / "perf_analyzer"


def installed(root: str | Path | None = None) -> Installation | None:
    """The cached installation if complete (its stamp is written last), else None. Nothing is run."""
    target = cache_dir(root) / VERSION
    if not (target / STAMP).is_file():
        return None
    found = Installation(target / PERF_ANALYZER_WHEEL.target, target / "lib", VERSION)
    needed = (found.binary, target / LIBB64, target / CUDART_WHEEL.target)
    return found if all(p.is_file() for p in needed) else None


def install(root: str | Path | None = None) -> Installation:
    """perf_analyzer 2.51.0 with its libraries in the cache (downloaded once), checked to start."""
    found = installed(root)
    if found is None:
        _check_platform()
        base = cache_dir(root)
        base.mkdir(parents=True, exist_ok=True)
        with _lock(base / ".lock"):
            found = installed(root) or _install(base)
    version = check(found)
    if version != VERSION:
        raise PerfAnalyzerError(
            f"{found.binary} reports version {version}, expected {VERSION}; delete {found.binary.parent.parent} "
            f"and {INSTALL_HINT}"
        )
    return found


def check(found: Installation) -> str:
    """Run `perf_analyzer --version` (it prints on stderr and exits 0 only if both libraries load)."""
    try:
        proc = subprocess.run(
            [str(found.binary), "--version"],
            env=found.env(),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PerfAnalyzerError(
            f"{found.binary} cannot be executed ({exc}); delete {found.binary.parent.parent} and {INSTALL_HINT}"
        ) from exc
    match = VERSION_LINE.search(proc.stderr + proc.stdout)
    if proc.returncode != 0 or match is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise PerfAnalyzerError(
            f"{found.binary} --version failed (exit {proc.returncode}: {' '.join(tail)}); "
            f"delete {found.binary.parent.parent} and {INSTALL_HINT}"
        )
    return match.group(1)


def _check_platform() -> None:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise PerfAnalyzerError(
            f"the perf_analyzer {VERSION} binary on PyPI is built for Linux x86_64 only, not "
            f"{sys.platform} {platform.machine()}; use NVIDIA's Triton SDK container (tritonserver:<yy.mm>-py3-sdk)"
        )


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One installer at a time per cache directory (tests and a bench may start together)."""
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _install(base: Path) -> Installation:
    """Fetch the three files into a `.tmp-*` directory beside the target, then rename it into place."""
    downloads = base / "downloads"  # verified wheels survive an interrupted install
    downloads.mkdir(exist_ok=True)
    for stale in base.glob(f".tmp-{VERSION}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    target = base / VERSION
    stage = Path(tempfile.mkdtemp(dir=base, prefix=f".tmp-{VERSION}-"))
    stage.chmod(0o755)  # mkdtemp makes it private; a shared cache should be readable by all
    try:
        for wheel in (PERF_ANALYZER_WHEEL, CUDART_WHEEL):
            _extract(_download(wheel, downloads), wheel, stage)
        (stage / PERF_ANALYZER_WHEEL.target).chmod(0o755)
        libb64 = stage / LIBB64
        shutil.copy2(_libb64(), libb64)
        stamp = {
            "version": VERSION,
            "wheels": {w.filename: w.sha256 for w in (PERF_ANALYZER_WHEEL, CUDART_WHEEL)},
            "debian": {LIBB64_PACKAGE: sha256_file(libb64)},
        }
        found = Installation(stage / PERF_ANALYZER_WHEEL.target, stage / "lib", VERSION)
        check(found)  # before it is published
        (stage / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        if target.exists():  # an incomplete install (no stamp): replaced
            shutil.rmtree(target)
        stage.rename(target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(downloads, ignore_errors=True)
    return Installation(target / PERF_ANALYZER_WHEEL.target, target / "lib", VERSION)


def _download(wheel: Wheel, downloads: Path) -> Path:
    """The wheel in `downloads`, fetched with pip unless a verified copy is there already."""
    path = downloads / wheel.filename
    if path.is_file() and sha256_file(path) == wheel.sha256:
        return path
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--platform", wheel.platform, "--dest", str(downloads), wheel.requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise PerfAnalyzerError(f"cannot run pip ({exc}); install pip in this environment and {INSTALL_HINT}") from exc
    if proc.returncode != 0 or not path.is_file():
        said = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        raise PerfAnalyzerError(
            f"could not download {wheel.requirement} ({said or 'no file'}); perf_analyzer needs network access to "
            f"PyPI (or a PIP_INDEX_URL mirror that has {wheel.filename}), {INSTALL_HINT}"
        )
    actual = sha256_file(path)
    if actual != wheel.sha256:
        path.unlink()
        raise PerfAnalyzerError(
            f"{wheel.filename} from the package index has sha256 {actual}, expected {wheel.sha256}; "
            f"check your index or mirror, {INSTALL_HINT}"
        )
    return path


def _extract(path: Path, wheel: Wheel, stage: Path) -> None:
    out = stage / wheel.target
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(path) as archive, archive.open(wheel.member) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    except (KeyError, zipfile.BadZipFile) as exc:
        path.unlink(missing_ok=True)
        raise PerfAnalyzerError(f"{path} has no {wheel.member} ({exc}); {INSTALL_HINT}") from exc


def _libb64() -> Path:
    """libb64.so.0d from Debian's package, fetched with the corpus tools' private apt state (no root)."""
    try:
        package = DebianArchive(resolve_cache_dir(None) / "debian").package(LIBB64_PACKAGE)
    except DataError as exc:
        first = str(exc).splitlines()[0]
        raise PerfAnalyzerError(
            f"the Debian package {LIBB64_PACKAGE} (libb64.so.0d, needed by perf_analyzer) could not be fetched "
            f"({first}); it needs apt-get, dpkg-deb and access to the Debian archive, {INSTALL_HINT}"
        ) from exc
    library = package / "root" / LIBB64_IN_PACKAGE
    if not library.is_file():
        raise PerfAnalyzerError(f"the Debian package {LIBB64_PACKAGE} has no {LIBB64_IN_PACKAGE} (at {package})")
    return library


# ---------------------------------------------------------------------------------------------------- run


def write_input_data(texts: Sequence[str], path: Path) -> Path:
    """perf_analyzer's `--input-data` JSON: one step per text, a BYTES `TEXT` tensor of shape [1] (one batch row;
    with `-b n` it takes n consecutive steps). It sends the steps in order, round robin, as our generator does."""
    if not texts:
        raise PerfAnalyzerError("no input texts for perf_analyzer")
    data = {"data": [{"TEXT": {"content": [text], "shape": [1]}} for text in texts]}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def run(
    found: Installation,
    url: str,
    protocol: str,
    model: str,
    input_data: Path,
    concurrency: int,
    csv_path: Path,
    batch: int = 1,
    headers: Mapping[str, str] | None = None,
    parameters: Mapping[str, int | float] | None = None,
    measurement: Measurement = Measurement(),
    extra_args: Sequence[str] = (),
) -> Result:
    """Measure `model` with `concurrency` requests in flight, `batch` texts each; parse the CSV (`csv_path`).

    `headers`: the server's admin key (`Server.admin_headers(protocol)`), needed for the statistics API.
    `parameters`: the request parameters (search settings), sent with every request. perf_analyzer stops at the
    first failed request and exits non-zero, so a Result means every request it sent succeeded."""
    if protocol not in ("http", "grpc"):
        raise PerfAnalyzerError(f"protocol must be http or grpc, not {protocol!r}")
    if parameters and protocol != "grpc":
        raise PerfAnalyzerError(
            f"perf_analyzer {VERSION} sends request parameters ({', '.join(parameters)}) over gRPC only; "
            "measure with protocol grpc or without search overrides"
        )
    cmd = [str(found.binary), "-m", model, "-i", protocol, "-u", url, "--input-data", str(input_data)]
    cmd += ["-b", str(int(batch)), "--sync", "-f", str(csv_path), "--verbose-csv"]
    cmd += ["-p", str(int(measurement.interval_ms)), "-s", f"{measurement.stability_percentage:g}"]
    cmd += ["-r", str(int(measurement.max_trials))]
    # start:end:step with an explicit end: one client thread per request in flight (else at most --max-threads)
    cmd += ["--concurrency-range", f"{int(concurrency)}:{int(concurrency)}:1"]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}:{value}"]
    for name, value in (parameters or {}).items():
        kind = "int" if isinstance(value, int) and not isinstance(value, bool) else "double"
        cmd += ["--request-parameter", f"{name}:{value}:{kind}"]
    cmd += list(extra_args)
    csv_path.unlink(missing_ok=True)
    timeout = measurement.timeout_s()
    try:
        proc = subprocess.run(cmd, env=found.env(), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise PerfAnalyzerError(
            f"perf_analyzer did not finish within {timeout:.0f} s ({model} {protocol} concurrency {concurrency})"
        ) from exc
    if proc.returncode != 0 or not csv_path.is_file():
        raise PerfAnalyzerError(_failure(proc, model, protocol, measurement))
    rows = parse_csv(csv_path)
    if len(rows) != 1 or rows[0].concurrency != concurrency:
        raise PerfAnalyzerError(f"{csv_path}: expected one row for concurrency {concurrency}, got {rows}")
    count = REQUEST_COUNT.search(proc.stdout)
    return Result(replace(rows[0], requests=int(count.group(1)) if count else None), csv_path, cmd)


def _failure(proc: subprocess.CompletedProcess, model: str, protocol: str, measurement: Measurement) -> str:
    """perf_analyzer's own reason in one line, with the fix where we know it."""
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    if any(ln.startswith("Usage:") for ln in lines):  # an option it refused: its reason precedes the usage text
        lines = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("Usage:"))]
    picked = (ln for ln in lines if "had error" in ln or ln.lower().startswith("error"))
    reason = next(picked, None) or (lines[-1] if lines else "no output")
    fix = ""
    if "stable measurement" in reason:
        fix = (
            f" (windows of {measurement.interval_ms} ms never agreed within {measurement.stability_percentage:g}%: "
            "a busy machine; lengthen the window or widen the stability percentage)"
        )
    elif "restricted" in reason or "not served on this port" in reason:
        fix = " (the statistics API needs the admin key; over HTTP, Triton's own listener: ServerInfo.triton_http_url)"
    return f"perf_analyzer failed on {model} over {protocol} (exit {proc.returncode}): {reason}{fix}"


def parse_csv(path: Path) -> list[Row]:
    """The rows of a CSV written by `perf_analyzer -f` (with or without --verbose-csv)."""
    try:
        with path.open(newline="") as fh:
            records = list(csv.DictReader(fh))
    except OSError as exc:
        raise PerfAnalyzerError(f"cannot read perf_analyzer's CSV {path}: {exc}") from exc
    needed = [CONCURRENCY, THROUGHPUT, SERVER_QUEUE, SERVER_INFER, *LATENCY_COLUMNS.values()]
    if not records:
        raise PerfAnalyzerError(f"perf_analyzer's CSV {path} has no rows")
    missing = [c for c in needed if c not in records[0]]
    if missing:
        raise PerfAnalyzerError(f"perf_analyzer's CSV {path} lacks the columns {missing} (has {list(records[0])})")
    rows = []
    for record in records:
        try:
            latency = {key: float(record[column]) / 1e3 for key, column in LATENCY_COLUMNS.items()}
            if record.get(AVG_LATENCY):
                latency["mean"] = float(record[AVG_LATENCY]) / 1e3
            rows.append(
                Row(
                    concurrency=int(record[CONCURRENCY]),
                    inferences_per_s=float(record[THROUGHPUT]),
                    latency_ms=latency,
                    server_queue_ms=float(record[SERVER_QUEUE]) / 1e3,
                    server_compute_infer_ms=float(record[SERVER_INFER]) / 1e3,
                )
            )
        except (TypeError, ValueError) as exc:
            raise PerfAnalyzerError(f"perf_analyzer's CSV {path} has a malformed row {record}: {exc}") from exc
    return rows


# ---------------------------------------------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m serve.bench.perf_analyzer",
        description=f"Install NVIDIA's perf_analyzer {VERSION} (tritonclient wheel + libb64 + libcudart) into a "
        f"cache directory and check that it starts. Cache: --cache-dir, else ${ENV_DIR}, else "
        "$ZOO_CACHE/perf_analyzer (default ~/.cache/attention_zoo/perf_analyzer).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inst = commands.add_parser("install", help="download and extract once (idempotent), then run --version")
    inst.add_argument("--cache-dir", default=None, help=f"install here instead of ${ENV_DIR} / the zoo cache")
    args = parser.parse_args(argv)
    with one_line_errors(ServeError):
        found = install(args.cache_dir)
        print(f"perf_analyzer {found.version}: {found.binary}")
        print(f"run it with: {found.shell_command()} -m <model> ...")


if __name__ == "__main__":
    main()
