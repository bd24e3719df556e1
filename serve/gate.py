"""The front door between nginx and tritonserver: `python -m serve.gate <gate.json>` (started by Server.start).

Why it owns the protocol: tritonserver 2.51 dies on some legal KServe v2 requests, and three rounds of attacks each
found a new one (classification of a BYTES output, deep JSON, a `/./infer` path walking around the checks, gRPC
streams cancelled mid-answer; issues 61 and 84). So nothing a client wrote reaches Triton. Over HTTP the gate
answers only an allow-list of (method, canonical path) pairs — a path with `.`/`..` or empty segments, percent
escapes or a trailing slash is 404 here, never normalised by Triton — and over gRPC only the methods it names
(anything else: UNIMPLEMENTED). Inference requests are read with budgets that follow the served models
(serve/http_infer.py, serve/grpc_infer.py: a refused request costs what was read up to its first excess), checked
against the model (serve/infer_request.py) and re-encoded; metadata and health requests are rebuilt from the
model name and version. gRPC streams end at the gate: each message becomes a unary call to Triton, and a client
that cancels cancels nothing inside Triton — every upstream call runs to its end, its answer dropped.

nginx keeps what it does well (connection limits, body caps, timeouts, compressed bodies refused). While Triton is
down (the supervisor restarting it, serve/supervisor.py) the gate answers 503 / UNAVAILABLE "restarting; retry".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import logging.handlers
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.errors import ServeError
from serve.grpc_infer import read_grpc_infer, read_model_name
from serve.http_infer import read_http_infer
from serve.infer_request import RequestRefused, encode_grpc, encode_http, infer_path, shown
from serve.launch import ADMIN_HEADER, GRPC_ADMIN_HEADER, memory_returning_env
from serve.log_collapse import receive_syslog
from serve.served_models import ServedModel, served_extensions
from serve.wire import encode_len_field

GATE_CONFIG = "gate.json"  # in the server's state dir
GATE_LOG = "gate.log"
GATE_LOG_BYTES = 4 << 20  # gate.log rotates at 4 MB, 3 kept
ADMIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
MAX_SMALL_MESSAGE = 4096  # a health, metadata, index or settings request is a few bytes: more is not one of them
# the characters of a canonical path; anything else (a percent escape, a backslash, a semicolon) is not served
PATH_CHARACTERS = re.compile(r"^[A-Za-z0-9_.\-/]+$")
MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]{1,10}))?(/ready|/config|/infer)?$")
ANSWER_HEADERS = ("Content-Type", "Inference-Header-Content-Length")  # what of Triton's answer reaches the client
SERVER_ROUTES = ("/v2", "/v2/health/live", "/v2/health/ready")
RESTARTING = "tritonserver is not reachable (restarting after a crash?); retry in a few seconds"
UNREACHABLE = ("failed to connect", "connection refused", "socket closed", "connection reset", "unavailable for")
SERVICE = "/inference.GRPCInferenceService/"
# gRPC methods: open ones, and those Triton restricts to the admin key (forwarded with the key, rebuilt)
PUBLIC_METHODS = ("ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig")
ADMIN_METHODS = ("RepositoryIndex", "ModelStatistics", "LogSettings", "TraceSetting")


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
    """Where the gate listens and forwards (all on loopback), what it serves and its log."""

    http_port: int
    triton_http_port: int
    grpc_port: int | None
    triton_grpc_port: int | None
    max_body_bytes: int
    # Triton's calls run to their end whatever the client does (a client's deadline passed on would cancel them
    # inside Triton, the path that crashed 2.51): nginx's limit on Triton's answer bounds them instead
    upstream_timeout_s: float
    models: dict[str, ServedModel]
    log: str
    nginx_log_port: int | None = None  # nginx's error log arrives here as syslog (loopback UDP) …
    nginx_log: str | None = None  # … and is written here, repeats collapsed (serve/log_collapse.py)

    @classmethod
    def read(cls, path: Path) -> GateConfig:
        raw = json.loads(path.read_text())
        return cls(**{**raw, "models": {n: ServedModel.from_json(m) for n, m in raw["models"].items()}})

    def write(self, path: Path) -> None:
        raw = {**self.__dict__, "models": {n: m.to_json() for n, m in self.models.items()}}
        path.write_text(json.dumps(raw, indent=1))


class UpstreamCalls:
    """Every call to Triton runs as a task of its own that the client cannot cancel: a client that hangs up (or
    cancels a stream) leaves the call to finish inside Triton and its answer dropped here — Triton 2.51 crashed on
    streams cancelled mid-answer. The tasks are kept until done, their errors read."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task] = set()

    async def run(self, call: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(call)
        self.running.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Task) -> None:
        self.running.discard(task)
        if not task.cancelled():
            task.exception()  # read, so an answer nobody waits for is not logged as "never retrieved"


# ---------------------------------------------------------------------------------------------- HTTP
@dataclass(frozen=True)
class Route:
    """A served HTTP route: kind is server (GET /v2, health), index (POST /v2/repository/index, admin), model (GET
    a model's metadata, /ready, /config) or infer (POST …/infer)."""

    kind: str
    path: str  # the canonical path (for a model route: as the gate rebuilds it)
    model: str = ""
    version: str = ""
    what: str = ""  # a model route's tail: "", /ready, /config or /infer


def canonical_route(method: str, raw_path: str) -> Route | str:
    """The served route a request names, or the one-line reason it is not served (404; 405 when it ends in
    "only"). The path is taken as sent, never normalised: what is not canonical is not served."""
    path = raw_path.split("?", 1)[0]
    segments = path.split("/")[1:]
    if not PATH_CHARACTERS.match(path) or any(s in ("", ".", "..") for s in segments):
        return f"{shown(path)} is not a canonical path (no '.', '..' or empty segments, escapes or trailing '/')"
    if path in SERVER_ROUTES:
        return Route("server", path) if method == "GET" else "GET only"
    if path == "/v2/repository/index":
        return Route("index", path) if method == "POST" else "POST only"
    match = MODEL_ROUTE.match(path)
    if match is None:
        return f"{shown(path)} is not served: only KServe v2 inference, metadata and health"
    what = match.group(3) or ""
    if (method == "POST") != (what == "/infer") or method not in ("GET", "POST"):
        return "POST for /infer, GET for a model's metadata, /ready and /config only"
    kind = "infer" if what == "/infer" else "model"
    return Route(kind, path, match.group(1), match.group(2) or "", what)


def http_app(config: GateConfig, calls: UpstreamCalls | None = None) -> Any:
    """An aiohttp application answering the allow-list of routes; Triton receives requests the gate built."""
    from aiohttp import ClientConnectionError, ClientError, ClientSession, ClientTimeout, TCPConnector, web

    upstream = f"http://127.0.0.1:{config.triton_http_port}"
    sessions: list[ClientSession] = []
    calls = calls or UpstreamCalls()

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

    async def fetch(method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes, Any]:
        async with sessions[0].request(method, upstream + path, data=body, headers=headers) as answer:
            return answer.status, await answer.read(), answer.headers

    async def handle(request: web.Request) -> web.StreamResponse:
        route = canonical_route(request.method, request.raw_path)
        if isinstance(route, str):
            return refuse(405 if route.endswith("only") else 404, f"not served: {route}")
        path, body, headers = route.path, None, {}
        if route.kind in ("model", "infer"):
            model = config.models.get(route.model)
            if model is None:
                served = ", ".join(sorted(config.models))
                return refuse(404, f"model {shown(route.model)} is not served here; served: {served}")
            if route.version and route.version not in model.versions:
                return refuse(404, f"model {shown(route.model)} has no version {shown(route.version)}")
            if route.kind == "infer":
                try:
                    header_length = request.headers.get("Inference-Header-Content-Length")
                    built = read_http_infer(await request.read(), header_length, model, route.version)
                except RequestRefused as exc:
                    return refuse(400, str(exc))
                body, head = encode_http(built)
                path = infer_path(built)
                headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(head)}
        elif route.kind == "index":  # admin: Triton checks the key; the gate forwards the key and a body it wrote
            key = request.headers.get(ADMIN_HEADER, "")
            headers = {ADMIN_HEADER: key} if ADMIN_KEY.match(key) else {}
            try:
                ready = json.loads((await request.read()) or b"{}").get("ready", False)
            except (ValueError, AttributeError):
                return refuse(400, 'the repository index request must be a JSON object such as {"ready": true}')
            body = json.dumps({"ready": bool(ready)}).encode()
        for attempt in range(2):
            try:
                status, data, answer_headers = await calls.run(fetch(request.method, path, body, headers))
                break
            except ClientConnectionError:
                # a pooled keep-alive connection Triton had closed, or Triton restarting: once more on a fresh
                # connection (every request the gate builds is side-effect free: inference, metadata, health)
                if attempt:
                    return refuse(503, RESTARTING)
            except (ClientError, asyncio.TimeoutError):  # an answer that broke off
                return refuse(503, RESTARTING)
        if path == "/v2" and status == 200:
            data = _served_metadata(data)
        kept = {k: answer_headers[k] for k in ANSWER_HEADERS if k in answer_headers}
        return web.Response(status=status, body=data, headers=kept)

    app = web.Application(client_max_size=config.max_body_bytes + (1 << 20))
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def _served_metadata(data: bytes) -> bytes:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        meta = json.loads(data)
        meta["extensions"] = served_extensions(list(meta.get("extensions", [])))
        return json.dumps(meta).encode()
    return data


# ---------------------------------------------------------------------------------------------- gRPC
def grpc_server(config: GateConfig, calls: UpstreamCalls | None = None) -> Any:
    """A grpc.aio server answering the methods the gate names (PUBLIC_METHODS, ModelInfer, ModelStreamInfer, and
    ADMIN_METHODS with the admin key); each request Triton receives is one the gate built."""
    import grpc
    from tritonclient.grpc import service_pb2

    calls = calls or UpstreamCalls()
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
            # within ~0.7 s: every request the gate builds is side-effect free
            ("grpc.enable_retries", 1),
            ("grpc.service_config", GRPC_RETRY),
        ],
    )
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    upstream = {m: channel.unary_unary(SERVICE + m) for m in (*PUBLIC_METHODS, *ADMIN_METHODS, "ModelInfer")}

    def admin_metadata(context: Any) -> tuple[tuple[str, str], ...]:
        for item in context.invocation_metadata() or ():
            if item.key == GRPC_ADMIN_HEADER and isinstance(item.value, str) and ADMIN_KEY.match(item.value):
                return ((GRPC_ADMIN_HEADER, item.value),)
        return ()

    def rebuilt(method: str, request: bytes) -> bytes:
        """The request Triton receives for a method other than inference (RequestRefused when it is not one)."""
        if len(request) > MAX_SMALL_MESSAGE:
            raise RequestRefused(f"a {method} request of {len(request)} bytes; it takes a few")
        if method in ("ServerLive", "ServerReady", "ServerMetadata"):
            return b""
        if method in ("ModelReady", "ModelMetadata", "ModelConfig"):
            name, version = read_model_name(request, config.models)
            return getattr(service_pb2, f"{method}Request")(name=name, version=version).SerializeToString()
        message = getattr(service_pb2, f"{method}Request").FromString(request)  # admin: small, key-holders only
        message.DiscardUnknownFields()
        return message.SerializeToString()

    async def relay_error(exc: grpc.aio.AioRpcError, context: Any) -> None:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.UNAVAILABLE and any(s in details.lower() for s in UNREACHABLE):
            details = RESTARTING
        await context.abort(exc.code(), details)

    def unary(method: str) -> Callable[..., Any]:
        async def handle(request: bytes, context: Any) -> bytes:
            refusal = ""
            try:
                if method == "ModelInfer":
                    built = encode_grpc(read_grpc_infer(request, config.models))
                else:
                    built = rebuilt(method, request)
            except RequestRefused as exc:
                refusal = str(exc)
            except Exception:  # a small admin message protobuf could not read
                refusal = f"the {method} request message could not be read"
            del request  # a refused message is not kept alive by the abort's traceback
            if refusal:
                await context.abort(invalid, refusal)
            metadata = admin_metadata(context) if method in ADMIN_METHODS else ()
            try:
                answer = await calls.run(upstream[method](built, metadata=metadata, timeout=config.upstream_timeout_s))
            except grpc.aio.AioRpcError as exc:
                await relay_error(exc, context)
            if method == "ServerMetadata":
                meta = service_pb2.ServerMetadataResponse.FromString(answer)
                kept = served_extensions(list(meta.extensions))
                del meta.extensions[:]
                meta.extensions.extend(kept)
                answer = meta.SerializeToString()
            return answer

        return handle

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """ModelStreamInfer ends here: each message is one unary ModelInfer call to Triton, answered in order; a
        message the gate does not serve (or Triton refuses) gets its error in the stream, which goes on."""
        async for request in requests:
            try:
                built = encode_grpc(read_grpc_infer(request, config.models))
            except RequestRefused as exc:
                refusal = str(exc)
            else:
                refusal = ""
            del request
            if refusal:
                yield encode_len_field(1, refusal.encode())
                continue
            try:
                answer = await calls.run(upstream["ModelInfer"](built, timeout=config.upstream_timeout_s))
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or str(exc.code())
                if exc.code() == grpc.StatusCode.UNAVAILABLE and any(s in details.lower() for s in UNREACHABLE):
                    details = RESTARTING
                yield encode_len_field(1, details.encode())
                continue
            yield encode_len_field(2, answer)

    handlers = {SERVICE + m: grpc.unary_unary_rpc_method_handler(unary(m)) for m in upstream}
    handlers[SERVICE + "ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(stream)

    class Served(grpc.GenericRpcHandler):
        def service(self, handler_call_details: Any) -> Any:
            return handlers.get(handler_call_details.method)  # None: UNIMPLEMENTED, answered by grpc itself

    server = grpc.aio.server(
        handlers=[Served()],
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes + (1 << 20)),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_insecure_port(f"127.0.0.1:{config.grpc_port}")
    return server


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

    calls = UpstreamCalls()
    runner = web.AppRunner(http_app(config, calls), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", config.http_port, reuse_address=True)
    await site.start()
    grpc = grpc_server(config, calls) if config.grpc_port else None
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
            env=memory_returning_env(dict(os.environ)),
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
