"""`python -m serve.bench.floods <export> [--out DIR] [--seconds 20] [--only NAME …]`: each flood of issue 84
against a real server, with a one-word probe beside it.

One server as `serve.start` runs it (nginx → gate → two tritonserver replicas, each 2 instances × 1 ORT thread, the
repository's and the server's defaults). Per flood: its senders run in processes of their own for `--seconds` while
this process sends a one-word HTTP request through nginx every 0.25 s (10 s timeout; from the flood's address,
127.0.0.1, with a `zoo-client` key of its own, as a second client behind one address would) and samples the resident
memory of the gate, the tritonservers, their Python stubs and nginx every 0.5 s (each role summed); then, 30 s after
the flood, the same memory again. The report (`floods.json`, `floods.md` in `--out`) has per flood: probes answered,
median and max latency, crashes (replicas whose tritonserver pid changed), peak and after-flood memory against idle.
Pause other work on the machine first: the probe's latency is what is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import signal
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serve.proxy import CLIENT_KEY_HEADER  # the probe is a client of its own (serve/proxy.py)

SERVICE = "/inference.GRPCInferenceService/"
PROBE_EVERY_S = 0.25
PROBE_TIMEOUT_S = 10.0
SETTLE_S = 30.0  # memory is read again this long after a flood
NON_CANONICAL = ("/./infer", "/x/../infer", "//infer", "/%2e/infer", "/infer/")


# ---------------------------------------------------------------------------------------------- request bodies
def _infer_body(texts: list[str], parameters: dict[str, Any] | None = None) -> bytes:
    inputs = [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}]
    return json.dumps({"inputs": inputs, "parameters": parameters or {}}).encode()


def _grpc_request(model: str, texts: list[bytes], parameters: dict[str, Any]) -> bytes:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    for name, value in parameters.items():
        if isinstance(value, float):
            request.parameters[name].double_param = value
        else:
            request.parameters[name].int64_param = value
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(texts), 1])
    request.raw_input_contents.append(b"".join(len(t).to_bytes(4, "little") + t for t in texts))
    return request.SerializeToString()


def post_raw(http_url: str, path: str, body: bytes) -> int:
    host, port = http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:  # the path exactly as written: http.client sends it unnormalised, as an attacker would
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    except OSError:  # refused or reset: no answer
        return 0
    finally:
        connection.close()


# ---------------------------------------------------------------------------------------------- the floods
def _in_threads(target: Callable[[], None], count: int) -> None:
    """`count` threads running `target`, joined: one sender process keeping that many requests in flight."""
    threads = [threading.Thread(target=target) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _add(sent: Any) -> None:
    with sent.get_lock():
        sent.value += 1


# Each sender runs until `until` (a deadline on time.monotonic) in a process of its own: (urls, model, until, sent),
# adding every request (or stream, or connection) it sent to `sent`.
def _non_canonical(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """The classification body and 60k-deep nesting on paths Triton normalises (SIGFPE / SIGSEGV in 2.51)."""
    classify = json.dumps({"inputs": [], "outputs": [{"name": "OUTPUT", "parameters": {"classification": 1}}]})
    nested = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":%s}]}' % (
        b"[" * 60_000 + b'"x"' + b"]" * 60_000
    )
    while time.monotonic() < until:
        for tail in NON_CANONICAL:
            for body in (classify.encode(), nested):
                post_raw(urls["http"], f"/v2/models/{model}{tail}", body)
                _add(sent)


def _cancelled_streams(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """Streams cancelled right after their first answer, back to back (SIGSEGV / bad_alloc in 2.51)."""
    import grpc

    message = _grpc_request(model, [b"Hallo."], {"beam_size": 1})
    with grpc.insecure_channel(urls["grpc"]) as channel:
        call = channel.stream_stream(SERVICE + "ModelStreamInfer")
        while time.monotonic() < until:
            answers = call(iter([message] * 3))
            with contextlib.suppress(grpc.RpcError, StopIteration):
                next(answers)
            answers.cancel()
            _add(sent)


def _empty_inputs_4mb(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """4 MB gRPC messages of 2M empty inputs, four at a time per sender (≈ 400 MB each in protobuf's parser)."""
    import grpc

    message = b"\x0a" + bytes([len(model)]) + model.encode() + b"\x2a\x00" * 1_990_000

    def send() -> None:
        with grpc.insecure_channel(urls["grpc"]) as channel:
            call = channel.unary_unary(SERVICE + "ModelInfer")
            while time.monotonic() < until:
                with contextlib.suppress(grpc.RpcError):
                    call(message, timeout=60)
                _add(sent)

    _in_threads(send, 4)


def _nested_json_4mb(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """A 4 MB JSON body of small nested arrays, sent back to back (≈ 2.6 CPU-seconds each in Python's JSON)."""
    body = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":[%s]}]}' % b",".join([b"[[]]"] * 790_000)
    while time.monotonic() < until:
        post_raw(urls["http"], f"/v2/models/{model}/infer", body)
        _add(sent)


def _many_parameters(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """100k request parameters (47 s of one core in Triton 2.51, quadratic)."""
    body = json.dumps({"parameters": {f"p{i}": 1 for i in range(100_000)}, "inputs": []}).encode()
    while time.monotonic() < until:
        post_raw(urls["http"], f"/v2/models/{model}/infer", body)
        _add(sent)


def _sampling(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """Sampled requests priced just under the express lane's limit (1 row × 8 samples × ≤ 125 tokens)."""
    body = _infer_body(["Hallo Welt."], {"beam_size": 1, "sampling": 1, "top_p": 0.9, "num_hypotheses": 8})
    while time.monotonic() < until:
        post_raw(urls["http"], f"/v2/models/{model}/infer", body)
        _add(sent)


def _empty_sources_stream(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """One gRPC stream of up to 8,000 requests of 16 empty sources each (priced 0, answered ≈ 33 KB each)."""
    import grpc

    message = _grpc_request(model, [b""] * 16, {})

    def messages() -> Any:
        for _ in range(8000):
            if time.monotonic() >= until:
                return
            _add(sent)
            yield message

    with grpc.insecure_channel(urls["grpc"]) as channel, contextlib.suppress(grpc.RpcError):
        for _ in channel.stream_stream(SERVICE + "ModelStreamInfer")(messages()):
            pass


def maximum_cost_body() -> bytes:
    """A request just under the default cost cap: 16 rows × beam 5 × 124 tokens = 9,920 row-steps (max_len_a 0: with
    the manifest's 1.2 × source length on top it was 11,040 — refused, so the flood measured refusals, not work)."""
    texts = ["Hallo Welt, wie geht es dir?"] * 16
    return _infer_body(texts, {"beam_size": 5, "min_len": 124, "max_len_a": 0.0, "max_len_b": 124})


def _maximum_cost(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """One client keeping 40 maximum-cost requests in flight (maximum_cost_body)."""
    body = maximum_cost_body()

    def keep() -> None:
        while time.monotonic() < until:
            post_raw(urls["http"], f"/v2/models/{model}/infer", body)
            _add(sent)

    _in_threads(keep, 40)


def _trickled_bodies(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """64 connections from this address, each sending a body one byte every 5 s (the per-address limit)."""
    host, port = urls["http"].rsplit(":", 1)
    sockets = []
    for _ in range(64):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode())
        sockets.append(sock)
        _add(sent)
    while time.monotonic() < until:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.sendall(b" ")
        time.sleep(5)
    for sock in sockets:
        sock.close()


def _crash_injection(urls: dict[str, str], model: str, until: float, sent: Any) -> None:
    """One crash injected into the first tritonserver replica (SIGSEGV) a second in, as an unforeseen crash would
    be; the probe goes on for the rest of the flood (the issue asks ≥ 95 % of one-word requests answered over 60 s)."""
    from serve.server import read_info

    time.sleep(1.0)
    info = read_info(Path(urls["state"]))
    if info is not None:
        os.kill(info.pids[0], signal.SIGSEGV)
        _add(sent)


FLOODS: dict[str, tuple[Callable[[dict[str, str], str, float, Any], None], int]] = {  # sender, processes
    "non_canonical_paths": (_non_canonical, 2),
    "cancelled_grpc_streams": (_cancelled_streams, 2),
    "empty_inputs_4mb_grpc": (_empty_inputs_4mb, 4),
    "nested_json_4mb_http": (_nested_json_4mb, 4),
    "many_parameters_http": (_many_parameters, 2),
    "sampling_under_express": (_sampling, 4),
    "empty_sources_stream": (_empty_sources_stream, 1),
    "maximum_cost_one_client": (_maximum_cost, 1),
    "trickled_bodies_one_address": (_trickled_bodies, 1),
    "crash_injection": (_crash_injection, 1),
}


# ---------------------------------------------------------------------------------------------- measuring
def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def processes(info: Any) -> dict[str, list[int]]:
    """The server's processes by role (stubs: the tritonservers' Python-backend children; nginx: master and
    worker)."""
    return {
        "gate": [info.gate_pid],
        "tritonserver": info.pids,
        "stubs": [stub for pid in info.pids for stub in _children(pid)],
        "nginx": [info.proxy_pid, *_children(info.proxy_pid)],
    }


def memory(info: Any) -> dict[str, float]:
    return {role: round(sum(_rss_mb(p) for p in pids), 1) for role, pids in processes(info).items()}


def _probe(http_url: str, model: str) -> float | None:
    begin = time.perf_counter()
    host, port = http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT_S)
    try:
        connection.request(
            "POST",
            f"/v2/models/{model}/infer",
            body=_infer_body(["Hallo."], {"beam_size": 1}),
            headers={CLIENT_KEY_HEADER: "probe"},  # a client of its own beside the flood's, on the same address
        )
        answer = connection.getresponse()
        answer.read()
        return time.perf_counter() - begin if answer.status == 200 else None
    except OSError:
        return None
    finally:
        connection.close()


def run_flood(server: Any, name: str, seconds: float, settle_s: float = SETTLE_S) -> dict[str, Any]:
    """One flood: senders for `seconds`, the probe and memory samples meanwhile, memory again `settle_s` after."""
    from serve.server import read_info

    state = Path(server.info.state_dir)
    info = read_info(state)
    idle, pids = memory(info), info.pids
    sender, count = FLOODS[name]
    urls = {"http": info.http_url, "grpc": info.grpc_url, "state": str(state)}
    model = info.models[0]
    until = time.monotonic() + seconds
    context = multiprocessing.get_context("spawn")
    sent = context.Value("l", 0)
    senders = [context.Process(target=sender, args=(urls, model, until, sent), daemon=True) for _ in range(count)]
    for process in senders:
        process.start()
    peak = dict(idle)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            now = memory(read_info(state))
            for role, mb in now.items():
                peak[role] = max(peak[role], mb)
            stop.wait(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    probes: list[float | None] = []
    time.sleep(1.0)  # the flood is under way
    while time.monotonic() < until:
        probes.append(_probe(urls["http"], model))
        time.sleep(PROBE_EVERY_S)
    for process in senders:
        process.join(timeout=max(5.0, seconds))
        if process.is_alive():
            process.kill()
    stop.set()
    sampler.join()
    time.sleep(settle_s)
    after_info = read_info(state)
    answered = [p for p in probes if p is not None]
    return {
        "flood": name,
        "seconds": seconds,
        "flood_requests": sent.value,
        "probes": len(probes),
        "answered": len(answered),
        "probe_median_s": round(statistics.median(answered), 3) if answered else None,
        "probe_max_s": round(max(answered), 3) if answered else None,
        "crashes": sum(after != before for after, before in zip(after_info.pids, pids, strict=True)),
        "idle_mb": idle,
        "peak_mb": peak,
        "after_mb": memory(after_info),
    }


def render(result: dict[str, Any]) -> str:
    """floods.md from floods.json: one row per flood."""
    lines = [
        f"# Floods against the front door ({result['date']}, {result['cpu']}, {result['model']})",
        "",
        f"`{result['command']}` — each flood {result['seconds']:g} s; the probe is a one-word HTTP request through "
        f"nginx every {PROBE_EVERY_S} s ({PROBE_TIMEOUT_S:g} s timeout); memory is resident MB (gate / tritonserver "
        f"/ Python stubs / nginx), peak during the flood and {SETTLE_S:g} s after it, against idle before it.",
        "",
        "| flood | flood requests | probes answered | probe median (s) | probe max (s) | crashes "
        "| gate MB idle → peak → after | tritonserver MB | stubs MB |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for row in result["floods"]:

        def mb(role: str, row: dict = row) -> str:
            return f"{row['idle_mb'][role]:.0f} → {row['peak_mb'][role]:.0f} → {row['after_mb'][role]:.0f}"

        median = "—" if row["probe_median_s"] is None else f"{row['probe_median_s']:.3f}"
        top = "—" if row["probe_max_s"] is None else f"{row['probe_max_s']:.3f}"
        lines.append(
            f"| {row['flood']} | {row['flood_requests']} | {row['answered']} / {row['probes']} | {median} | {top} "
            f"| {row['crashes']} | {mb('gate')} | {mb('tritonserver')} | {mb('stubs')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve.bench.floods", description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="an export directory (python -m export)")
    parser.add_argument("--out", type=Path, default=Path("bench/floods"))
    parser.add_argument("--seconds", type=float, default=20.0, help="each flood's length")
    parser.add_argument("--only", nargs="*", choices=sorted(FLOODS), help="these floods only (default: all)")
    args = parser.parse_args(argv)
    from serve.model_config import ModelSettings
    from serve.repository import write_repository
    from serve.server import Server
    from zoo.machine import cpu_signature

    names = args.only or list(FLOODS)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_repository([args.export], repo, ModelSettings(threads=1, instance_count=2))
        with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
            rows = []
            for name in names:
                print(f"[floods] {name} …", flush=True)
                rows.append(run_flood(server, name, args.seconds))
                print(f"[floods] {json.dumps(rows[-1])}", flush=True)
            model = server.info.models[0]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_signature(),
        "cores": os.cpu_count(),
        "model": model,
        "seconds": args.seconds,
        "command": f"python -m serve.bench.floods <export of {model}> --seconds {args.seconds:g}",
        "floods": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "floods.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "floods.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
