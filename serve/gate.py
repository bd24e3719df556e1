"""The validating gate between nginx and tritonserver: `python -m serve.gate <gate.json>` (started by Server.start).

Why a process of its own: tritonserver 2.51 dies on some legal KServe v2 requests (serve/request_limits.py has
which, and the limits), it has no flag to refuse them, and nginx cannot look inside a request — it does not parse
JSON bodies and cannot parse gRPC's protobuf at all. So nginx keeps what it does well (connection limits, body
caps, timeouts, compressed bodies refused) and passes every request to this gate on loopback, which parses it
(Python's JSON and protobuf readers: bounded, linear), refuses one over the limits with 400 / INVALID_ARGUMENT
and one line, and forwards the rest to Triton's loopback listeners unchanged. It also drops the extensions the
public endpoints do not serve from `GET /v2` and gRPC ServerMetadata. While Triton is down (the supervisor
restarting it, serve/supervisor.py) it answers 503 / UNAVAILABLE "restarting; retry" instead of a bare 502.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import logging.handlers
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.errors import ServeError
from serve.log_collapse import receive_syslog
from serve.request_limits import (
    RequestLimits,
    RequestRefused,
    check_grpc_request,
    check_http_request,
    parse_http_request,
    served_extensions,
)

GATE_CONFIG = "gate.json"  # in the server's state dir
GATE_LOG = "gate.log"
GATE_LOG_BYTES = 4 << 20  # gate.log rotates at 4 MB, 3 kept
INFER_PATH = re.compile(r"^/v2/models/[^/]+(/versions/[0-9]+)?/infer$")
# hop-by-hop and length headers: recomputed on each side, never forwarded
HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "upgrade"})
RESTARTING = "tritonserver is not reachable (restarting after a crash?); retry in a few seconds"
UNREACHABLE = ("failed to connect", "connection refused", "socket closed", "connection reset", "unavailable for")


GRPC_RETRY = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "0.5s",
                    "backoffMultiplier": 2.5,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


class GateError(ServeError, RuntimeError):
    """The gate could not start; the message names the cause and the fix."""


@dataclass(frozen=True)
class GateConfig:
    """Where the gate listens and forwards (all on loopback), its limits and its log."""

    http_port: int
    triton_http_port: int
    grpc_port: int | None
    triton_grpc_port: int | None
    max_body_bytes: int
    limits: RequestLimits
    log: str
    nginx_log_port: int | None = None  # nginx's error log arrives here as syslog (loopback UDP) …
    nginx_log: str | None = None  # … and is written here, repeats collapsed (serve/log_collapse.py)

    @classmethod
    def read(cls, path: Path) -> GateConfig:
        raw = json.loads(path.read_text())
        return cls(**{**raw, "limits": RequestLimits(**raw["limits"])})

    def write(self, path: Path) -> None:
        raw = {**self.__dict__, "limits": self.limits.to_json()}
        path.write_text(json.dumps(raw, indent=1))


# ---------------------------------------------------------------------------------------------- HTTP
def http_app(config: GateConfig) -> Any:
    """An aiohttp application forwarding every request to Triton's HTTP listener, infer bodies checked first."""
    from aiohttp import ClientConnectionError, ClientError, ClientSession, ClientTimeout, TCPConnector, web

    upstream = f"http://127.0.0.1:{config.triton_http_port}"
    sessions: list[ClientSession] = []

    async def open_session(app: web.Application) -> None:
        sessions.append(
            ClientSession(
                connector=TCPConnector(limit=0, force_close=False),
                timeout=ClientTimeout(total=None, sock_connect=5),
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            )
        )

    async def close_session(app: web.Application) -> None:
        for session in sessions:
            await session.close()

    def refuse(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and INFER_PATH.match(request.path):
            try:
                check_http_request(
                    parse_http_request(body, request.headers.get("Inference-Header-Content-Length"), config.limits),
                    config.limits,
                )
            except RequestRefused as exc:
                return refuse(400, str(exc))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        metadata = request.method == "GET" and request.path.rstrip("/") == "/v2"
        if metadata:
            headers.pop("Accept-Encoding", None)  # the answer is rewritten, so it must come uncompressed
        for attempt in range(2):
            try:
                async with sessions[0].request(
                    request.method, upstream + request.path_qs, data=body or None, headers=headers
                ) as answer:
                    data = await answer.read()
                    status, answer_headers = answer.status, answer.headers
                break
            except ClientConnectionError:
                # a pooled keep-alive connection Triton had closed, or Triton restarting: once more on a fresh
                # connection (every request the gate passes is side-effect free: inference, metadata, health)
                if attempt:
                    return refuse(503, RESTARTING)
            except (ClientError, asyncio.TimeoutError):  # an answer that broke off
                return refuse(503, RESTARTING)
        if metadata and status == 200:
            data = _served_metadata(data)
        out = {k: v for k, v in answer_headers.items() if k.lower() not in HOP}
        return web.Response(status=status, body=data, headers=out)

    app = web.Application(client_max_size=config.max_body_bytes + (1 << 20))
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def _served_metadata(data: bytes) -> bytes:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        meta = json.loads(data)
        meta["extensions"] = served_extensions(list(meta.get("extensions", [])))
        return json.dumps(meta).encode()
    return data


# ---------------------------------------------------------------------------------------------- gRPC
def grpc_server(config: GateConfig) -> Any:
    """A grpc.aio server forwarding every GRPCInferenceService call to Triton's gRPC listener as raw bytes;
    ModelInfer and each ModelStreamInfer message are parsed and checked first, ServerMetadata rewritten."""
    import grpc
    from tritonclient.grpc import service_pb2

    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{config.triton_grpc_port}",
        options=[
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # reconnect within a second of a restarted tritonserver (gRPC's default back-off grows to 120 s)
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # a call that never reached Triton (connection reset, Triton restarting) is tried again, up to 3 times
            # within ~0.7 s: every method the gate passes is side-effect free
            ("grpc.enable_retries", 1),
            ("grpc.service_config", GRPC_RETRY),
        ],
    )
    invalid = grpc.StatusCode.INVALID_ARGUMENT

    def forwarded_metadata(context: Any) -> tuple[tuple[str, Any], ...]:
        skip = ("user-agent", "content-type", "te")
        return tuple(
            (m.key, m.value)
            for m in context.invocation_metadata() or ()
            if not m.key.startswith((":", "grpc-")) and m.key not in skip
        )

    async def relay_error(exc: grpc.aio.AioRpcError, context: Any) -> None:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.UNAVAILABLE and any(s in details.lower() for s in UNREACHABLE):
            details = RESTARTING
        await context.abort(exc.code(), details)

    def unary(method: str) -> Callable[..., Any]:
        call = channel.unary_unary(method)

        async def handle(request: bytes, context: Any) -> bytes:
            if method.endswith("/ModelInfer"):
                try:
                    check_grpc_request(service_pb2.ModelInferRequest.FromString(request), config.limits)
                except RequestRefused as exc:
                    await context.abort(invalid, str(exc))
                except Exception:  # protobuf's DecodeError: Triton gets nothing it cannot read
                    await context.abort(invalid, "the ModelInferRequest message could not be parsed")
            try:
                answer = await call(request, metadata=forwarded_metadata(context), timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                await relay_error(exc, context)
            if method.endswith("/ServerMetadata"):
                meta = service_pb2.ServerMetadataResponse.FromString(answer)
                kept = served_extensions(list(meta.extensions))
                del meta.extensions[:]
                meta.extensions.extend(kept)
                answer = meta.SerializeToString()
            return answer

        return handle

    def stream(method: str) -> Callable[..., Any]:
        call = channel.stream_stream(method)

        async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            refused: list[str] = []

            async def checked() -> AsyncIterator[bytes]:
                async for request in requests:
                    try:
                        check_grpc_request(service_pb2.ModelInferRequest.FromString(request), config.limits)
                    except RequestRefused as exc:
                        refused.append(str(exc))
                        return
                    except Exception:  # protobuf's DecodeError
                        refused.append("a ModelStreamInfer message could not be parsed")
                        return
                    yield request

            try:
                async for answer in call(checked(), metadata=forwarded_metadata(context)):
                    yield answer
            except grpc.aio.AioRpcError as exc:
                await relay_error(exc, context)
            if refused:  # the answers to the messages before it were sent; the stream ends here
                await context.abort(invalid, refused[0])

        return handle

    handlers: dict[str, Any] = {}

    class Forward(grpc.GenericRpcHandler):
        def service(self, handler_call_details: Any) -> Any:
            method = handler_call_details.method
            if method not in handlers:
                if len(handlers) > 64:  # only the service's ~20 methods are real; unknown ones are not kept
                    handlers.clear()
                if method.endswith("/ModelStreamInfer"):
                    handlers[method] = grpc.stream_stream_rpc_method_handler(stream(method))
                else:
                    handlers[method] = grpc.unary_unary_rpc_method_handler(unary(method))
            return handlers[method]

    server = grpc.aio.server(
        handlers=[Forward()],
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes + (1 << 20)),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_insecure_port(f"127.0.0.1:{config.grpc_port}")
    return server


# ---------------------------------------------------------------------------------------------- the process
async def serve(config: GateConfig) -> None:
    """Run both fronts until SIGTERM / SIGINT."""
    from aiohttp import web

    runner = web.AppRunner(http_app(config), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", config.http_port, reuse_address=True)
    await site.start()
    grpc = grpc_server(config) if config.grpc_port else None
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
    if nginx_log is not None:
        transport.close()
        nginx_log.close_all()
    if grpc is not None:
        await grpc.stop(2)
    await runner.cleanup()


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
    path = state / GATE_CONFIG
    config.write(path)
    with (state / "gate.stdout.log").open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "serve.gate", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
            cwd=Path(__file__).resolve().parent.parent,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (state / "gate.stdout.log").read_text(errors="replace").strip()[-500:]
            raise GateError(f"the request gate exited with code {process.returncode} while starting: {tail}")
        if _listening(config.http_port) and (config.grpc_port is None or _listening(config.grpc_port)):
            return process
        time.sleep(0.1)
    process.kill()
    raise GateError(f"the request gate did not listen within {timeout:.0f} s (log: {state / 'gate.stdout.log'})")


if __name__ == "__main__":
    main()
