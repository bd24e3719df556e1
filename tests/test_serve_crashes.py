"""Issue 61: serving is never taken down by one request — tried as an attacker would, on loopback, against the
real tritonserver, gate and nginx of `Server.start`'s default setup.

Requests Triton 2.51 cannot survive (classification of a BYTES output, JSON data nested 40 000 deep, 100k request
parameters) are refused by the gate with 400 / INVALID_ARGUMENT and one line, and the same tritonserver keeps
serving; a tritonserver replica killed anyway is restarted by the supervisor within seconds while the other serves;
a second start on the same repository refuses naming the running server. The limit checks themselves run without a
server first.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

import export
from export import runtime as rt
from serve.bench.floods import post_raw, render, run_flood
from serve.bench.prices import ROWS, measure, request_kinds
from serve.gate import GATE_LOG
from serve.http_infer import MAX_DEPTH
from serve.log_collapse import CollapsingLog
from serve.model_config import DEFAULT_PRICES, ModelSettings, RepositoryError
from serve.repository import write_repository
from serve.server import Server, ServerError
from serve.supervisor import PROXY_LOG_BYTES, SERVER_LOG_BYTES, RestartPolicy, rotate_by_size
from serve.triton.model_prices import PriceRule
from tests.serve_testing import flood_while_probing
from tests.zoo_testing import REPO

MODEL = "transformer-smoke"
RESTART_WITHIN_S = 30.0  # a killed tritonserver serves again within this (measured here: see the test)


# ---------------------------------------------------------------------------------------------- without a server
def _body(request: dict) -> bytes:
    return json.dumps(request).encode()


def _nested(depth: int, name: str = "TEXT") -> bytes:
    data = b"[" * depth + b'"Hallo."' + b"]" * depth
    return b'{"inputs":[{"name":"%s","datatype":"BYTES","shape":[1,1],"data":%s}]}' % (name.encode(), data)


def test_logs_rotate_by_size_under_a_writer_that_appends(tmp_path) -> None:
    """copytruncate: the writer (tritonserver, nginx) keeps its O_APPEND descriptor and carries on at the start."""
    log = tmp_path / "server.log"
    with log.open("ab", buffering=0) as writer:
        for round_ in range(4):
            writer.write(b"x" * 200 + b"%d\n" % round_)
            assert rotate_by_size(log, 100, keep=2)
        writer.write(b"after\n")
    assert log.read_bytes() == b"after\n"
    assert log.with_name("server.log.1").read_bytes().endswith(b"3\n")
    assert log.with_name("server.log.2").read_bytes().endswith(b"2\n")
    assert not log.with_name("server.log.3").exists()
    assert not rotate_by_size(log, 100, keep=2)


def test_repeated_log_messages_are_collapsed_and_new_ones_written_at_once(tmp_path) -> None:
    """What a client varies (connection number, address, request line, numbers) does not make a message new: the
    first BURST of a kind per window are written, the rest counted in one line when the window ends."""
    log = CollapsingLog(tmp_path / "error.log", burst=2, window_s=60)

    def too_large(conn: int, size: int, client: str) -> str:
        return (
            f"2026/11/29 03:05:48 [error] 7#7: *{conn} client intended to send too large body: {size} bytes, "
            f'client: {client}, server: , request: "POST /v2/models/m{conn}/infer HTTP/1.1", host: "h{conn}"'
        )

    for i in range(1000):
        log.write(too_large(i, 10_000_000 + i, f"10.0.{i % 7}.{i % 5}"), now=float(i) / 100)
    log.write("2026/11/29 03:05:58 [error] 7#7: *9 upstream timed out (110) while reading upstream", now=10.0)
    lines = log.path.read_text().splitlines()
    assert len(lines) == 3 and "upstream timed out" in lines[2]  # two of the flood, the new kind at once
    log.write(too_large(5, 1, "x"), now=61.0)  # its window (opened at 0) ended: the count, then this one
    lines = log.path.read_text().splitlines()
    assert "998 more like the following in 61 s left out" in lines[3] and "*999 " in lines[3]
    assert "*5 " in lines[4] and len(lines) == 5


# ---------------------------------------------------------------------------------------------- the real server
@pytest.fixture(scope="module")
def repo(exported, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("crashes") / "repo"
    write_repository([exported("transformer")[0]], repo, ModelSettings(threads=1, instance_count=2, max_batch_size=16))
    return repo


@pytest.fixture(scope="module")
def server(repo) -> Iterator[Server]:
    srv = Server.start(repo, http_port=0, grpc_port=0, metrics_port=0, restart=RestartPolicy(first_delay_s=0.2))
    try:
        yield srv
    finally:
        srv.stop()


def _post(server: Server, body: bytes, timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://{server.info.http_url}/v2/models/{MODEL}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _translate(server: Server, protocol: str, timeout: float = 30.0) -> str:
    lib = httpclient if protocol == "http" else grpcclient
    options = {"network_timeout": timeout} if lib is httpclient else {}
    client = lib.InferenceServerClient(server.info.url(protocol), **options)
    try:
        inp = lib.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([b"Hallo."], dtype=np.object_).reshape(1, 1))
        kwargs = {"client_timeout": timeout} if lib is grpcclient else {}
        return client.infer(MODEL, [inp], parameters={"beam_size": 1}, **kwargs).as_numpy("OUTPUT")[0, 0].decode()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classification_is_refused_and_the_server_stays_up(server, protocol) -> None:
    """Triton 2.51 divides by a BYTES output's element size (0) when asked to classify it: SIGFPE, no log line."""
    pids = server.info.pids
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(server.info.url(protocol))
    try:
        inp = lib.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([b"Hallo."], dtype=np.object_).reshape(1, 1))
        for name in ("OUTPUT", "TRUNCATED"):
            with pytest.raises(InferenceServerException) as err:
                client.infer(MODEL, [inp], outputs=[lib.InferRequestedOutput(name, class_count=1)])
            assert str(err.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT"), err.value
            assert f"output '{name}' asks for parameter 'classification'" in err.value.message()
        if protocol == "http":
            metadata = client.get_server_metadata()
        else:
            metadata = {"extensions": list(client.get_server_metadata().extensions)}
    finally:
        client.close()
    assert "classification" not in metadata["extensions"] and "binary_tensor_data" in metadata["extensions"]
    assert server.info.pids == pids and server.alive() and _translate(server, protocol)


def test_deeply_nested_data_and_many_parameters_are_refused(server) -> None:
    """Data nested ≥ 40 000 deep killed tritonserver; 100k parameters cost it 47 s of one core, blocking HTTP. Both
    are refused within 1 s, and another client's request is answered within 1 s meanwhile."""
    pids = server.info.pids
    for depth in (40_000, 100_000):
        status, body = _post(server, _nested(depth))
        assert status == 400 and b"nests deeper than %d levels" % MAX_DEPTH in body, body[:200]
    many = _body({"parameters": {f"p{i}": 1 for i in range(100_000)}, "inputs": []})
    refused: list[tuple[int, float]] = []

    def send() -> None:
        begin = time.perf_counter()
        status, _ = _post(server, many)
        refused.append((status, time.perf_counter() - begin))

    senders = [threading.Thread(target=send) for _ in range(3)]
    for sender in senders:
        sender.start()
    begin = time.perf_counter()
    assert _translate(server, "http")
    other = time.perf_counter() - begin
    for sender in senders:
        sender.join(30)
    assert [status for status, _ in refused] == [400] * 3 and max(s for _, s in refused) < 1.0, refused
    assert other < 1.0, other
    grpc = grpcclient.InferenceServerClient(server.info.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="request parameters in one request") as err:
            grpc.infer(MODEL, [_text()], parameters={f"p{i}": 1 for i in range(100_000)})
        assert str(err.value.status()) == "StatusCode.INVALID_ARGUMENT"
    finally:
        grpc.close()
    assert server.info.pids == pids and server.ready()


NON_CANONICAL = (
    f"/v2/models/{MODEL}/./infer",
    f"/v2/models/{MODEL}/x/../infer",
    f"/v2/models/{MODEL}//infer",
    f"/v2/models/{MODEL}/%2e/infer",
    f"/v2/models/{MODEL}/%2E%2E/{MODEL}/infer",
    f"/v2/models/{MODEL}%2finfer",
    f"/v2/models/{MODEL}/infer/",
)


def test_non_canonical_paths_never_reach_triton(server) -> None:
    """Issue 84: `/./infer` and its kin were forwarded unchecked and normalised by Triton, so the classification
    body (SIGFPE) and 60k-deep nesting (SIGSEGV) crashed it again. Now each is refused at the front door."""
    pids = server.info.pids
    classify = _body({"inputs": [], "outputs": [{"name": "OUTPUT", "parameters": {"classification": 1}}]})
    for path in NON_CANONICAL:
        for body in (classify, _nested(60_000)):
            assert post_raw(server.info.http_url, path, body) in (400, 403, 404), path
    assert server.info.pids == pids and server.alive() and _translate(server, "http") and _translate(server, "grpc")


def test_cancelled_grpc_streams_end_at_the_gate(server) -> None:
    """Issue 84: streams cancelled right after their first answer, back to back while others were served, crashed
    tritonserver 2.51 (SIGSEGV / bad_alloc). The gate ends every stream itself and calls Triton with unary
    requests that run to their end: 1,000 such streams, and the other client's requests are all answered."""
    pids = server.info.pids
    message = _text_request().SerializeToString()
    other: list[str] = []
    done = threading.Event()

    def other_client() -> None:
        while not done.is_set():
            other.append(_translate(server, "grpc", timeout=60))

    def cancel_streams(count: int) -> None:
        with grpc.insecure_channel(server.info.grpc_url) as channel:
            call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
            for _ in range(count):
                answers = call(iter([message, message, message]))
                first = service_pb2.ModelStreamInferResponse.FromString(next(answers))
                assert first.error_message == "" and first.infer_response.model_name == MODEL, first.error_message
                answers.cancel()

    served = threading.Thread(target=other_client)
    served.start()
    senders = [threading.Thread(target=cancel_streams, args=(250,)) for _ in range(4)]
    try:
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(600)
    finally:
        done.set()
        served.join(120)
    assert not any(sender.is_alive() for sender in senders)
    assert other and all(other), other
    assert server.info.pids == pids and server.alive()


def _text_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.parameters["beam_size"].int64_param = 1
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(len(b"Hallo.").to_bytes(4, "little") + b"Hallo.")
    return request


def _text() -> grpcclient.InferInput:
    inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([b"Hallo."], dtype=np.object_).reshape(1, 1))
    return inp


def test_a_second_start_on_the_same_repository_refuses_naming_the_server(server, repo) -> None:
    running = f"tritonserver pid {', '.join(map(str, server.info.pids))}, HTTP 127.0.0.1:{server.info.http_port}"
    with pytest.raises(ServerError, match=running):
        Server.start(repo, http_port=0, grpc_port=0, metrics_port=0)
    cli = subprocess.run(
        [sys.executable, "-m", "serve.start", f"repo={repo}", "http_port=0", "grpc_port=0", "metrics_port=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 2 and f"tritonserver pid {server.info.pids[0]}" in cli.stderr, cli.stderr
    assert f"gRPC 127.0.0.1:{server.info.grpc_port}" in cli.stderr and "serve.stop" in cli.stderr
    assert server.ready()


def test_a_killed_tritonserver_is_restarted_while_the_other_serves(server) -> None:
    """SIGKILL stands in for any crash of one replica: every request sent meanwhile, one every 0.1 s, is answered
    (the gate passes the dead replica over and retries its requests on the other), the supervisor logs the
    signal, keeps the replica's log tail as crash.1.log and restarts it, and server.json reads "degraded" until
    it is back, then "ready"."""
    state = Path(server.info.state_dir)
    old = server.info.tritons[0]
    os.kill(old.pid, signal.SIGKILL)
    begin = time.monotonic()
    answered, sent = 0, 0
    while server.info.pids[0] == old.pid or server.info.state != "ready":
        assert time.monotonic() - begin < RESTART_WITHIN_S, f"replica 0 not restarted within {RESTART_WITHIN_S} s"
        sent += 1
        answered += bool(_translate(server, "grpc" if sent % 2 else "http", timeout=10))
        time.sleep(0.1)
    took = time.monotonic() - begin
    assert answered == sent > 0, (answered, sent)
    log = Path(server.info.log).read_text()
    assert "tritonserver 0 exited with signal SIGKILL (9) without being stopped; restart 1" in log
    assert "tritonserver 0 restarted and ready" in log
    assert "signal SIGKILL" in (state / "crash.1.log").read_text()
    lost = [line for line in (state / GATE_LOG).read_text().splitlines() if "replica 0 " in line]
    assert lost and ("unreachable" in lost[0] or "broke off" in lost[0]), lost  # the gate says which and why
    assert json.loads((state / "server.json").read_text())["state"] == "ready"
    assert server.info.pids[1] == server.info.tritons[1].pid and _translate(server, "http")
    assert not _stubs_of(old.shm_prefix)  # the dead server's stubs do not outlive it
    print(f"{answered} of {sent} requests answered; replica 0 serving again {took:.1f} s after the kill")


def _stubs_of(prefix: str) -> list[str]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"triton_python_backend_stub") and any(a.startswith(prefix.encode()) for a in argv):
            found.append(proc.name)
    return found


# ---------------------------------------------------------------------------------------------- item 8: positions
def _with_positions(export_dir: Path, tmp_path: Path, positions: int, table: int | None = None) -> Path:
    copy = tmp_path / "positions"
    shutil.copytree(export_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["max_positions"] = positions
    if table is not None:
        manifest["model_config"]["max_positions"] = table
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_max_positions_over_the_exported_table_is_refused_by_name(exported, tmp_path) -> None:
    """max_positions=65536 is inside the checked range, but the graphs' position table is far smaller: every source
    over half the table failed with HTTP 500 and onnxruntime's node names. Now refused at load, naming the key."""
    export_dir = exported("transformer")[0]
    table = json.loads((export_dir / "manifest.json").read_text())["model_config"]["max_positions"]
    copy = _with_positions(export_dir, tmp_path, 65536)
    message = f"max_positions=65536 is over the exported position table .*{table}"
    with pytest.raises(rt.ExportedModelError, match=message) as err:
        export.load(copy)
    assert "\n" not in str(err.value)
    with pytest.raises(RepositoryError, match=message):
        write_repository([copy], tmp_path / "repo")
    both = _with_positions(export_dir, tmp_path / "both", 65536, table=65536)  # model_config edited as well
    with pytest.raises(rt.ExportedModelError, match=f"over the position table of encoder.onnx \\({table} positions"):
        export.load(both)


def test_onnxruntime_failures_are_one_line_without_node_names(exported) -> None:
    model = export.load(exported("transformer")[0], threads=1)
    too_long = np.full((1, model.manifest["model_config"]["max_positions"] + 50), 5, dtype=np.int64)
    with pytest.raises(rt.GraphRunError) as err:
        model.backend.encode([model.backend.encoder.get_outputs()[0].name], too_long)
    message = str(err.value)
    assert message.startswith("the encoder graph failed (") and "src_tokens [1, " in message, message
    assert "\n" not in message and "node" not in message.lower() and "/" not in message, message


def test_the_crash_is_real_and_costs_seconds(server) -> None:
    """The same classification request sent to the first replica's own loopback listener (behind the gate,
    reachable only from this machine) still kills it with SIGFPE — and the supervisor brings it back, logging the
    signal."""
    old = server.info.pids[0]
    body = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":["Hallo."]}],'
    body += b'"outputs":[{"name":"OUTPUT","parameters":{"classification":1}}]}'
    request = urllib.request.Request(f"http://{server.info.triton_http_url}/v2/models/{MODEL}/infer", data=body)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        opener.open(request, timeout=30).read()
    begin = time.monotonic()
    while server.info.pids[0] == old or server.info.state != "ready":
        assert time.monotonic() - begin < RESTART_WITHIN_S, "not restarted in time"
        time.sleep(0.2)
    assert "tritonserver 0 exited with signal SIGFPE (8)" in Path(server.info.log).read_text()
    assert _translate(server, "http") and _translate(server, "grpc")


def _lane_batches(batch_cost: int, in_progress: int, queued: list[tuple[int, float]]) -> list[list[int]]:
    """The batches an express lane runs, as lists of costs: `in_progress` is taken first and held until every ticket
    of `queued` — (cost, seconds it has waited already) — is in, so they are all ordered by the lane's rule."""
    from serve.triton.model_lanes import Lane, Ticket

    class Priced:
        def __init__(self, cost: int) -> None:
            self.cost = cost

    release = threading.Event()
    batches: list[list[int]] = []

    def run(batch: list[Ticket]) -> None:
        batches.append([t.cost for t in batch])
        release.wait(10)

    lane = Lane("express", batch_cost, 10**6, run, cheapest_first=True)
    try:
        now = time.perf_counter()
        assert lane.put(Ticket(Priced(in_progress), None, now)) is None
        while not batches:
            time.sleep(0.01)
        for cost, waited in queued:
            assert lane.put(Ticket(Priced(cost), None, now - waited)) is None
        release.set()
        while sum(map(len, batches)) < len(queued) + 1:
            time.sleep(0.01)
    finally:
        release.set()
        lane.stop()
    return batches


def test_the_express_lane_takes_the_cheapest_first_without_starving() -> None:
    """Issue 61, item 7: 16 requests just under express_cost used to form one batch a one-word request waited for
    (0.52 s median). The express lane's batches are now at most 2 × express_cost, cheapest first — and a request
    waiting over AGING_S goes first whatever its cost, so a flood of cheap ones cannot starve it."""
    batches = _lane_batches(4000, 1999, [(1999, 0.0)] * 15 + [(65, 0.0), (1998, 5.0)])  # 1998: waiting for 5 s
    # the overdue one first, with a fresh one of similar cost; the one-word request in a batch of its own
    assert batches[1] == [1998, 1999] and batches[2] == [65] and all(sum(b) <= 4000 for b in batches[3:]), batches


def test_an_aged_backlog_takes_every_other_batch_not_every_batch() -> None:
    """On a loaded machine a backlog of just-cheap requests ages past AGING_S; taking the overdue ones first on
    every batch made a one-word request wait behind all of them (1.3 s median in a full test run). While tickets are
    overdue, every other batch is theirs: the one-word request waits for at most two."""
    batches = _lane_batches(1000, 980, [(980, 5.0)] * 6 + [(65, 0.0)])  # six waiting for 5 s already
    assert batches[1:4] == [[980], [65], [980]], batches


def test_the_express_lane_batches_only_requests_of_similar_cost() -> None:
    """A batch runs until its longest search ends: a one-word request (65) batched with a just-cheap one (1 980)
    would wait for all 99 of its steps. Cheapest first, a batch takes only requests within SIMILAR_COST × of its
    first."""
    from serve.triton.model_lanes import SIMILAR_COST

    batches = _lane_batches(4000, 1980, [(c, 0.0) for c in (1980, 1980, 65, 70, 65 * SIMILAR_COST + 1)])
    assert batches[1] == [65, 70] and batches[2] == [261] and batches[3] == [1980, 1980], batches


def test_a_client_holds_half_a_lane_and_the_bulk_lane_takes_clients_in_turn() -> None:
    """model_lanes: a client's waiting tickets may take up at most 1/CLIENT_SHARE of the lane's room (one always
    fits), the rest is kept for others; the bulk lane's batches take each client's first ticket, then each one's
    second: `b`'s one request runs before `a`'s backlog."""
    from serve.triton.model_lanes import CLIENT_SHARE, Lane, Ticket

    class Priced:
        def __init__(self, cost: int) -> None:
            self.cost = cost

    release = threading.Event()
    batches: list[list[str]] = []

    def run(batch: list[Ticket]) -> None:
        batches.append([t.client for t in batch])
        release.wait(10)

    lane = Lane("bulk", 100, 400, run)
    try:
        assert lane.put(Ticket(Priced(100), None, 0.0, "a")) is None  # runs at once
        while not batches:
            time.sleep(0.01)
        share = 400 // CLIENT_SHARE
        assert [lane.put(Ticket(Priced(100), None, 0.0, "a")) for _ in range(share // 100)] == [None, None]
        refused = lane.put(Ticket(Priced(100), None, 0.0, "a"))
        assert refused is not None and "share of one client" in refused
        assert lane.put(Ticket(Priced(100), None, 0.0, "b")) is None  # the other half is b's to use
        release.set()
        while sum(map(len, batches)) < 4:
            time.sleep(0.01)
    finally:
        release.set()
        lane.stop()
    assert batches == [["a"], ["b"], ["a"], ["a"]], batches


def test_the_gate_and_the_models_name_the_client_parameter_alike() -> None:
    """The gate sends the client's name under served_models.CLIENT_PARAMETER; the models (which cannot import the
    gate's modules in their stubs) read model_requests.CLIENT_PARAMETER and ignore it as a search setting."""
    from serve.infer_request import InferRequest, client_name, encode_http
    from serve.served_models import CLIENT_PARAMETER, ServedModel

    source = (REPO / "serve" / "triton" / "model_requests.py").read_text()
    assert f'CLIENT_PARAMETER = "{CLIENT_PARAMETER}"' in source and "        CLIENT_PARAMETER,\n" in source
    model = ServedModel("m", ("1",), ("TEXT",), ("OUTPUT",), 16)
    body, head = encode_http(InferRequest(model, parameters={"beam_size": 1}, client=client_name("127.0.0.1 k")))
    parameters = json.loads(body[:head])["parameters"]
    assert parameters["beam_size"] == 1 and len(parameters[CLIENT_PARAMETER]) == 16
    assert client_name("127.0.0.1 k") != client_name("127.0.0.1 ") and client_name("") == ""


def _rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) >> 10
    raise AssertionError(f"no VmRSS for pid {pid}")


def _resident(server: Server) -> dict[str, int]:
    """MB resident of each tritonserver and of each of its Python stubs (its children)."""
    sizes = {}
    for pid in server.info.pids:
        sizes[f"tritonserver {pid}"] = _rss_mb(pid)
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            sizes[f"stub {child}"] = _rss_mb(int(child))
    return sizes


def test_large_requests_leave_no_resident_plateau(server) -> None:
    """Issue 61, item 6: 2 MB gRPC requests took tritonserver from 36 MB to a ~545 MB plateau it never gave back
    (glibc kept the freed buffers). With a fixed mmap threshold (tritonserver's environment, which its stubs
    inherit) they are unmapped when freed: tritonserver and its stubs together end within 64 MB of their idle RSS
    after 20 such requests."""
    time.sleep(1)
    idle = _resident(server)
    client = grpcclient.InferenceServerClient(server.info.grpc_url)
    try:
        inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([b"a" * (2 << 20)], dtype=np.object_).reshape(1, 1))
        for _ in range(20):
            client.infer(MODEL, [inp], parameters={"beam_size": 1})
    finally:
        client.close()
    time.sleep(1)
    after = _resident(server)
    grown = sum(after.values()) - sum(idle.values())
    print(f"resident MB idle {idle}, after 20 requests of 2 MB {after}: +{grown} MB")
    assert grown < 64, (idle, after)


def test_a_one_word_request_stays_fast_while_sixteen_just_cheap_requests_fill_the_express_lane(
    server, exported
) -> None:
    """Issue 61, item 7: 16 clients each keep a request priced just under `express_cost` in flight (4 rows × beam 5 ×
    forced tokens, plus the per-request price: ≥ 950 of 1 000), so every one of them runs in the express lane beside
    the one-word requests; those were answered in 0.52 s median when the lane ran 16 as one batch (then at 2 000).
    Its batches are now at most 1 × express_cost, cheapest first, of similar cost only. The median is printed
    (serve/README.md states it); the bound asserted is loose, for a machine running other work."""
    express_cost = ModelSettings().express_cost  # the repository fixture's (default) lane limit
    export_dir = exported("transformer")[0]
    model = export.load(export_dir, threads=1)
    rows = (json.loads((export_dir / "heldout.json").read_text())["src"] * 4)[:4]
    rule = PriceRule.read(DEFAULT_PRICES)  # the repository fixture's prices: the lanes count them

    def priced(tokens: int) -> tuple[dict, int]:
        settings = {"beam_size": 5, "max_len_a": 0.0, "max_len_b": tokens, "min_len": tokens}
        steps = model.request_cost([len(ids) for ids in model.encode_texts(rows)], model.search_settings(**settings))
        return settings, rule.price(steps, len(rows), ("beam",))

    tokens = max(t for t in range(1, express_cost // 20) if priced(t)[1] <= express_cost)  # 4 rows × beam 5
    settings, cost = priced(tokens)
    assert 0.95 * express_cost < cost <= express_cost, cost
    cheap = np.array([r.encode() for r in rows], dtype=np.object_).reshape(4, 1)
    one_word = np.array([[b"Hallo."]], dtype=np.object_)

    def probe(client: grpcclient.InferenceServerClient) -> None:
        inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(one_word)
        client.infer(MODEL, [inp], client_timeout=60)

    flood_run = flood_while_probing(server.info.grpc_url, MODEL, cheap, settings, probe, probes=15, timeout=120)
    answered, failures, latencies = flood_run.answered, flood_run.failures, flood_run.probes
    median = statistics.median(latencies)
    flood = statistics.median(answered)
    print(f"one-word median {median:.3f} s (max {max(latencies):.3f}); just-cheap median {flood:.3f} s")
    assert failures == [], failures[:2]
    assert flood > median  # the flood really is heavier than the one-word requests
    assert median <= 1.0, latencies


def test_logs_stay_bounded_under_fifty_thousand_bad_requests(server) -> None:
    """Issue 61, item 4: a headers-only request over the body cap is answered 413 by nginx and used to add 187 B to
    its error.log each (~5 300 a second from one client), a log nothing rotated. nginx now logs to the gate, which
    writes the first few of a kind per minute and counts the rest; every log is also rotated by size."""
    state = Path(server.info.state_dir)
    error_log = state / "nginx" / "error.log"
    before = error_log.stat().st_size if error_log.exists() else 0
    request = b"POST /v2/models/x/infer HTTP/1.1\r\nHost: a\r\nContent-Length: 999999999\r\n\r\n"
    for _ in range(50_000):
        with socket.create_connection(("127.0.0.1", server.info.http_port), timeout=10) as s:
            s.sendall(request)
            assert s.recv(64).startswith(b"HTTP/1.1 413")
    time.sleep(1)  # the last datagrams written
    assert error_log.stat().st_size - before < 5_000, error_log.stat().st_size  # 50 000 × 187 B unlimited
    limits = {"server.log": SERVER_LOG_BYTES, "error.log": PROXY_LOG_BYTES, "stdout.log": PROXY_LOG_BYTES}
    for path in state.rglob("*.log"):
        assert path.stat().st_size <= limits.get(path.name, PROXY_LOG_BYTES), path
    assert _translate(server, "http")


def test_the_gate_bench_measures_every_path(server) -> None:
    """`python -m serve.bench.gate`'s measurement (README: what the gate costs) on the test server, 3 rounds."""
    from serve.bench.gate import measure

    result = measure(server, rounds=3)
    assert set(result["median_ms"]) == {
        f"{p} {h}" for p in ("http", "grpc") for h in ("nginx>gate>triton", "gate>triton", "triton")
    }
    assert all(ms > 0 for ms in result["median_ms"].values())
    assert set(result["median_extra_ms_vs_triton"]) == {
        "http gate>triton",
        "http nginx>gate>triton",
        "grpc gate>triton",
        "grpc nginx>gate>triton",
    }


def test_the_flood_bench_reports_a_flood_with_its_probe(server) -> None:
    """serve/bench/floods.py on the module's server: one flood, two seconds — its senders ran, the probe was
    answered beside it, memory was read for every process and the report renders the row."""
    row = run_flood(server, "non_canonical_paths", seconds=2.0, settle_s=0.5)
    assert row["flood_requests"] > 0 and row["crashes"] == 0 and row["answered"] == row["probes"] > 0, row
    assert all(row[k]["gate"] > 0 and row[k]["tritonserver"] > 0 for k in ("idle_mb", "peak_mb", "after_mb"))
    result = {"date": "d", "cpu": "c", "model": MODEL, "seconds": 2.0, "command": "python -m serve.bench.floods …"}
    assert "| non_canonical_paths |" in render({**result, "floods": [row]})


def test_prices_follow_what_requests_cost(server, exported) -> None:
    """Issue 84: a sampled request cost 14.5–16× a plain one of the same price, the repetition options 3.5–5×, and
    empty sources were priced 0. Now each is priced within 2× of its measured cost relative to a plain request
    (the rule's factors: serve/triton/default_prices.json, this repository's calibration). The least of 11 rounds is
    each kind's cost: beside the other test worker, the median of 16 empty sources read 5.6 ms (3.3–3.7 alone, the
    same Intel Xeon) — waiting for a core, not work."""
    export_dir = exported("transformer")[0]
    kinds = request_kinds(export.load(export_dir, threads=1), export_dir, length=40)
    kinds = {name: kinds[name] for name in ("plain", "sampling", "repetition_penalty", f"empty_{ROWS}")}
    seconds = measure(server.info.triton_grpc_url, MODEL, kinds, rounds=11, statistic=min)
    rule = PriceRule.read(DEFAULT_PRICES)

    def price(name: str) -> int:
        texts, _, steps = kinds[name]
        return rule.price(steps, len(texts), (name,) if name in rule.factors else ())

    for name in ("sampling", "repetition_penalty", f"empty_{ROWS}"):
        priced, measured = price(name) / price("plain"), seconds[name] / seconds["plain"]
        assert 0.5 <= priced / measured <= 2.0, (name, priced, measured, seconds)


def test_a_request_in_flight_at_two_crashes_is_refused_and_others_are_served(server) -> None:
    """Issue 84: a client resending a crashing request whenever the server was ready kept it down. A crash of every
    replica is injected (SIGSEGV) twice while the same slow request is in flight (once, the gate's retry on the
    other replica answers it); its third sending is refused by the gate (503, Retry-After) without reaching
    Triton, while other requests are answered."""
    slow = _body(
        {
            "parameters": {
                "beam_size": 1,
                "sampling": 1,
                "num_hypotheses": 64,
                "min_len": 120,
                "max_len_a": 0,
                "max_len_b": 120,
            },
            "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["Hallo Welt."]}],
        }
    )
    for _ in range(2):
        _translated_within(server, RESTART_WITHIN_S)
        answers: list[int] = []
        sender = threading.Thread(target=lambda got=answers: got.append(_post(server, slow, timeout=60)[0]))
        sender.start()
        time.sleep(0.3)  # the request is in Triton: it takes over a second on the smoke model
        for pid in server.info.pids:
            os.kill(pid, signal.SIGSEGV)
        sender.join(60)
        assert answers == [503], answers
    _translated_within(server, RESTART_WITHIN_S)
    pids = server.info.pids
    status, body = _post(server, slow)
    assert status == 503 and b"crashed" in body and b"refused for" in body, body
    assert server.info.pids == pids and _translate(server, "http") and _translate(server, "grpc")
    _every_replica_serving(server)


def _every_replica_serving(server: Server) -> None:
    """Wait until the supervisor has every replica back ("ready", not "degraded" or "restarting"): a test that
    crashed them must not hand the next one a server still loading its models."""
    deadline = time.monotonic() + RESTART_WITHIN_S
    while server.info.state != "ready":
        assert time.monotonic() < deadline, f"replicas not all back within {RESTART_WITHIN_S} s: {server.info.state}"
        time.sleep(0.2)


def _translated_within(server: Server, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            assert _translate(server, "grpc", timeout=5)
            return
        except InferenceServerException:
            assert time.monotonic() < deadline, f"not serving within {seconds} s"
            time.sleep(0.2)


@pytest.fixture
def own_server(exported, tmp_path) -> Iterator[Server]:
    """A server of its own, as `server` is configured: what the module's earlier tests leave in theirs (the gate's
    crash memory of requests in flight at their injected crashes, replicas still restarting, calls still running
    inside Triton) must not decide a test about the lanes."""
    repo = tmp_path / "repo"
    write_repository([exported("transformer")[0]], repo, ModelSettings(threads=1, instance_count=2, max_batch_size=16))
    srv = Server.start(repo, http_port=0, grpc_port=0, metrics_port=0)
    try:
        yield srv
    finally:
        srv.stop()


def test_one_client_at_the_cost_cap_leaves_room_in_the_bulk_lanes_for_another(own_server) -> None:
    """Issue 84: one client keeping 40 maximum-cost requests in flight filled every bulk lane, and every other bulk
    request was refused (503, busy). A client now holds at most half of a lane's room and the bulk lane takes the
    clients in turn: client `b`'s bulk requests are answered while `a` floods — and `a` is refused its excess."""
    from serve.bench.floods import _infer_body, maximum_cost_body
    from serve.proxy import CLIENT_KEY_HEADER

    server = own_server

    def post(body: bytes, key: str) -> int:
        connection = http.client.HTTPConnection(*server.info.http_url.rsplit(":", 1), timeout=120)
        try:
            connection.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers={CLIENT_KEY_HEADER: key})
            answer = connection.getresponse()
            answer.read()
            return answer.status
        finally:
            connection.close()

    heavy = maximum_cost_body()
    bulk = _infer_body(["Hallo Welt."] * 4, {"beam_size": 5, "min_len": 60, "max_len_a": 0.0, "max_len_b": 60})
    flooding = threading.Event()
    flooding.set()
    flood: list[int] = []

    def keep() -> None:
        while flooding.is_set():
            flood.append(post(heavy, "a"))

    senders = [threading.Thread(target=keep) for _ in range(40)]
    for sender in senders:
        sender.start()
    try:
        time.sleep(3.0)  # the lanes are full of `a`'s requests
        other = [post(bulk, "b") for _ in range(3)]
    finally:
        flooding.clear()
        for sender in senders:
            sender.join(300)
    print(f"client a: {flood.count(200)} answered, {flood.count(503)} refused busy; client b: {other}")
    assert other == [200, 200, 200], other
    assert flood.count(503) > 0 and flood.count(200) > 0  # `a` did saturate its share, and was served within it
    assert set(flood) <= {200, 503}, set(flood)  # nothing else: its requests were within the cost cap
