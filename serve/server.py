"""Run the pytriton wheel's `tritonserver` on a model repository and keep it serving: start its replicas
(serve/triton_replica.py; serve/launch.py builds the command and environment the wheel's binary needs), wait until
every model is ready, put the request gate and nginx in front, let the supervisor restart what crashes, and stop it
all with its shared-memory regions (serve/shm.py: every tritonserver started here gets its own region prefix, so
exactly its regions are removed). ServerSettings and the ports are serve/server_settings.py.

Why replicas: tritonserver 2.51 can be crashed, and a restart takes seconds. With two (the default) behind the gate,
the other serves meanwhile and the gate retries the dead one's requests there (serve/upstreams.py).

State of a started server lives in `<repo>.serve/` (beside the repository — Triton would try to load any
directory inside it): `server.json` (pids, ports, shm prefixes), `server.pid`, `server.log` (the supervisor's
account: crashes and restarts), `triton.<i>.log` (each replica's own; those of earlier starts rotated to
`triton.<i>.log.1` … `.5`), `backends/`; it is also tritonserver's working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from serve import child
from serve.errors import ServerError
from serve.gate import GATE_LOG, start_gate
from serve.gate_config import GateConfig
from serve.launch import (
    ADMIN_HEADER,
    ADMIN_KEY_FILE,
    GRPC_ADMIN_HEADER,
    LOGS_KEPT,
    check_repository,
    triton_command,
    write_admin_key,
)
from serve.proxy import PROXY_DIR, ProxySettings, start_proxy, stop_proxy
from serve.served_models import ServedModel, served_models
from serve.server_settings import Ports, ServerSettings, free_udp_port, pick_ports
from serve.shm import clean_stale_shm, kill_stubs, remove_shm
from serve.state_lock import StateLock, StateLocked, acquire, request_stop
from serve.supervisor import PROXY_LOG_BYTES, SERVER_LOG_BYTES, Supervisor
from serve.triton_replica import TritonInfo, TritonReplica, fresh_shm_prefix, http_get

STATE_FILE = "server.json"
TRITON = "tritonserver"  # what a replica's command line names: a pid that no longer runs it is never signalled


@dataclass
class ServerInfo:
    """What `serve.stop`, clients and tests need to know about a running server (saved as server.json)."""

    repo: str
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log: str  # the supervisor's account (crashes, restarts); each replica logs to its own (TritonInfo.log)
    state_dir: str
    tritons: list[TritonInfo] = field(default_factory=list)  # the replicas, in order
    models: list[str] = field(default_factory=list)
    admin_key_file: str | None = None  # None: the non-inference APIs were left open (restrict=false)
    proxied: bool = True  # nginx serves the public ports; the replicas listen on loopback ports
    proxy_pid: int | None = None
    metrics: bool = True  # Triton's Prometheus endpoint (GET /metrics on metrics_port) is on
    gate_pid: int | None = None  # the validating gate between nginx and Triton (serve/gate.py)
    state: str = "starting"  # starting | ready | degraded (a replica restarting, the others serve) | restarting
    launcher_pid: int | None = None  # the process supervising it (serve.start, or whoever called Server.start)

    @classmethod
    def from_json(cls, raw: dict) -> ServerInfo:
        if "pid" in raw:  # written before replicas (one tritonserver, its fields at the top): read as one replica
            old = {k: raw.pop(k, None) for k in ("pid", "shm_prefix", "triton_http_port", "triton_grpc_port")}
            metrics = raw.pop("triton_metrics_port", None)
            raw["proxied"] = old["triton_http_port"] is not None
            raw["tritons"] = [
                {
                    "pid": old["pid"],
                    "http_port": old["triton_http_port"] or raw["http_port"],
                    "grpc_port": old["triton_grpc_port"] or raw["grpc_port"],
                    "metrics_port": metrics or raw["metrics_port"],
                    "shm_prefix": old["shm_prefix"],
                    "log": raw["log"],
                }
            ]
        return cls(**{**raw, "tritons": [TritonInfo(**t) for t in raw.get("tritons", [])]})

    @property
    def pids(self) -> list[int]:
        """Each replica's tritonserver pid, in order."""
        return [t.pid for t in self.tritons]

    @property
    def http_url(self) -> str:
        """The HTTP endpoint clients use (nginx when proxied)."""
        return f"{self.host}:{self.http_port}"

    @property
    def triton_http_url(self) -> str:
        """The first replica's own HTTP listener: behind the proxy a loopback port for this machine's admin tools
        (the proxy passes only inference, metadata and health); its statistics are that replica's."""
        return f"127.0.0.1:{self.tritons[0].http_port}" if self.proxied else self.http_url

    @property
    def grpc_url(self) -> str:
        """The gRPC endpoint clients use (nginx when proxied)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def triton_grpc_url(self) -> str:
        """The first replica's own gRPC listener (a loopback port behind the proxy)."""
        return f"127.0.0.1:{self.tritons[0].grpc_port}" if self.proxied else self.grpc_url

    @property
    def metrics_url(self) -> str:
        """Where Prometheus scrapes: `http://<metrics_url>/metrics` (nginx when proxied)."""
        return f"{self.host}:{self.metrics_port}"

    def url(self, protocol: str) -> str:
        return self.http_url if protocol == "http" else self.grpc_url


def state_dir_for(repo: Path) -> Path:
    repo = Path(repo).resolve()
    return repo.parent / f"{repo.name}.serve"


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
    running = [pid for pid in previous.pids if child.pid_alive(pid) and child.runs(pid, TRITON)] if previous else []
    if previous and running:
        lock.release()
        raise ServerError(
            f"a server already runs from {state} (tritonserver pid {', '.join(map(str, running))}, "
            f"HTTP {previous.http_url}, "
            f"gRPC {previous.grpc_url}); stop it with `python -m serve.stop repo={repo}`"
        )
    return state, lock


class Server:
    """tritonserver replicas started on a repository (with the gate and nginx in front); `stop()` ends them all and
    removes their shm regions."""

    def __init__(self, info: ServerInfo, replicas: list[TritonReplica] | None = None) -> None:
        self.info = info
        self.replicas = replicas or []
        self.proxy_process: subprocess.Popen | None = None
        self.gate_process: subprocess.Popen | None = None
        self.supervisor: Supervisor | None = None
        self._lock: StateLock | None = None
        self._settings = ServerSettings()
        self._gate_config: GateConfig | None = None
        self._saving = threading.Lock()

    @classmethod
    def start(
        cls,
        repo: str | Path,
        settings: ServerSettings | None = None,
        *,
        cancelled: Callable[[], bool] | None = None,
        **overrides: Any,
    ) -> Server:
        """Launch `settings.replicas` tritonservers on `repo`, wait until each has every model ready, then put the
        gate and nginx in front. `overrides` are ServerSettings fields that replace those of `settings`
        (`Server.start(repo, http_port=0)`). `cancelled()` true while waiting (e.g. a signal arrived) stops the
        server and raises ServerError; any other failure once a process runs also stops it before the error
        propagates."""
        settings = replace(settings or ServerSettings(), **overrides)
        repo = Path(repo).resolve()
        models = check_repository(repo)
        state, lock = claim_state_dir(repo, settings.state_dir)
        try:
            ports = pick_ports(settings)
            clean_stale_shm()
            key = write_admin_key(state) if settings.restrict else None
            replicas = [
                TritonReplica(
                    i,
                    triton_command(repo, state, settings, triton_ports, fresh_shm_prefix(), key),
                    triton_ports,
                    state / f"triton.{i}.log",
                    settings.detach,
                )
                for i, triton_ports in enumerate(ports.tritons)
            ]
        except BaseException:
            lock.release()
            raise
        info = ServerInfo(
            repo=str(repo),
            host=settings.host,
            http_port=ports.http,
            grpc_port=ports.grpc,
            metrics_port=ports.metrics,
            log=str(state / "server.log"),
            state_dir=str(state),
            models=models,
            admin_key_file=str(state / ADMIN_KEY_FILE) if settings.restrict else None,
            proxied=settings.proxy is not None,
            metrics=settings.metrics,
            launcher_pid=os.getpid(),
        )
        server = cls(info, replicas)
        server._lock, server._settings = lock, settings
        try:  # from here on, any failure or interrupt stops what was started
            for replica in replicas:
                replica.launch()
            server.save_state()
            if settings.proxy is not None and ports.gate_http is not None:  # starts while Triton loads its models
                server.add_gate(ports, served_models(repo), settings.proxy)
            for replica in replicas:
                replica.wait_ready(settings.timeout, cancelled)
            if settings.proxy is not None:
                server.add_proxy(settings.proxy, ports, detach=settings.detach)
            server.set_state("ready")
            if settings.supervise:
                server.supervisor = Supervisor(server, state, Path(info.log), settings.restart)
                server.supervisor.start()
        except BaseException:
            server.stop()
            raise
        return server

    def add_gate(self, ports: Ports, models: dict[str, ServedModel], proxy: ProxySettings) -> None:
        """The validating gate (serve/gate.py) on loopback, routing to every replica's own listeners."""
        assert ports.gate_http is not None
        self._gate_config = GateConfig(
            http_port=ports.gate_http,
            triton_http_ports=tuple(t.http for t in ports.tritons),
            grpc_port=ports.gate_grpc,
            triton_grpc_ports=tuple(t.grpc for t in ports.tritons) if ports.gate_grpc else None,
            max_body_bytes=int(proxy.max_body_mb * 1024 * 1024),
            upstream_timeout_s=float(proxy.upstream_timeout_s),
            models=models,
            log=str(Path(self.info.state_dir) / GATE_LOG),
            nginx_log_port=free_udp_port(),
            nginx_log=str(Path(self.info.state_dir) / PROXY_DIR / "error.log"),
            metrics_port=ports.gate_metrics,
            triton_metrics_ports=tuple(t.metrics for t in ports.tritons) if ports.gate_metrics else (),
        )
        self.gate_process = start_gate(Path(self.info.state_dir), self._gate_config, detach=self._settings.detach)
        self.info.gate_pid = self.gate_process.pid
        self.save_state()

    # ------------------------------------------------------------------ what the supervisor needs (Supervised)
    def children(self) -> dict[str, Callable[[], int | None]]:
        watched: dict[str, Callable[[], int | None]] = {r.name: r.poll for r in self.replicas if r.process}
        if self.gate_process is not None:
            watched["gate"] = self.gate_process.poll
        return watched

    def others_serving(self, name: str) -> bool:
        """Whether a replica other than `name` is up: the supervisor's back-off may then wait; else it restarts
        at once (never zero replicas serving for a back-off's sake)."""
        return name != "gate" and any(r.alive() for r in self.replicas if r.name != name)

    def restart_child(self, name: str, cancelled: Callable[[], bool]) -> None:
        """Start the gate, or a replica (a fresh shm prefix), again with the same command, ports and admin key;
        wait until it serves."""
        state = Path(self.info.state_dir)
        if name == "gate":
            assert self._gate_config is not None
            self.gate_process = start_gate(state, self._gate_config, detach=self._settings.detach)
            self.info.gate_pid = self.gate_process.pid
            self.save_state()
            return
        replica = next(r for r in self.replicas if r.name == name)
        replica.relaunch()
        self.save_state()
        try:
            replica.wait_ready(self._settings.timeout, cancelled)
        except BaseException:
            replica.stop(10)
            raise

    def set_state(self, state: str) -> None:
        """Record the serving state in server.json for clients and operators: `state` (starting, ready, restarting)
        as the supervisor says it; with replicas "ready" reads "degraded" while one of them is down and
        "restarting" while all are."""
        if state in ("ready", "restarting") and len(self.replicas) > 1:
            up = sum(r.alive() for r in self.replicas)
            state = "ready" if up == len(self.replicas) else "degraded" if up else "restarting"
        self.info.state = state
        if (Path(self.info.state_dir) / STATE_FILE).exists():
            self.save_state()

    def log_paths(self) -> dict[Path, tuple[int, int]]:
        state = Path(self.info.state_dir)
        proxy_logs = (state / PROXY_DIR / "error.log", state / PROXY_DIR / "stdout.log", state / "gate.stdout.log")
        logs = (Path(self.info.log), *(r.log for r in self.replicas))
        return {**{p: (SERVER_LOG_BYTES, LOGS_KEPT) for p in logs}, **{p: (PROXY_LOG_BYTES, 3) for p in proxy_logs}}

    def crash_log(self, name: str) -> Path | None:
        """The log whose tail the supervisor keeps when child `name` crashes (a replica's own)."""
        return next((r.log for r in self.replicas if r.name == name), None)

    def finished(self) -> bool:
        """Whether serving has ended for good: the supervisor gave up watching (stopped), or, unsupervised, every
        tritonserver exited."""
        if self.supervisor is not None:
            return not self.supervisor.is_alive()
        return not self.alive()

    def save_state(self) -> None:
        """Write server.json (what `serve.stop`, clients and the next start read) and server.pid (the replicas')."""
        state = Path(self.info.state_dir)
        with self._saving:  # restart threads of two replicas may save at once; readers see whole files
            self.info.tritons = [r.info() for r in self.replicas if r.process is not None]
            for name, text in ((STATE_FILE, json.dumps(asdict(self.info), indent=1)), ("server.pid", self._pids())):
                partial = state / f".{name}.partial"
                partial.write_text(text)
                partial.replace(state / name)

    def _pids(self) -> str:
        return "".join(f"{pid}\n" for pid in self.info.pids)

    def add_proxy(self, proxy: ProxySettings, ports: Ports, detach: bool = False) -> None:
        """nginx on the public HTTP (and metrics) port, passing to the gate (or, without it, to Triton's loopback
        listeners); its pid is saved with the server's, so stopping the server stops it. Metrics: the gate's merged
        page of every replica's (serve/gate_metrics.py), or without it Triton's own."""
        first = ports.tritons[0]
        metrics = (ports.metrics, ports.gate_metrics or first.metrics) if self.info.metrics else None
        grpc = (ports.grpc, first.grpc) if proxy.grpc else None
        state, host = Path(self.info.state_dir), self.info.host
        if ports.gate_http is not None:  # nginx → gate → Triton
            grpc = (ports.grpc, ports.gate_grpc) if proxy.grpc and ports.gate_grpc else grpc
            upstream = ports.gate_http
        else:
            upstream = first.http
        log_port = self._gate_config.nginx_log_port if self._gate_config is not None else None
        nginx = start_proxy(
            state, host, ports.http, upstream, proxy, detach=detach, metrics=metrics, grpc=grpc, log_port=log_port
        )
        self.proxy_process, self.info.proxy_pid = nginx, nginx.pid
        self.save_state()

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """The header (HTTP) or metadata (gRPC) that unlocks the restricted APIs ({} when unrestricted)."""
        return admin_headers(self.info, protocol)

    def ready(self) -> bool:
        with contextlib.suppress(OSError):
            return http_get(f"http://{self.info.http_url}/v2/health/ready")[0] == 200
        return False

    def alive(self) -> bool:
        """Whether any of its tritonservers runs."""
        if self.replicas:
            return any(r.alive() for r in self.replicas)
        return any(child.pid_alive(pid) for pid in self.info.pids)

    def stop(self, timeout: float = 30.0) -> int | None:
        """The supervisor first (nothing is restarted; from another process: the stop marker), the proxy (no new
        requests), the gate, then each tritonserver (SIGTERM: it unloads models and exits; SIGKILL after
        `timeout`) with its stubs and shm regions; then release the state's lock. Returns the first replica's exit
        code."""
        state = Path(self.info.state_dir)
        with contextlib.suppress(OSError):
            request_stop(state)
        if self.supervisor is not None:
            self.supervisor.stop(timeout)
        if self.info.proxy_pid:
            stop_proxy(self.info.proxy_pid, state, process=self.proxy_process)
        if self.info.gate_pid:
            child.stop(self.info.gate_pid, 10.0, self.gate_process, program="serve.gate")
        if self.replicas:
            codes = [r.stop(timeout) for r in self.replicas]
        else:  # stopped from another process (serve.stop): what server.json records
            codes = [child.stop(t.pid, timeout, program=TRITON) for t in self.info.tritons]
            for t in self.info.tritons:
                kill_stubs(t.shm_prefix)
                remove_shm(t.shm_prefix)
        if self._lock is not None:
            self._lock.release()
        with contextlib.suppress(FileNotFoundError):
            (state / STATE_FILE).unlink()
        with contextlib.suppress(FileNotFoundError):
            (state / "server.pid").unlink()
        return codes[0] if codes else None

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


def read_info(state_dir: Path) -> ServerInfo | None:
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        return None
    return ServerInfo.from_json(json.loads(path.read_text()))
