"""`python -m serve.bench.gate <export dir> [--rounds 200]`: what the request gate costs per request.

One server (nginx → gate → Triton, as `serve.start` runs it); each round sends one short translation (2 output
tokens, beam 1: the hops dominate) over every path in turn — through nginx, to the gate directly, to Triton's own
loopback listener — over HTTP and gRPC, the order rotated per round. Prints the median latency per path and the
median of the per-round differences against Triton's own listener (the numbers serve/README.md states)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serve.gate import GATE_CONFIG
from serve.model_config import ModelSettings
from serve.repository import write_repository
from serve.server import Server

SEARCH = {"beam_size": 1, "max_len_a": 0.0, "max_len_b": 2}


def measure(server: Server, rounds: int) -> dict:
    """Per-path latencies of `rounds` interleaved rounds against a running gated server."""
    gate = json.loads((Path(server.info.state_dir) / GATE_CONFIG).read_text())
    model = server.info.models[0]
    paths = {
        "http nginx>gate>triton": (httpclient, server.info.http_url),
        "http gate>triton": (httpclient, f"127.0.0.1:{gate['http_port']}"),
        "http triton": (httpclient, server.info.triton_http_url),
        "grpc nginx>gate>triton": (grpcclient, server.info.grpc_url),
        "grpc gate>triton": (grpcclient, f"127.0.0.1:{gate['grpc_port']}"),
        "grpc triton": (grpcclient, server.info.triton_grpc_url),
    }
    clients = {name: lib.InferenceServerClient(url) for name, (lib, url) in paths.items()}

    def once(name: str) -> float:
        lib = paths[name][0]
        text = lib.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"Hallo."]], dtype=np.object_))
        begin = time.perf_counter()
        clients[name].infer(model, [text], parameters=SEARCH)
        return time.perf_counter() - begin

    try:
        for name in paths:  # warm every connection and instance
            for _ in range(10):
                once(name)
        names, seconds = list(paths), {name: [] for name in paths}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                seconds[name].append(once(name))
    finally:
        for client in clients.values():
            client.close()
    extra = {}
    for protocol in ("http", "grpc"):
        base = seconds[f"{protocol} triton"]
        for name in (f"{protocol} gate>triton", f"{protocol} nginx>gate>triton"):
            extra[name] = round(1000 * statistics.median(a - b for a, b in zip(seconds[name], base, strict=True)), 2)
    return {
        "rounds": rounds,
        "median_ms": {name: round(1000 * statistics.median(v), 2) for name, v in seconds.items()},
        "median_extra_ms_vs_triton": extra,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve.bench.gate", description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="an export directory (python -m export)")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_repository([args.export], repo, ModelSettings(threads=1, instance_count=2, max_batch_size=16))
        with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
            result = measure(server, args.rounds)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
