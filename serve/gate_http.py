"""The gate's HTTP front (serve/gate.py runs it): an allow-list of (method, canonical path) pairs, inference bodies read
with budgets and rebuilt, Triton's answer passed back with only its content headers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from serve.gate_config import ADMIN_KEY, RESTARTING, GateConfig
from serve.http_infer import read_http_infer
from serve.infer_request import RequestRefused, client_name, encode_http, infer_path, shown
from serve.launch import ADMIN_HEADER
from serve.proxy import CLIENT_ID_HEADER
from serve.served_models import served_extensions
from serve.upstreams import Replica, UpstreamLost, Upstreams

# the characters of a canonical path; anything else (a percent escape, a backslash, a semicolon) is not served
PATH_CHARACTERS = re.compile(r"^[A-Za-z0-9_.\-/]+$")
MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]{1,10}))?(/ready|/config|/infer)?$")
ANSWER_HEADERS = ("Content-Type", "Inference-Header-Content-Length")  # what of Triton's answer reaches the client
SERVER_ROUTES = ("/v2", "/v2/health/live", "/v2/health/ready")


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


def http_app(config: GateConfig, upstreams: Upstreams) -> Any:
    """An aiohttp application answering the allow-list of routes; Triton receives requests the gate built."""
    from aiohttp import ClientConnectorError, ClientError, ClientSession, ClientTimeout, TCPConnector, web

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

    def fetch(method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Any:
        async def send(replica: Replica) -> tuple[int, bytes, Any]:
            url = f"http://127.0.0.1:{replica.http_port}{path}"
            try:
                async with sessions[0].request(method, url, data=body, headers=headers) as answer:
                    return answer.status, await answer.read(), answer.headers
            except ClientConnectorError as exc:  # not reached: restarting, or down
                raise UpstreamLost(broke_off=False, detail=str(exc)) from None
            except (ClientError, asyncio.TimeoutError) as exc:  # reached, and the answer broke off
                raise UpstreamLost(broke_off=True, detail=str(exc)) from None

        return send

    async def handle(request: web.Request) -> web.StreamResponse:
        route = canonical_route(request.method, request.raw_path)
        if isinstance(route, str):
            return refuse(405 if route.endswith("only") else 404, f"not served: {route}")
        path, body, headers, digest = route.path, None, {}, b""
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
                digest = upstreams.memory.digest(built.fingerprint())
                wait = upstreams.memory.refused_for(digest)
                if wait:
                    return web.json_response(
                        {"error": upstreams.memory.message(wait)},
                        status=503,
                        headers={"Retry-After": str(math.ceil(wait))},
                    )
                built.client = client_name(request.headers.get(CLIENT_ID_HEADER, ""))
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
        try:
            status, data, answer_headers = await upstreams.call(digest, fetch(request.method, path, body, headers))
        except UpstreamLost:
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
