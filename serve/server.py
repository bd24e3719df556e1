"""Run the pytriton wheel's `tritonserver` on a model repository (zoo/DESIGN.md §6 done for the user).

Why this module exists: the wheel's binary works only with a backend directory of *symlinks* (copies break the
stub's `$ORIGIN` library lookup), with the venv's `bin` first on PATH and libpython's directory on
LD_LIBRARY_PATH (or the Python stub mixes interpreters), and with pinned memory off on a CPU-only machine.
The Python backend keeps its tensors in /dev/shm regions that a crashed server leaves behind; every server
started here gets its own region prefix so exactly its regions are removed when it stops.

State of a started server lives in `<repo>.serve/` (beside the repository — Triton would try to load any
directory inside it): `server.json` (pid, ports, shm prefix), `server.pid`, `server.log` (the logs of earlier
starts rotated to `server.log.1` … `.5`), `backends/`; it is also tritonserver's working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serve.errors import ServeError
from serve.gate import GateConfig, start_gate
from serve.proxy import PROXY_DIR, ProxySettings, start_proxy, stop_proxy
from serve.request_limits import RequestLimits
from serve.state_lock import StateLock, StateLocked, acquire, request_stop
from serve.supervisor import PROXY_LOG_BYTES, SERVER_LOG_BYTES, RestartPolicy, Supervisor

SHM_DIR = Path("/dev/shm")
PYTHON_BACKEND_SHM = "triton_python_backend_shm_region"  # the python backend's default region prefix
SHM_PREFIX_ARG = "--backend-config=python,shm-region-prefix-name="
OUR_SHM = "zoo_triton_"  # prefix of the regions of servers started here (+ a random id per server)
STATE_FILE = "server.json"
LOGS_KEPT = 5  # server.log of this start, server.log.1 of the one before, … server.log.5
ADMIN_KEY_FILE = "admin_key"  # in the state dir, mode 0600
ADMIN_HEADER = "zoo-admin-key"  # HTTP header that unlocks the restricted APIs
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"  # the gRPC metadata key: Triton prefixes it
# Everything a translation client does not need: registering shared memory (a published 2.51 crash vector),
# loading/unloading models, log verbosity and tracing (an unrotated log a client could flood), statistics.
RESTRICTED_APIS = ("shared-memory", "model-repository", "logging", "trace", "statistics")


class ServerError(ServeError):
    """A server that cannot start or stop; the message names the cause and the fix."""


@dataclass
class ServerInfo:
    """What `serve.stop`, clients and tests need to know about a running server (saved as server.json)."""

    pid: int
    repo: str
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    shm_prefix: str
    log: str
    state_dir: str
    models: list[str] = field(default_factory=list)
    admin_key_file: str | None = None  # None: the non-inference APIs were left open (restrict=false)
    triton_http_port: int | None = None  # Triton's own HTTP listener (loopback) when nginx serves http_port
    proxy_pid: int | None = None
    metrics: bool = True  # Triton's Prometheus endpoint (GET /metrics on metrics_port) is on
    triton_metrics_port: int | None = None  # Triton's own metrics listener (loopback) when nginx serves metrics_port
    triton_grpc_port: int | None = None  # Triton's own gRPC listener (loopback) when nginx serves grpc_port
    gate_pid: int | None = None  # the validating gate between nginx and Triton (serve/gate.py)
    state: str = "starting"  # starting | ready | restarting (the supervisor restarts a crashed tritonserver)
    launcher_pid: int | None = None  # the process supervising it (serve.start, or whoever called Server.start)

    @property
    def http_url(self) -> str:
        """The HTTP endpoint clients use (nginx when proxied)."""
        return f"{self.host}:{self.http_port}"

    @property
    def triton_http_url(self) -> str:
        """Triton's own HTTP listener: behind the proxy a loopback port for this machine's admin tools (the
        proxy passes only inference, metadata and health)."""
        return f"127.0.0.1:{self.triton_http_port}" if self.triton_http_port else self.http_url

    @property
    def grpc_url(self) -> str:
        """The gRPC endpoint clients use (nginx when proxied)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def triton_grpc_url(self) -> str:
        """Triton's own gRPC listener (a loopback port behind the proxy)."""
        return f"127.0.0.1:{self.triton_grpc_port}" if self.triton_grpc_port else self.grpc_url

    @property
    def metrics_url(self) -> str:
        """Where Prometheus scrapes: `http://<metrics_url>/metrics` (nginx when proxied)."""
        return f"{self.host}:{self.metrics_port}"

    def url(self, protocol: str) -> str:
        return self.http_url if protocol == "http" else self.grpc_url


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
    # glibc keeps freed memory in per-thread arenas and raises its mmap threshold after the first large free, so
    # tritonserver's request buffers (2 MB gRPC messages) stayed resident: 36 MB grew to a ~545 MB plateau (issue
    # 61). A fixed threshold maps every buffer over 256 kB on its own and unmaps it when freed; fewer arenas
    # keep less of the rest.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(256 << 10))
    env.setdefault("MALLOC_ARENA_MAX", "2")
    return env


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on the port now. SO_REUSEADDR as Triton's own listeners use it, so the
    TIME_WAIT connections a just-stopped server leaves do not count as busy, while a listening socket does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A loopback UDP port free now (the gate's syslog listener for nginx's error log)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> list[int]:
    """`count` distinct ports free on `host` now, none of them in `avoid`. All are held bound while they are
    picked: picked one at a time (bind to port 0, close), the kernel may hand the same port out twice, and
    tritonserver then refuses to start ("cannot listen to HTTP requests and metrics requests at the same
    address and port")."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            if port not in avoid:
                ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


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


def state_dir_for(repo: Path) -> Path:
    repo = Path(repo).resolve()
    return repo.parent / f"{repo.name}.serve"


NOISE = ("CudaDriverHelper", "Unable to allocate pinned system memory")  # harmless on a CPU-only machine
LOAD_FAILURE = re.compile(r"failed to load '([^']+)' version (\d+): (.*)")


def log_errors(log: Path, limit: int = 12) -> str:
    """Why Triton failed, from its log: one line per model that failed to load (its reason without the Python
    traceback), else the error lines (bind errors, invalid repository)."""
    if not log.is_file():
        return ""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if not any(n in ln for n in NOISE)]
    failures = {}
    for ln in lines:
        match = LOAD_FAILURE.search(ln)
        if match:
            reason = match.group(3).split("\\n\\nAt:")[0].split("\\n")[0].rstrip('"')
            failures[match.group(1)] = f"model {match.group(1)} (version {match.group(2)}) failed to load: {reason}"
    if failures:
        return "\n".join(failures.values())
    picked = [ln for ln in lines if ln.startswith("E") or "error" in ln.lower() or "failed" in ln.lower()]
    return "\n".join((picked or lines)[-limit:])


def _http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie (exited, not yet reaped) is not alive
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True


def _is_tritonserver(pid: int) -> bool:
    try:
        return "tritonserver" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    """How `Server.start` runs tritonserver, with the defaults in one place (`serve.start` maps conf/start.yaml
    onto it). A port of 0 means any free port.

    `restrict` puts the non-inference APIs (RESTRICTED_APIS) behind a fresh admin key in `<state>/admin_key`
    (0600): requests without the `zoo-admin-key` header get 403 (HTTP), without the
    `triton-grpc-protocol-zoo-admin-key` metadata UNAVAILABLE "This protocol is restricted" (gRPC). `proxy`
    serves `http_port` (and with `proxy.grpc`, `grpc_port`) with nginx (serve/proxy.py) and moves Triton's own
    listeners to loopback ports; None lets Triton listen on the ports itself (exposed to the chunked-body crash
    of 2.51, compressed bodies inflated past every cap and unbounded gRPC messages). `metrics` serves Triton's
    Prometheus endpoint, GET /metrics on `metrics_port` (through nginx when proxied: Triton's metrics listener
    is the same HTTP library as its inference one)."""

    host: str = "127.0.0.1"  # bind address of HTTP, gRPC and metrics (0.0.0.0 serves other machines)
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    state_dir: str | Path | None = None  # server.json, pid, log, backend links; None: `<repo>.serve/` (state_dir_for)
    timeout: float = 180.0  # seconds to wait until every model is ready
    log_verbose: int = 0  # tritonserver's --log-verbose
    detach: bool = False  # start in its own session: the server outlives this process (stop it with serve.stop)
    extra_args: tuple[str, ...] = ()  # appended to tritonserver's command line
    restrict: bool = True  # RESTRICTED_APIS need the admin key
    proxy: ProxySettings | None = field(default_factory=ProxySettings)  # nginx in front; None: Triton listens itself
    metrics: bool = True  # Triton's Prometheus endpoint on metrics_port
    gate: bool = True  # behind the proxy, requests pass the validating gate (serve/gate.py) before Triton
    supervise: bool = True  # restart a crashed tritonserver / gate, rotate logs by size (serve/supervisor.py)
    restart: RestartPolicy = field(default_factory=RestartPolicy)


@dataclass(frozen=True)
class Ports:
    """The ports a server listens on: the public ones, and Triton's own HTTP, metrics and gRPC listeners
    (loopback ports behind the proxy, else the public ones)."""

    http: int
    grpc: int
    metrics: int
    triton_http: int
    triton_metrics: int
    triton_grpc: int
    gate_http: int | None = None  # the gate's loopback listeners (None: no gate)
    gate_grpc: int | None = None


def pick_ports(settings: ServerSettings) -> Ports:
    """The requested ports, checked free now (a busy one is a ServerError naming the fix), a free port for each
    0, and behind the proxy loopback ports for Triton's own HTTP, metrics and gRPC listeners."""
    host = settings.host
    ports = {"http_port": settings.http_port, "grpc_port": settings.grpc_port, "metrics_port": settings.metrics_port}
    for key, port in ports.items():
        if port and not port_free(port, host):
            raise ServerError(
                f"port {port} ({key}) on {host} is busy (another tritonserver? "
                f"`python -m serve.stop`); choose another with {key}=… or {key}=0 for a free one"
            )
    unset = [key for key, port in ports.items() if not port]
    ports.update(zip(unset, free_ports(len(unset), host, avoid=set(ports.values())), strict=True))
    proxied, metrics, grpc = settings.proxy is not None, settings.metrics, _grpc_proxied(settings)
    gated = proxied and settings.gate
    count = int(proxied) + int(proxied and metrics) + int(grpc)
    inner = free_ports(count + int(gated) + int(gated and grpc), "127.0.0.1", avoid=set(ports.values()))
    gate_ports = inner[count:]
    return Ports(
        http=ports["http_port"],
        grpc=ports["grpc_port"],
        metrics=ports["metrics_port"],
        triton_http=inner[0] if proxied else ports["http_port"],
        triton_metrics=inner[1] if proxied and metrics else ports["metrics_port"],
        triton_grpc=inner[count - 1] if grpc else ports["grpc_port"],
        gate_http=gate_ports[0] if gated else None,
        gate_grpc=gate_ports[1] if gated and grpc else None,
    )


def _grpc_proxied(settings: ServerSettings) -> bool:
    return settings.proxy is not None and settings.proxy.grpc


def claim_state_dir(repo: Path, state_dir: str | Path | None) -> tuple[Path, StateLock]:
    """The server's state dir, created, and its lock (serve/state_lock.py) held; a ServerError naming the running
    server's pids and ports while another start holds it, or while a server started from it still runs (its
    server.json, pid file and admin key would be overwritten)."""
    state = Path(state_dir).resolve() if state_dir else state_dir_for(repo)
    state.mkdir(parents=True, exist_ok=True)
    try:
        lock = acquire(state, repo)
    except StateLocked as exc:
        raise ServerError(str(exc)) from None
    previous = read_info(state)
    if previous and _alive(previous.pid) and _is_tritonserver(previous.pid):
        lock.release()
        raise ServerError(
            f"a server already runs from {state} (tritonserver pid {previous.pid}, HTTP {previous.http_url}, "
            f"gRPC {previous.grpc_url}); stop it with `python -m serve.stop repo={repo}`"
        )
    return state, lock


def repository_limits(repo: Path) -> RequestLimits:
    """The gate's limits for this repository: inputs and outputs per request at most what its models declare
    (at least 4), the other limits at their defaults (serve/request_limits.py says why each fits)."""
    inputs = outputs = 4
    for config in repo.glob("*/config.pbtxt"):
        parsed = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
        inputs, outputs = max(inputs, len(parsed.input)), max(outputs, len(parsed.output))
    return RequestLimits(max_inputs=inputs, max_outputs=outputs)


def triton_command(repo: Path, state: Path, settings: ServerSettings, ports: Ports, shm_prefix: str) -> list[str]:
    """tritonserver's command line: the wheel's backend links, the listeners, no pinned memory (CPU-only
    machines), this server's shm prefix, strict readiness, and the admin key when `settings.restrict`."""
    listen = "127.0.0.1" if settings.proxy is not None else settings.host  # HTTP and metrics: behind nginx
    listen_grpc = "127.0.0.1" if _grpc_proxied(settings) else settings.host
    return [
        str(wheel_dir() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backend_dir(state)}",
        f"--http-address={listen}",
        f"--http-port={ports.triton_http}",
        f"--grpc-address={listen_grpc}",
        f"--grpc-port={ports.triton_grpc}",
        f"--allow-metrics={str(settings.metrics).lower()}",
        f"--metrics-address={listen}",
        f"--metrics-port={ports.triton_metrics}",
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        f"{SHM_PREFIX_ARG}{shm_prefix}",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--log-verbose={int(settings.log_verbose)}",
        *(_restriction_args(state) if settings.restrict else ()),
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
    """Run `cmd` appending to `log` (O_APPEND: the supervisor may truncate it in place when it is too big)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(),
            start_new_session=detach,
            cwd=log.parent,
        )


class Server:
    """A tritonserver process started on a repository; `stop()` ends it and removes its shm regions."""

    def __init__(self, info: ServerInfo, process: subprocess.Popen | None = None) -> None:
        self.info = info
        self.process = process
        self.proxy_process: subprocess.Popen | None = None
        self.gate_process: subprocess.Popen | None = None
        self.supervisor: Supervisor | None = None
        self._lock: StateLock | None = None
        self._command: list[str] = []
        self._settings = ServerSettings()
        self._gate_config: GateConfig | None = None
        self._old_prefixes: list[str] = []

    @classmethod
    def start(
        cls,
        repo: str | Path,
        settings: ServerSettings | None = None,
        *,
        cancelled: Callable[[], bool] | None = None,
        **overrides: Any,
    ) -> Server:
        """Launch tritonserver on `repo`, wait until every model is ready, then put nginx in front of it.
        `overrides` are ServerSettings fields that replace those of `settings` (`Server.start(repo,
        http_port=0)`). `cancelled()` true while waiting (e.g. a signal arrived) stops the server and raises
        ServerError; any other failure once the process runs also stops it before the error propagates."""
        settings = replace(settings or ServerSettings(), **overrides)
        repo = Path(repo).resolve()
        models = check_repository(repo)
        state, lock = claim_state_dir(repo, settings.state_dir)
        try:
            ports = pick_ports(settings)
            clean_stale_shm()
            prefix = f"{OUR_SHM}{secrets.token_hex(4)}_"
            log = state / "server.log"
            command = triton_command(repo, state, settings, ports, prefix)
            process = launch_triton(command, log, settings.detach)
        except BaseException:
            lock.release()
            raise
        proxied = settings.proxy is not None
        info = ServerInfo(
            pid=process.pid,
            repo=str(repo),
            host=settings.host,
            http_port=ports.http,
            grpc_port=ports.grpc,
            metrics_port=ports.metrics,
            shm_prefix=prefix,
            log=str(log),
            state_dir=str(state),
            models=models,
            admin_key_file=str(state / ADMIN_KEY_FILE) if settings.restrict else None,
            triton_http_port=ports.triton_http if proxied else None,
            metrics=settings.metrics,
            triton_metrics_port=ports.triton_metrics if proxied and settings.metrics else None,
            triton_grpc_port=ports.triton_grpc if _grpc_proxied(settings) else None,
            launcher_pid=os.getpid(),
        )
        server = cls(info, process)
        server._lock, server._command, server._settings = lock, command, settings
        try:  # from here on, any failure or interrupt stops what was started
            server.save_state()
            (state / "server.pid").write_text(f"{process.pid}\n")
            if settings.proxy is not None and ports.gate_http is not None:  # starts while Triton loads its models
                server.add_gate(ports, repository_limits(repo), settings.proxy)
            server.wait_ready(settings.timeout, cancelled)
            if settings.proxy is not None:
                server.add_proxy(settings.proxy, ports, detach=settings.detach)
            server.set_state("ready")
            if settings.supervise:
                server.supervisor = Supervisor(server, state, log, settings.restart)
                server.supervisor.start()
        except BaseException:
            server.stop()
            raise
        return server

    def add_gate(self, ports: Ports, limits: RequestLimits, proxy: ProxySettings) -> None:
        """The validating gate (serve/gate.py) on loopback, forwarding to Triton's own listeners."""
        assert ports.gate_http is not None
        self._gate_config = GateConfig(
            http_port=ports.gate_http,
            triton_http_port=ports.triton_http,
            grpc_port=ports.gate_grpc,
            triton_grpc_port=ports.triton_grpc if ports.gate_grpc else None,
            max_body_bytes=int(proxy.max_body_mb * 1024 * 1024),
            limits=limits,
            log=str(Path(self.info.state_dir) / "gate.log"),
            nginx_log_port=free_udp_port(),
            nginx_log=str(Path(self.info.state_dir) / PROXY_DIR / "error.log"),
        )
        self.gate_process = start_gate(Path(self.info.state_dir), self._gate_config, detach=self._settings.detach)
        self.info.gate_pid = self.gate_process.pid
        self.save_state()

    # ------------------------------------------------------------------ what the supervisor needs (Supervised)
    def children(self) -> dict[str, Callable[[], int | None]]:
        watched: dict[str, Callable[[], int | None]] = {}
        if self.process is not None:
            watched["tritonserver"] = self.process.poll
        if self.gate_process is not None:
            watched["gate"] = self.gate_process.poll
        return watched

    def restart_child(self, name: str, cancelled: Callable[[], bool]) -> None:
        """Start the gate, or tritonserver (a fresh shm prefix: the dead server's stubs may still map the old
        regions), again with the same command, ports and admin key; wait until it serves."""
        state = Path(self.info.state_dir)
        if name == "gate":
            assert self._gate_config is not None
            self.gate_process = start_gate(state, self._gate_config, detach=self._settings.detach)
            self.info.gate_pid = self.gate_process.pid
            self.save_state()
            return
        old = self.info.shm_prefix
        prefix = f"{OUR_SHM}{secrets.token_hex(4)}_"
        self._command = [a.replace(old, prefix) if a.startswith(SHM_PREFIX_ARG) else a for a in self._command]
        self._old_prefixes.append(old)
        kill_stubs(old)  # the dead server's stubs: they would keep its regions mapped
        remove_unmapped_shm(old)
        self.process = relaunch_triton(self._command, Path(self.info.log), self._settings.detach)
        self.info.pid, self.info.shm_prefix = self.process.pid, prefix
        self.save_state()
        (state / "server.pid").write_text(f"{self.process.pid}\n")
        try:
            self.wait_ready(self._settings.timeout, cancelled)
        except BaseException:
            stop_pid(self.process.pid, 10, self.process)
            raise

    def set_state(self, state: str) -> None:
        """Record the serving state in server.json (starting, ready, restarting) for clients and operators."""
        self.info.state = state
        if (Path(self.info.state_dir) / STATE_FILE).exists():
            self.save_state()

    def log_paths(self) -> dict[Path, tuple[int, int]]:
        state = Path(self.info.state_dir)
        proxy_logs = (state / PROXY_DIR / "error.log", state / PROXY_DIR / "stdout.log", state / "gate.stdout.log")
        return {Path(self.info.log): (SERVER_LOG_BYTES, LOGS_KEPT), **{p: (PROXY_LOG_BYTES, 3) for p in proxy_logs}}

    def finished(self) -> bool:
        """Whether serving has ended for good: the supervisor gave up watching (stopped), or, unsupervised,
        tritonserver exited."""
        if self.supervisor is not None:
            return not self.supervisor.is_alive()
        return not self.alive()

    def save_state(self) -> None:
        """Write server.json: what `serve.stop`, clients and the next start read."""
        (Path(self.info.state_dir) / STATE_FILE).write_text(json.dumps(asdict(self.info), indent=1))

    def add_proxy(self, proxy: ProxySettings, ports: Ports, detach: bool = False) -> None:
        """nginx on the public HTTP (and metrics) port, passing to Triton's loopback listeners; its pid is
        saved with the server's, so stopping the server stops it."""
        metrics = (ports.metrics, ports.triton_metrics) if self.info.metrics else None
        grpc = (ports.grpc, ports.triton_grpc) if proxy.grpc else None
        state, host = Path(self.info.state_dir), self.info.host
        if ports.gate_http is not None:  # nginx → gate → Triton
            grpc = (ports.grpc, ports.gate_grpc) if proxy.grpc and ports.gate_grpc else grpc
            upstream = ports.gate_http
        else:
            upstream = ports.triton_http
        log_port = self._gate_config.nginx_log_port if self._gate_config is not None else None
        nginx = start_proxy(
            state, host, ports.http, upstream, proxy, detach=detach, metrics=metrics, grpc=grpc, log_port=log_port
        )
        self.proxy_process, self.info.proxy_pid = nginx, nginx.pid
        self.save_state()

    def wait_ready(self, timeout: float, cancelled: Callable[[], bool] | None = None) -> None:
        """Poll readiness; if the process dies, raise with Triton's own reason from the log."""
        deadline = time.monotonic() + timeout
        url = f"http://{self.info.triton_http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if cancelled is not None and cancelled():
                raise ServerError("interrupted while waiting for tritonserver to become ready; stopped it")
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"tritonserver exited with code {self.process.returncode} while starting "
                    f"(log: {self.info.log}):\n{log_errors(Path(self.info.log))}"
                )
            with contextlib.suppress(OSError):
                if _http_get(url)[0] == 200:
                    return
            time.sleep(0.25)
        raise ServerError(
            f"tritonserver was not ready after {timeout:.0f} s (log: {self.info.log}):\n"
            f"{log_errors(Path(self.info.log))}"
        )

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """The header (HTTP) or metadata (gRPC) that unlocks the restricted APIs ({} when unrestricted)."""
        return admin_headers(self.info, protocol)

    def ready(self) -> bool:
        with contextlib.suppress(OSError):
            return _http_get(f"http://{self.info.http_url}/v2/health/ready")[0] == 200
        return False

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return _alive(self.info.pid)

    def stop(self, timeout: float = 30.0) -> int | None:
        """The supervisor first (nothing is restarted; from another process: the stop marker), the proxy (no new
        requests), the gate, then SIGTERM to Triton (it unloads models and exits), SIGKILL after `timeout`; then
        remove its shm regions and release the state's lock."""
        state = Path(self.info.state_dir)
        with contextlib.suppress(OSError):
            request_stop(state)
        if self.supervisor is not None:
            self.supervisor.stop(timeout)
        if self.info.proxy_pid:
            stop_proxy(self.info.proxy_pid, state)
            if self.proxy_process is not None:
                self.proxy_process.wait(timeout)
        if self.info.gate_pid:
            stop_gate(self.info.gate_pid, self.gate_process)
        code = stop_pid(self.info.pid, timeout, self.process)
        for prefix in (*self._old_prefixes, self.info.shm_prefix):
            kill_stubs(prefix)  # none outlives its server
            remove_shm(prefix)
        if self._lock is not None:
            self._lock.release()
        with contextlib.suppress(FileNotFoundError):
            (Path(self.info.state_dir) / STATE_FILE).unlink()
        with contextlib.suppress(FileNotFoundError):
            (Path(self.info.state_dir) / "server.pid").unlink()
        return code

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _restriction_args(state: Path) -> list[str]:
    """A fresh admin key (written 0600 before the server sees it) and the flags restricting RESTRICTED_APIS on
    HTTP and gRPC. The key is on tritonserver's command line, so local users can read it with `ps`: this guards
    against network clients, not against other accounts on the same machine."""
    key = secrets.token_urlsafe(24)
    path = state / ADMIN_KEY_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    apis = ",".join(RESTRICTED_APIS)
    return [
        f"--http-restricted-api={apis}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={key}",
    ]


def admin_headers(info: ServerInfo, protocol: str = "http") -> dict[str, str]:
    """{header: key} for a server started with restricted APIs, read from its 0600 key file: ADMIN_HEADER
    over HTTP, GRPC_ADMIN_HEADER as gRPC metadata."""
    if not info.admin_key_file:
        return {}
    try:
        key = Path(info.admin_key_file).read_text().strip()
    except OSError as exc:
        raise ServerError(
            f"cannot read the admin key {info.admin_key_file} ({exc}); run as the user who started the server"
        ) from exc
    return {GRPC_ADMIN_HEADER if protocol == "grpc" else ADMIN_HEADER: key}


def stop_gate(pid: int, process: subprocess.Popen | None = None, timeout: float = 10.0) -> None:
    """SIGTERM to the gate (SIGKILL after `timeout`); a pid no longer running `serve.gate` is never signalled."""
    if process is None:
        try:
            if b"serve.gate" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        except OSError:
            return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (process.poll() is not None) if process is not None else not _alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if process is not None:
        process.wait(5)


def stop_pid(pid: int, timeout: float, process: subprocess.Popen | None = None) -> int | None:
    if process is None and not (_alive(pid) and _is_tritonserver(pid)):
        return None  # gone already (or the pid was reused by something else: never signal that)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None:
            if process.poll() is not None:
                return process.returncode
        elif not _alive(pid):
            return 0
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if process is not None:
        return process.wait(10)
    return -9


def read_info(state_dir: Path) -> ServerInfo | None:
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        return None
    return ServerInfo(**json.loads(path.read_text()))


def _mapped_shm() -> set[str]:
    """/dev/shm files mapped by any process we can inspect (in use: never remove those)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                if "/dev/shm/" in line:
                    mapped.add(line.split("/dev/shm/", 1)[1].split(" (deleted)")[0].strip())
    return mapped


def kill_stubs(prefix: str) -> list[int]:
    """SIGKILL the Python-backend stubs of a server's shm `prefix` (their region argument starts with it): a
    stub whose tritonserver died usually exits by itself, but one was seen running 40 minutes after its server
    was gone, holding 135 MB and its shm region. Returns the pids killed."""
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (
                argv
                and argv[0].endswith(b"triton_python_backend_stub")
                and any(a.startswith(prefix.encode()) for a in argv[1:])
            ):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def remove_unmapped_shm(prefix: str) -> list[str]:
    """Remove this prefix's regions that no process maps (a dead server's; its stubs may still hold some)."""
    mapped = _mapped_shm()
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        if path.name not in mapped:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
    return removed


def remove_shm(prefix: str) -> list[str]:
    """Remove this server's regions (it has exited, so nothing maps them any more)."""
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed


def clean_stale_shm(min_age_s: float = 30.0) -> list[str]:
    """Remove Python-backend regions left by crashed servers: ours (uid), unmapped, older than `min_age_s`."""
    mapped = _mapped_shm()
    removed = []
    now = time.time()
    for pattern in (f"{PYTHON_BACKEND_SHM}*", f"{OUR_SHM}*"):
        for path in SHM_DIR.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                if st.st_uid == os.getuid() and path.name not in mapped and now - st.st_mtime > min_age_s:
                    path.unlink()
                    removed.append(path.name)
    return removed
