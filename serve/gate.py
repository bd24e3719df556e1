"""The front door between nginx and tritonserver: `python -m serve.gate <gate.json>` (started by Server.start).

Why it owns the protocol: tritonserver 2.51 dies on some legal KServe v2 requests, and three rounds of attacks each
found a new one (classification of a BYTES output, deep JSON, a `/./infer` path walking around the checks, gRPC
streams cancelled mid-answer; issues 61 and 84). So nothing a client wrote reaches Triton. Over HTTP the gate
answers only an allow-list of (method, canonical path) pairs — a path with `.`/`..` or empty segments, percent
escapes or a trailing slash is 404 here, never normalised by Triton — and over gRPC only the methods it names
(anything else: UNIMPLEMENTED). Inference requests are read with budgets that follow the served models
(serve/http_infer.py, serve/grpc_infer.py: a refused request costs what was read up to its first excess), checked
against the model (serve/infer_request.py) and re-encoded; metadata and health requests are rebuilt from the model
name and version. gRPC streams end at the gate: each message becomes a unary call to Triton, and a client that
cancels cancels nothing inside Triton — every upstream call runs to its end, its answer dropped. A request that was
in flight at two crashes within 10 minutes, unanswered in between, is refused for 10 minutes
(serve/crash_memory.py), so a client repeating a crashing request cannot keep Triton down. Behind the gate run one or
more tritonserver replicas: each call goes to the least busy one that is up and, when it broke off or could not be
reached, once more to another (serve/upstreams.py). The fronts are serve/gate_http.py and serve/gate_grpc.py; this
file runs them as a process.

nginx keeps what it does well (connection limits, body caps, timeouts, compressed bodies refused). While Triton is
down — every replica at once (the supervisor restarting them, serve/supervisor.py) — the gate answers 503 /
UNAVAILABLE "restarting; retry".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import logging.handlers
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from serve import child
from serve.errors import ServeError
from serve.gate_config import GateConfig
from serve.gate_grpc import grpc_server
from serve.gate_http import http_app
from serve.gate_metrics import metrics_app
from serve.launch import memory_returning_env
from serve.log_collapse import receive_syslog
from serve.upstreams import Upstreams

GATE_CONFIG = "gate.json"  # in the server's state dir
GATE_LOG = "gate.log"
GATE_LOG_BYTES = 4 << 20  # gate.log rotates at 4 MB, 3 kept


class GateError(ServeError, RuntimeError):
    """The gate could not start; the message names the cause and the fix."""


# ---------------------------------------------------------------------------------------------- the process
def give_back_memory() -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim): gRPC reads a message in many small
    buffers, which stay in the heap's free lists after a flood of 4 MB messages (the gate held 256 MB 30 s after
    one, against 80 MB idle); trimming every few seconds brings it back near idle."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


async def serve(config: GateConfig) -> None:
    """Run both fronts until SIGTERM / SIGINT."""
    from aiohttp import web

    upstreams = Upstreams.on_ports(
        list(config.triton_http_ports), config.triton_grpc_ports and list(config.triton_grpc_ports)
    )
    runner = web.AppRunner(http_app(config, upstreams), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", config.http_port, reuse_address=True)
    await site.start()
    metrics = None
    if config.metrics_port:
        metrics = web.AppRunner(metrics_app(config), access_log=None)
        await metrics.setup()
        await web.TCPSite(metrics, "127.0.0.1", config.metrics_port, reuse_address=True).start()
    grpc = grpc_server(config, upstreams) if config.grpc_port else None
    if grpc is not None:
        await grpc.start()
    nginx_log = None
    if config.nginx_log_port is not None and config.nginx_log is not None:
        transport, nginx_log = await receive_syslog(config.nginx_log_port, Path(config.nginx_log))
    logging.getLogger("serve.gate").warning("gate listening: HTTP %s, gRPC %s", config.http_port, config.grpc_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=5.0)
        if nginx_log is not None:  # a flood's summary line is written when its window ends, flood over or not
            nginx_log.close_windows(time.monotonic())
        give_back_memory()
    if nginx_log is not None:
        transport.close()
        nginx_log.close_all()
    if grpc is not None:
        await grpc.stop(2)
    await runner.cleanup()
    if metrics is not None:
        await metrics.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve.gate", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    config = GateConfig.read(parser.parse_args(argv).config)
    handler = logging.handlers.RotatingFileHandler(config.log, maxBytes=GATE_LOG_BYTES, backupCount=3)
    logging.basicConfig(level=logging.WARNING, handlers=[handler], format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(config))


# ---------------------------------------------------------------------------------------------- launching
def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_gate(state: Path, config: GateConfig, detach: bool = False, timeout: float = 30.0) -> subprocess.Popen:
    """Run the gate as a child process (this interpreter) and wait until both its ports listen."""
    path, log = state / GATE_CONFIG, state / "gate.stdout.log"
    config.write(path)
    cmd = [sys.executable, "-m", "serve.gate", str(path)]
    here = Path(__file__).resolve().parent.parent
    process = child.spawn(cmd, log, detach, env=memory_returning_env(dict(os.environ)), cwd=here)
    ports = [p for p in (config.http_port, config.grpc_port, config.metrics_port) if p]
    outcome = child.wait_until(process, lambda: all(_listening(port) for port in ports), timeout)
    if outcome == child.EXITED:
        tail = log.read_text(errors="replace").strip()[-500:]
        raise GateError(f"the request gate exited with code {process.returncode} while starting: {tail}")
    if outcome == child.LATE:
        process.kill()
        raise GateError(f"the request gate did not listen within {timeout:.0f} s (log: {log})")
    return process


if __name__ == "__main__":
    main()
