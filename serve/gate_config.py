"""What the gate's two fronts share (serve/gate_http.py, serve/gate_grpc.py): its configuration and the words of its
answers while Triton cannot be reached (the calls themselves: serve/upstreams.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from serve.served_models import ServedModel

RESTARTING = "tritonserver is not reachable (restarting after a crash?); retry in a few seconds"
UNREACHABLE = ("failed to connect", "connection refused", "socket closed", "connection reset", "unavailable for")
ADMIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # an admin key the gate passes on (Triton checks it)


@dataclass(frozen=True)
class GateConfig:
    """Where the gate listens and forwards (all on loopback: one HTTP and one gRPC listener per tritonserver
    replica), what it serves and its log."""

    http_port: int
    triton_http_ports: tuple[int, ...]
    grpc_port: int | None
    triton_grpc_ports: tuple[int, ...] | None
    max_body_bytes: int
    # Triton's calls run to their end whatever the client does (a client's deadline passed on would cancel them
    # inside Triton, the path that crashed 2.51): nginx's limit on Triton's answer bounds them instead
    upstream_timeout_s: float
    models: dict[str, ServedModel]
    log: str
    nginx_log_port: int | None = None  # nginx's error log arrives here as syslog (loopback UDP) …
    nginx_log: str | None = None  # … and is written here, repeats collapsed (serve/log_collapse.py)
    metrics_port: int | None = None  # GET /metrics: every replica's page merged (serve/gate_metrics.py) …
    triton_metrics_ports: tuple[int, ...] = ()  # … read from each replica's own metrics listener

    @classmethod
    def read(cls, path: Path) -> GateConfig:
        raw = json.loads(path.read_text())
        grpc = raw["triton_grpc_ports"]
        return cls(
            **{
                **raw,
                "triton_http_ports": tuple(raw["triton_http_ports"]),
                "triton_grpc_ports": None if grpc is None else tuple(grpc),
                "triton_metrics_ports": tuple(raw.get("triton_metrics_ports", ())),
                "models": {n: ServedModel.from_json(m) for n, m in raw["models"].items()},
            }
        )

    def write(self, path: Path) -> None:
        raw = {**self.__dict__, "models": {n: m.to_json() for n, m in self.models.items()}}
        path.write_text(json.dumps(raw, indent=1))
