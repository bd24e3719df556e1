"""How the pytriton wheel's `tritonserver` is launched (zoo/DESIGN.md §6 done for the user): the backend directory
of symlinks, the environment, the checked repository, the command line with its admin key, and the log.

Why apart from the server (serve/server.py): the wheel's binary works only with a backend directory of *symlinks*
(copies break the stub's `$ORIGIN` library lookup), with the venv's `bin` first on PATH and libpython's directory on
LD_LIBRARY_PATH (or the Python stub mixes interpreters), and with pinned memory off on a CPU-only machine. That is
what one launch needs; keeping a server up (readiness, the proxy, the gate, supervision, stopping) is server.py's.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import sysconfig
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serve import child
from serve.errors import ServerError
from serve.server_settings import ServerSettings, TritonPorts, grpc_proxied

SHM_PREFIX_ARG = "--backend-config=python,shm-region-prefix-name="
LOGS_KEPT = 5  # server.log of this start, server.log.1 of the one before, … server.log.5
ADMIN_KEY_FILE = "admin_key"  # in the state dir, mode 0600
ADMIN_HEADER = "zoo-admin-key"  # HTTP header that unlocks the restricted APIs
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"  # the gRPC metadata key: Triton prefixes it
# Everything a translation client does not need: registering shared memory (a published 2.51 crash vector),
# loading/unloading models, log verbosity and tracing (an unrotated log a client could flood), statistics.
RESTRICTED_APIS = ("shared-memory", "model-repository", "logging", "trace", "statistics")


def wheel_dir() -> Path:
    """The tritonserver tree inside the nvidia-pytriton wheel."""
    try:  # imported here: an optional dependency (Linux x86_64 only); missing, it is a ServerError, not an ImportError
        import pytriton
    except ImportError as exc:
        raise ServerError(
            "nvidia-pytriton is not installed; `pip install nvidia-pytriton==0.7.0` "
            "(Linux x86_64; it bundles tritonserver with the Python backend)"
        ) from exc
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise ServerError(f"{root}/bin/tritonserver is missing; reinstall nvidia-pytriton==0.7.0")
    return root


def backend_dir(state_dir: Path) -> Path:
    """`<state>/backends/python/` with symlinks to the wheel's backend library, utils and matching stub."""
    root = wheel_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {
        "libtriton_python.so": root / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": root / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": root / "python_backend_stubs" / version / "triton_python_backend_stub",
    }
    for src in sources.values():
        if not src.is_file():
            raise ServerError(
                f"{src} is missing from the pytriton wheel (no Python {version} stub?); "
                "use Python 3.8–3.13 and reinstall nvidia-pytriton==0.7.0"
            )
    target = state_dir / "backends" / "python"
    target.mkdir(parents=True, exist_ok=True)
    for name, src in sources.items():
        link = target / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)
    return target.parent


def server_env() -> dict[str, str]:
    """PATH with this interpreter's bin first, LD_LIBRARY_PATH with libpython's dir (§6)."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in [libdir, env.get("LD_LIBRARY_PATH", "")] if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # ORT sets its own pools; keep numpy/BLAS in the stubs single-threaded
    return memory_returning_env(env)


def memory_returning_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with glibc told to give large buffers back. glibc keeps freed memory in per-thread arenas and raises its
    mmap threshold after the first large free, so request buffers stayed resident: tritonserver's 2 MB gRPC
    messages took it from 36 MB to a ~545 MB plateau (issue 61), the gate's 4 MB ones from 80 to 667 MB (issue 84).
    A fixed threshold maps every buffer over 256 kB on its own and unmaps it when freed; fewer arenas keep less of
    the rest. Settings already in `env` win."""
    env = dict(env)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(256 << 10))
    env.setdefault("MALLOC_ARENA_MAX", "2")
    return env


def check_repository(repo: Path) -> list[str]:
    """Model names of a repository, after parsing every config.pbtxt (a clear error before Triton's)."""
    if not repo.is_dir():
        raise ServerError(
            f"model repository {repo} does not exist; write one with "
            "`python -m serve.repository export_dir=<export> repo=<dir>`"
        )
    names = []
    for model_dir in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config = model_dir / "config.pbtxt"
        if not config.is_file():
            raise ServerError(
                f"{model_dir} has no config.pbtxt, so {repo} is not a valid model repository; "
                "remove the directory or re-run serve.repository"
            )
        try:
            text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
        except text_format.ParseError as exc:
            raise ServerError(f"{config} is invalid: {exc}") from exc
        if not any(v.is_dir() and v.name.isdigit() for v in model_dir.iterdir()):
            raise ServerError(f"{model_dir} has no numeric version directory (e.g. {model_dir}/1)")
        names.append(model_dir.name)
    if not names:
        raise ServerError(f"{repo} contains no models; write some with `python -m serve.repository`")
    return names


NOISE = ("CudaDriverHelper", "Unable to allocate pinned system memory")  # harmless on a CPU-only machine
LOAD_FAILURE = re.compile(r"failed to load '([^']+)' version (\d+): (.*)")
# Triton refusing a KIND_GPU instance group (no GPU, or not the ids asked for): its words, and ours for the fix
GPU_REFUSED = re.compile(r"unsupported gpu id|has kind KIND_GPU but|no GPUs are available|does not support GPUs")
GPU_FIX = (
    "the repository asks for GPU instances (serve.repository … triton.provider=cuda) that this Triton cannot place: "
    "start it where Triton sees the GPUs of triton.gpus (nvidia-smi lists them), or write the repository again "
    "without triton.provider=cuda"
)


def log_errors(log: Path, limit: int = 12) -> str:
    """Why Triton failed, from its log: one line per model that failed to load (its reason without the Python
    traceback), else the error lines (bind errors, invalid repository); a GPU instance group Triton cannot place
    (a provider=cuda repository on a machine without those GPUs) gets the fix (`GPU_FIX`) added."""
    if not log.is_file():
        return ""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if not any(n in ln for n in NOISE)]
    failures = {}
    for ln in lines:
        match = LOAD_FAILURE.search(ln)
        if match:
            reason = match.group(3).split("\\n\\nAt:")[0].split("\\n")[0].rstrip('"')
            reason += f"; {GPU_FIX}" if GPU_REFUSED.search(reason) else ""
            failures[match.group(1)] = f"model {match.group(1)} (version {match.group(2)}) failed to load: {reason}"
    if failures:
        return "\n".join(failures.values())
    picked = [ln for ln in lines if ln.startswith("E") or "error" in ln.lower() or "failed" in ln.lower()]
    fix = [GPU_FIX] if any(GPU_REFUSED.search(ln) for ln in picked) else []
    return "\n".join([*(picked or lines)[-limit:], *fix])


def triton_command(
    repo: Path, state: Path, settings: ServerSettings, ports: TritonPorts, shm_prefix: str, admin_key: str | None
) -> list[str]:
    """One tritonserver's command line: the wheel's backend links, its listeners, no pinned memory (CPU-only
    machines), its shm prefix, strict readiness, and with `admin_key` (write_admin_key) RESTRICTED_APIS behind it.
    The key is on tritonserver's command line, so local users can read it with `ps`: this guards against network
    clients, not against other accounts on the same machine."""
    listen = "127.0.0.1" if settings.proxy is not None else settings.host  # HTTP and metrics: behind nginx
    listen_grpc = "127.0.0.1" if grpc_proxied(settings) else settings.host
    apis = ",".join(RESTRICTED_APIS)
    restriction = (
        [
            f"--http-restricted-api={apis}:{ADMIN_HEADER}={admin_key}",
            f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={admin_key}",
        ]
        if admin_key is not None
        else []
    )
    return [
        str(wheel_dir() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backend_dir(state)}",
        f"--http-address={listen}",
        f"--http-port={ports.http}",
        f"--grpc-address={listen_grpc}",
        f"--grpc-port={ports.grpc}",
        f"--allow-metrics={str(settings.metrics).lower()}",
        f"--metrics-address={listen}",
        f"--metrics-port={ports.metrics}",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        f"{SHM_PREFIX_ARG}{shm_prefix}",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--log-verbose={int(settings.log_verbose)}",
        *restriction,
        *settings.extra_args,
    ]


def rotate_log(log: Path, keep: int = LOGS_KEPT) -> None:
    """Move `log` to `log.1` (and `.1` to `.2` …, the oldest beyond `keep` dropped), so the log of the server
    before — the one that crashed, say — is still there to read after the next start."""
    for n in range(keep - 1, 0, -1):
        older = log.with_name(f"{log.name}.{n}")
        if older.exists():
            older.replace(log.with_name(f"{log.name}.{n + 1}"))
    if log.exists():
        log.replace(log.with_name(f"{log.name}.1"))


def launch_triton(cmd: list[str], log: Path, detach: bool) -> subprocess.Popen:
    """Run `cmd` with its output in a fresh `log` (the previous one rotated), in the environment the wheel's
    binary needs (server_env); `detach`: in its own session, so it outlives this process. Its working directory
    is the state dir (the log's): the Python stubs it starts put their working directory first on sys.path, so
    a library-named file wherever the server was started from would be imported in the library's place."""
    rotate_log(log)
    return relaunch_triton(cmd, log, detach)


def relaunch_triton(cmd: list[str], log: Path, detach: bool) -> subprocess.Popen:
    """Run `cmd` appending to `log` (after a crash: the log holds the crashed start's lines above)."""
    return child.spawn(cmd, log, detach, env=server_env(), cwd=log.parent)


def write_admin_key(state: Path) -> str:
    """A fresh admin key for RESTRICTED_APIS, written 0600 to `<state>/admin_key` before any server sees it; every
    replica of the server takes the same one."""
    key = secrets.token_urlsafe(24)
    path = state / ADMIN_KEY_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key
