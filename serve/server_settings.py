"""How a server is configured: ServerSettings (conf/start.yaml maps onto it) and the ports it listens on, the
requested ones checked free and the loopback ones behind the proxy picked.

Why apart from the server (serve/server.py): settings and ports are decided before anything is launched, and
`serve.start` and the tests read them without starting a server.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from serve.errors import ServerError
from serve.proxy import ProxySettings
from serve.supervisor import RestartPolicy


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
    # tritonservers, each with the repository's instances: while one restarts after a crash the others serve, and
    # its requests in flight are retried on them (serve/upstreams.py). None: DEFAULT_REPLICAS behind the gate, else 1
    replicas: int | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)


@dataclass(frozen=True)
class TritonPorts:
    """One tritonserver's own HTTP, gRPC and metrics listeners (loopback behind the proxy, else the public ports)."""

    http: int
    grpc: int
    metrics: int


@dataclass(frozen=True)
class Ports:
    """The ports a server listens on: the public ones, each tritonserver replica's own listeners, and the gate's."""

    http: int
    grpc: int
    metrics: int
    tritons: tuple[TritonPorts, ...]
    gate_http: int | None = None  # the gate's loopback listeners (None: no gate)
    gate_grpc: int | None = None
    gate_metrics: int | None = None


DEFAULT_REPLICAS = 2  # behind the gate: one crashed tritonserver is not an outage


def replica_count(settings: ServerSettings) -> int:
    """How many tritonservers the settings run (a ServerError naming the fix when they cannot)."""
    routed = settings.proxy is not None and settings.gate and settings.proxy.grpc
    if settings.replicas is None:
        return DEFAULT_REPLICAS if routed else 1
    if settings.replicas < 1 or (settings.replicas > 1 and not routed):
        raise ServerError(
            f"replicas={settings.replicas}: at least 1, and more than one only behind the gate that routes between "
            "them (proxy=true and proxy_grpc=true, the defaults); or set replicas=1"
        )
    return settings.replicas


def pick_ports(settings: ServerSettings) -> Ports:
    """The requested ports, checked free now (a busy one is a ServerError naming the fix), a free port for each
    0, and behind the proxy loopback ports for each replica's HTTP, metrics and gRPC listeners and the gate's."""
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
    http, grpc_port, metrics_port = ports["http_port"], ports["grpc_port"], ports["metrics_port"]
    replicas = replica_count(settings)
    if settings.proxy is None:  # Triton listens on the public ports itself
        return Ports(http, grpc_port, metrics_port, (TritonPorts(http, grpc_port, metrics_port),))
    metrics, grpc, gated = settings.metrics, grpc_proxied(settings), settings.gate
    per_replica = 1 + int(metrics) + int(grpc)
    inner = iter(free_ports(replicas * per_replica + 3 * int(gated), "127.0.0.1", avoid=set(ports.values())))
    tritons = tuple(
        TritonPorts(
            http=next(inner),
            metrics=next(inner) if metrics else metrics_port,  # a listener that is off takes no port
            grpc=next(inner) if grpc else grpc_port,
        )
        for _ in range(replicas)
    )
    gate_http, gate_grpc, gate_metrics = (next(inner), next(inner), next(inner)) if gated else (None, None, None)
    gate_grpc, gate_metrics = gate_grpc if grpc else None, gate_metrics if metrics else None
    return Ports(http, grpc_port, metrics_port, tritons, gate_http, gate_grpc, gate_metrics)


def grpc_proxied(settings: ServerSettings) -> bool:
    return settings.proxy is not None and settings.proxy.grpc
