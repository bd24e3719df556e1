"""Run the pytriton wheel's `tritonserver` on a model repository and keep it serving: start it (serve/launch.py
builds the command and environment the wheel's binary needs), wait until every model is ready, put the request
gate and nginx in front, let the supervisor restart what crashes, and stop it all with its shared-memory regions
(serve/shm.py: every server started here gets its own region prefix, so exactly its regions are removed).
ServerSettings and the ports are serve/server_settings.py.

State of a started server lives in `<repo>.serve/` (beside the repository — Triton would try to load any
directory inside it): `server.json` (pid, ports, shm prefix), `server.pid`, `server.log` (the logs of earlier
starts rotated to `server.log.1` … `.5`), `backends/`; it is also tritonserver's working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from serve.errors import ServerError
from serve.gate import start_gate
from serve.gate_config import GateConfig
from serve.launch import (
    ADMIN_HEADER,
    ADMIN_KEY_FILE,
    GRPC_ADMIN_HEADER,
    LOGS_KEPT,
    SHM_PREFIX_ARG,
    check_repository,
    launch_triton,
    log_errors,
    relaunch_triton,
    triton_command,
)
from serve.proxy import PROXY_DIR, ProxySettings, start_proxy, stop_proxy
from serve.served_models import ServedModel, served_models
from serve.server_settings import Ports, ServerSettings, free_udp_port, grpc_proxied, pick_ports
from serve.shm import OUR_SHM, clean_stale_shm, kill_stubs, remove_shm, remove_unmapped_shm
from serve.state_lock import StateLock, StateLocked, acquire, request_stop
from serve.supervisor import PROXY_LOG_BYTES, SERVER_LOG_BYTES, Supervisor

STATE_FILE = "server.json"


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


def state_dir_for(repo: Path) -> Path:
    repo = Path(repo).resolve()
    return repo.parent / f"{repo.name}.serve"


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
            triton_grpc_port=ports.triton_grpc if grpc_proxied(settings) else None,
            launcher_pid=os.getpid(),
        )
        server = cls(info, process)
        server._lock, server._command, server._settings = lock, command, settings
        try:  # from here on, any failure or interrupt stops what was started
            server.save_state()
            (state / "server.pid").write_text(f"{process.pid}\n")
            if settings.proxy is not None and ports.gate_http is not None:  # starts while Triton loads its models
                server.add_gate(ports, served_models(repo), settings.proxy)
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

    def add_gate(self, ports: Ports, models: dict[str, ServedModel], proxy: ProxySettings) -> None:
        """The validating gate (serve/gate.py) on loopback, forwarding to Triton's own listeners."""
        assert ports.gate_http is not None
        self._gate_config = GateConfig(
            http_port=ports.gate_http,
            triton_http_port=ports.triton_http,
            grpc_port=ports.gate_grpc,
            triton_grpc_port=ports.triton_grpc if ports.gate_grpc else None,
            max_body_bytes=int(proxy.max_body_mb * 1024 * 1024),
            upstream_timeout_s=float(proxy.upstream_timeout_s),
            models=models,
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
