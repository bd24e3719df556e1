"""The gate's metrics listener (nginx's metrics port passes GET /metrics here): every tritonserver replica's Prometheus
text merged into one page, each sample labelled with its `replica`.

Why merged here: with two replicas a scrape of one of them saw half the traffic, and Prometheus' own way (a target
per replica) would need every operator to learn the loopback ports. Sums over `replica` give the server's totals;
a replica that is restarting is left out of that scrape (its counters start again at 0, which Prometheus' rate()
reads as a counter reset).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from serve.gate_config import GateConfig

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
MAX_METRICS_BYTES = 8 << 20  # one replica's page; Triton's is tens of kB


def labelled(sample: str, replica: int) -> str:
    """`name{a="b"} 1` → `name{replica="0",a="b"} 1`; `name 1` → `name{replica="0"} 1`."""
    name = METRIC_NAME.match(sample)
    if name is None:
        return sample
    rest = sample[name.end() :]
    if rest.startswith("{}"):
        rest = rest[2:]
    if rest.startswith("{"):
        return f'{name.group(0)}{{replica="{replica}",{rest[1:]}'
    return f'{name.group(0)}{{replica="{replica}"}}{rest}'


def merge_metrics(pages: list[str | None]) -> str:
    """One exposition page from each replica's (None: not reachable, left out): every family's HELP and TYPE once,
    then its samples from every replica, labelled."""
    families: dict[str, tuple[list[str], list[str]]] = {}  # family → (HELP/TYPE lines, samples), first seen first
    for replica, page in enumerate(pages):
        if page is None:
            continue
        current = ""
        for line in page.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                parts = line.split(maxsplit=3)
                current = parts[2] if len(parts) > 2 else ""
                meta, _ = families.setdefault(current, ([], []))
                if line not in meta:
                    meta.append(line)
            elif line.strip() and not line.startswith("#"):
                name = METRIC_NAME.match(line)
                base = name.group(0) if name else ""
                family = current if current and base.startswith(current) else base
                families.setdefault(family, ([], []))[1].append(labelled(line, replica))
    return "".join("\n".join([*meta, *samples]) + "\n" for meta, samples in families.values())


def metrics_app(config: GateConfig) -> Any:
    """GET /metrics: the replicas' pages merged; anything else 404 (nginx passes nothing else anyway)."""
    from aiohttp import ClientError, ClientSession, ClientTimeout, web

    async def page(session: ClientSession, port: int) -> str | None:
        try:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                if answer.status != 200:
                    return None
                body = await answer.content.read(MAX_METRICS_BYTES + 1)
                return body.decode(errors="replace") if len(body) <= MAX_METRICS_BYTES else None
        except (ClientError, asyncio.TimeoutError, OSError):
            return None

    async def handle(request: web.Request) -> web.Response:
        if request.method != "GET" or request.raw_path != "/metrics":
            return web.Response(status=404, text="only GET /metrics is served on this port\n")
        async with ClientSession(timeout=ClientTimeout(total=10)) as session:
            pages = await asyncio.gather(*(page(session, port) for port in config.triton_metrics_ports))
        merged = merge_metrics(list(pages)).encode()
        return web.Response(body=merged, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app
