"""The gate's readers without a server (issue 84): what our clients send is read and rebuilt unchanged in meaning,
everything else is refused in one line, and a refused message costs what was read before its first excess.

The requests are the ones tritonclient writes (its own request builders), so these tests follow the client library,
not a copy of its format; the crash bodies are those that took tritonserver 2.51 down (tests/test_serve_crashes.py
sends them to a real server through nginx and the gate).
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from export import runtime as rt
from serve.gate_http import Route, canonical_route
from serve.grpc_infer import read_grpc_infer, read_model_name
from serve.http_infer import MAX_DEPTH, read_http_infer
from serve.infer_request import RequestRefused, encode_grpc, encode_http
from serve.served_models import ServedModel
from serve.wire import WireError, encode_len_field, fields

MODEL = ServedModel(
    name="transformer-smoke",
    versions=("1",),
    inputs=("TEXT", "TARGET", "PREFIX"),
    outputs=("OUTPUT", "TRUNCATED", "SCORES", "TOKEN_SCORES", "ALIGNMENT"),
    max_batch_size=16,
)
MODELS = {MODEL.name: MODEL}
EVERY_PARAMETER = {**{name: 1 for name in rt.SEARCH_LIMITS}, "num_hypotheses": 2, "return_scores": True}


def _http_body(binary: bool, rows: int = 2) -> tuple[bytes, int | None]:
    """What tritonclient's HTTP client sends: TEXT and PREFIX rows, every parameter our models read, outputs."""
    texts = np.array([f"Hallo {i}.".encode() for i in range(rows)], dtype=np.object_).reshape(rows, 1)
    inputs = []
    for name, data in (("TEXT", texts), ("PREFIX", np.array([b"Hello"] * rows, dtype=np.object_).reshape(rows, 1))):
        tensor = httpclient.InferInput(name, [rows, 1], "BYTES")
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT", "TRUNCATED", "SCORES")]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="r1", parameters=EVERY_PARAMETER
    )
    return body, json_size


def _grpc_message(rows: int = 2, **extra) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest as tritonclient's gRPC client builds it: inputs' bytes as raw contents."""
    message = service_pb2.ModelInferRequest(model_name=MODEL.name, id="r1", **extra)
    for name, value in EVERY_PARAMETER.items():
        if isinstance(value, bool):
            message.parameters[name].bool_param = value
        else:
            message.parameters[name].int64_param = value
    message.inputs.add(name="TEXT", datatype="BYTES", shape=[rows, 1])
    message.raw_input_contents.append(b"".join(len(t).to_bytes(4, "little") + t for t in [b"Hallo."] * rows))
    message.outputs.add(name="OUTPUT")
    return message


def _refused(call, *args) -> str:
    with pytest.raises(RequestRefused) as err:
        call(*args)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    return message


# ---------------------------------------------------------------------------------------------- what passes
@pytest.mark.parametrize("binary", [False, True])
def test_an_http_request_of_our_clients_is_rebuilt_with_the_same_meaning(binary) -> None:
    body, json_size = _http_body(binary)
    request = read_http_infer(body, None if json_size is None else str(json_size), MODEL)
    assert request.id == "r1" and request.parameters == EVERY_PARAMETER
    assert request.inputs == {"TEXT": [b"Hallo 0.", b"Hallo 1."], "PREFIX": [b"Hello", b"Hello"]}
    assert [(o.name, o.binary) for o in request.outputs.values()] == [
        (n, binary) for n in ("OUTPUT", "TRUNCATED", "SCORES")
    ]
    rebuilt, head = encode_http(request)  # what Triton receives reads back as the same request
    assert read_http_infer(rebuilt, str(head), MODEL) == request
    message = service_pb2.ModelInferRequest.FromString(encode_grpc(request))
    assert [(t.name, list(t.shape)) for t in message.inputs] == [("TEXT", [2, 1]), ("PREFIX", [2, 1])]
    assert message.parameters["beam_size"].int64_param == 1 and message.parameters["return_scores"].bool_param


def test_a_grpc_request_of_our_clients_is_rebuilt_with_the_same_meaning() -> None:
    sent = _grpc_message()
    request = read_grpc_infer(sent.SerializeToString(), MODELS)
    assert request.parameters == EVERY_PARAMETER and request.inputs == {"TEXT": [b"Hallo.", b"Hallo."]}
    assert service_pb2.ModelInferRequest.FromString(encode_grpc(request)) == sent
    # BYTES as contents (bytes_contents) rather than raw contents: the same request
    contents = _grpc_message()
    del contents.raw_input_contents[:]
    contents.inputs[0].contents.bytes_contents.extend([b"Hallo.", b"Hallo."])
    assert read_grpc_infer(contents.SerializeToString(), MODELS) == request
    flagged = _grpc_message()  # perf_analyzer's flag for decoupled models: read, not forwarded (the call is unary)
    flagged.parameters["triton_enable_empty_final_response"].bool_param = True
    assert read_grpc_infer(flagged.SerializeToString(), MODELS) == request
    double = service_pb2.ModelInferRequest(model_name=MODEL.name)
    double.parameters["len_penalty"].double_param = 0.5
    double.parameters["return_scores"].string_param = "true"
    double.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(b"x")
    assert read_grpc_infer(double.SerializeToString(), MODELS).parameters == {
        "len_penalty": 0.5,
        "return_scores": "true",
    }


# ---------------------------------------------------------------------------------------------- what is refused
def test_the_crash_requests_are_refused_over_http() -> None:
    """Classification of an output (SIGFPE in 2.51), deep nesting (SIGSEGV), 100k parameters (47 s of Triton)."""
    classify = {"inputs": [], "outputs": [{"name": "OUTPUT", "parameters": {"classification": 1}}]}
    assert "asks for parameter 'classification'" in _refused(
        read_http_infer, json.dumps(classify).encode(), None, MODEL
    )
    for depth in (MAX_DEPTH + 1, 60_000, 100_000):
        data = b"[" * depth + b'"Hallo."' + b"]" * depth
        body = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":%s}]}' % data
        assert f"nests deeper than {MAX_DEPTH} levels" in _refused(read_http_infer, body, None, MODEL)
    many = json.dumps({"parameters": {f"p{i}": 1 for i in range(100_000)}}).encode()
    assert "holds more values than any request to this model needs" in _refused(read_http_infer, many, None, MODEL)
    small_arrays = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":[%s]}]}' % b",".join(
        [b"[[]]"] * 800_000
    )
    assert "holds more values" in _refused(read_http_infer, small_arrays, None, MODEL)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"parameters": {"p0": 1}}, "unknown request parameter 'p0'"),
        ({"parameters": {"beam_size": [1]}}, "must be a number, a boolean or a short text"),
        (
            {"inputs": [{"name": "LOGITS", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]},
            "has no input 'LOGITS'",
        ),
        ({"inputs": [{"name": "TEXT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}, "send BYTES"),
        ({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [17, 1], "data": ["x"] * 17}]}, "rows ≤ 16"),
        ({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2, 1], "data": ["x"]}]}, "1 rows of data"),
        ({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [[["x"]]]}]}, "must be texts"),
        (
            {
                "inputs": [
                    {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "parameters": {"shared_memory_region": "r"}}
                ]
            },
            "asks for parameter 'shared_memory_region'",
        ),
        ({"outputs": [{"name": "SECRET"}], "inputs": []}, "has no output 'SECRET'"),
        ({"sequence_id": 1}, "the request has the key 'sequence_id'"),
        ({}, "the request has no input"),
    ],
)
def test_anything_else_is_refused_in_one_line_naming_the_fix(body, message) -> None:
    assert message in _refused(read_http_infer, json.dumps(body).encode(), None, MODEL)


def test_malformed_http_bodies_are_refused() -> None:
    assert "repeats the key" in _refused(read_http_infer, b'{"parameters":{"a":1,"a":2}}', None, MODEL)
    assert "failed to parse the request JSON" in _refused(read_http_infer, b"aaaa", None, MODEL)
    assert "failed to parse" in _refused(read_http_infer, b'{"parameters":{"beam_size":NaN}}', None, MODEL)
    assert "Inference-Header-Content-Length" in _refused(read_http_infer, b"{}", "99", MODEL)
    body, json_size = _http_body(binary=True)
    assert "bytes after the inputs' binary data" in _refused(read_http_infer, body + b"x", str(json_size), MODEL)
    assert "runs past the end of the body" in _refused(read_http_infer, body[:-1], str(json_size), MODEL)
    broken = body[: -len(b"Hello") - 4] + b"\x06\x00\x00\x00Hello"  # the last element claims one byte more
    assert "length-prefixed elements" in _refused(read_http_infer, broken, str(json_size), MODEL)


def test_the_crash_requests_are_refused_over_grpc() -> None:
    classify = _grpc_message()
    classify.outputs[0].parameters["classification"].int64_param = 1
    assert "asks for parameter 'classification'" in _refused(read_grpc_infer, classify.SerializeToString(), MODELS)
    many = _grpc_message()
    for i in range(100_000):
        many.parameters[f"p{i}"].int64_param = i
    assert "request parameters in one request" in _refused(read_grpc_infer, many.SerializeToString(), MODELS)
    unknown = _grpc_message()
    unknown.parameters["priority"].int64_param = 1
    assert "unknown request parameter 'priority'" in _refused(read_grpc_infer, unknown.SerializeToString(), MODELS)
    other = service_pb2.ModelInferRequest(model_name="ensemble")
    assert "not served here" in _refused(read_grpc_infer, other.SerializeToString(), MODELS)
    assert "could not be read" in _refused(read_grpc_infer, b"\x0a\xff\xff", MODELS)
    assert "could not be read" in _refused(read_grpc_infer, b"\x0b", MODELS)  # a group: no proto3 message has one


def test_a_refused_four_megabyte_message_of_empty_inputs_costs_kilobytes() -> None:
    """Issue 84: protobuf's parser spent ≈ 400 MB on 2M empty inputs; the wire reader stops at the ninth."""
    message = encode_len_field(1, MODEL.name.encode()) + b"\x2a\x00" * 2_000_000  # field 5 (inputs), empty
    assert len(message) > 4_000_000
    tracemalloc.start()
    try:
        assert "more than 8 inputs" in _refused(read_grpc_infer, message, MODELS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, peak
    elements = service_pb2.ModelInferRequest(model_name=MODEL.name)
    elements.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.extend([b""] * 500_000)
    assert "more than 1 elements of input 'TEXT'" in _refused(read_grpc_infer, elements.SerializeToString(), MODELS)


def test_the_wire_reader_refuses_what_runs_past_the_end() -> None:
    for broken in (b"\x0a\x05abc", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x00\x01"):
        with pytest.raises(WireError):
            list(fields(broken))
    assert [(n, k) for n, k, _ in fields(b"\x08\x01\x12\x02hi")] == [(1, 0), (2, 2)]


def test_model_requests_name_a_served_model_and_version() -> None:
    ready = service_pb2.ModelReadyRequest(name=MODEL.name, version="1").SerializeToString()
    assert read_model_name(ready, MODELS) == (MODEL.name, "1")
    assert "no version '2'" in _refused(
        read_model_name, service_pb2.ModelReadyRequest(name=MODEL.name, version="2").SerializeToString(), MODELS
    )
    assert "not served here" in _refused(read_model_name, b"\x0a\x03abc", MODELS)


# ---------------------------------------------------------------------------------------------- routes
@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/transformer-smoke/./infer",
        "/v2/models/transformer-smoke/x/../infer",
        "/v2/models/transformer-smoke//infer",
        "//v2/models/transformer-smoke/infer",
        "/v2/models/transformer-smoke/%2e/infer",
        "/v2/models/transformer-smoke%2Finfer",
        "/v2/models/transformer-smoke/infer/",
        "/v2/models/transformer-smoke/infer/.",
        "/v2/models/transformer-smoke/versions/1/../../transformer-smoke/infer",
        "/v2/systemsharedmemory/region/x/register",
        "/v2/models/transformer-smoke/stats",
        "/v2/logging",
        "/v2/",
    ],
)
def test_a_path_that_is_not_canonical_or_not_served_is_not_a_route(path) -> None:
    assert isinstance(canonical_route("POST", path), str)


def test_the_served_routes() -> None:
    assert canonical_route("POST", "/v2/models/m/infer?x=1") == Route("infer", "/v2/models/m/infer", "m", "", "/infer")
    assert canonical_route("POST", "/v2/models/m/versions/3/infer").version == "3"
    assert canonical_route("GET", "/v2/models/m/config") == Route("model", "/v2/models/m/config", "m", "", "/config")
    assert canonical_route("GET", "/v2/health/ready") == Route("server", "/v2/health/ready")
    assert canonical_route("POST", "/v2/repository/index") == Route("index", "/v2/repository/index")
    assert canonical_route("GET", "/v2/models/m/infer").endswith("only")  # type: ignore[union-attr]
    assert canonical_route("DELETE", "/v2").endswith("only")  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------- prices
def test_the_price_rule_weighs_row_steps_by_their_options_and_adds_the_fixed_costs(tmp_path) -> None:
    """serve/triton/model_prices.py, from the formula: row-steps × (1 + Σ (factor − 1)) + rows × per_row + per_request,
    rounded up; the default calibration is a stored report of `python -m serve.bench.prices`."""
    from types import SimpleNamespace

    from serve.model_config import DEFAULT_PRICES, RepositoryError, copy_model_code
    from serve.triton.model_prices import PriceRule, options_of

    calibration = tmp_path / "prices.json"
    calibration.write_text(
        json.dumps({"factors": {"sampling": 4.0, "repetition_penalty": 2.5}, "per_row": 1.5, "per_request": 40})
    )
    rule = PriceRule.read(calibration)
    assert rule.factors["beam"] == 1.0 and rule.price(0, 0, ()) == 40
    assert rule.price(640, 16, ()) == 640 + 24 + 40
    assert rule.price(640, 16, ("sampling", "repetition_penalty")) == 640 * 5.5 + 24 + 40
    plain = SimpleNamespace(
        beam_size=5, sampling=0, repetition_penalty=1.0, no_repeat_ngram_size=0, return_alignments=False
    )
    sampled = SimpleNamespace(
        beam_size=1, sampling=1, repetition_penalty=1.2, no_repeat_ngram_size=3, return_alignments=True
    )
    assert options_of(plain) == ("beam",)
    assert options_of(sampled) == (
        "sampling",
        "repetition_penalty",
        "no_repeat_ngram_size",
        "return_alignments",
    )
    report = json.loads(DEFAULT_PRICES.read_text())
    assert report["command"].startswith("python -m serve.bench.prices") and report["cpu"] and report["median_ms"]
    assert PriceRule.read(DEFAULT_PRICES).factors["sampling"] == report["factors"]["sampling"] > 1
    calibration.write_text(json.dumps({"factors": {"sampling": 0.5}, "per_row": 0, "per_request": 0}))
    with pytest.raises(RepositoryError, match=r"not a price calibration.*serve\.bench\.prices"):
        copy_model_code(tmp_path, "translator_model.py", str(calibration))


# ---------------------------------------------------------------------------------------------- crash memory
def test_a_request_in_flight_at_two_crashes_is_refused_for_a_while() -> None:
    """serve/crash_memory.py: the requests in flight on a replica when it first breaks off get a strike each; two
    within the window refuse that request for `refuse_s`; calls while it stays down, calls it refused to connect
    and calls on another replica strike nothing."""
    from serve.crash_memory import ANSWERED, BROKE_OFF, MOST_REMEMBERED, UNREACHABLE, CrashMemory

    memory = CrashMemory(strikes=2, window_s=600, refuse_s=600)
    crasher, bystander, later, elsewhere = (memory.digest(b) for b in (b"crash", b"other", b"later", b"there"))
    for _ in range(2):
        first, second = memory.begin(crasher, 0), memory.begin(bystander, 0)
        on_other = memory.begin(elsewhere, 1)
        memory.end(first, BROKE_OFF)  # replica 0 lost: both in flight on it get a strike
        memory.end(memory.begin(later, 0), BROKE_OFF)  # sent while it is down: nothing
        memory.end(second, BROKE_OFF)
        memory.end(on_other, ANSWERED)
        memory.end(memory.begin(later, 0), ANSWERED)  # replica 0 back
    assert memory.refused_for(crasher) > 599 and "refused for" in memory.message(memory.refused_for(crasher))
    assert memory.refused_for(bystander) > 0 and memory.refused_for(later) == 0  # both were there twice
    assert memory.refused_for(elsewhere) == 0 and not memory.suspect(elsewhere)
    memory.end(memory.begin(bystander, 1), ANSWERED)  # … but the bystander is answered now: not the culprit
    assert memory.refused_for(bystander) == 0 and bystander not in memory.seen
    memory.end(memory.begin(later, 1), UNREACHABLE)  # never reached replica 1: no crash seen there
    assert not memory.suspect(later) and 1 in memory.lost
    memory.crashed_during(later, now=0.0)
    memory.crashed_during(later, now=700.0)  # a strike older than the window does not count
    assert memory.refused_for(later, now=701.0) == 0
    assert memory.refused_for(crasher, now=10**6) == 0  # refusal ends
    for i in range(MOST_REMEMBERED + 10):
        memory.crashed_during(memory.digest(str(i).encode()))
    assert len(memory.seen) == MOST_REMEMBERED


# ---------------------------------------------------------------------------------------------- replicas
def _replay(upstreams: Any, digest: bytes, outcomes: list[str], log: list[tuple[int, str]]) -> Any:
    """Upstreams.call with a `send` that plays the next of `outcomes` on whichever replica it is given: "ok"
    answers, "crash" breaks off, "refused" is not reached; every call is logged as (replica, outcome)."""
    from serve.upstreams import UpstreamLost

    async def send(replica: Any) -> str:
        outcome = outcomes.pop(0)
        log.append((replica.index, outcome))
        await asyncio.sleep(0.01)
        if outcome != "ok":
            raise UpstreamLost(broke_off=outcome == "crash")
        return f"answered by {replica.index}"

    return upstreams.call(digest, send)


def test_a_call_lost_on_one_replica_is_answered_by_the_other() -> None:
    """serve/upstreams.py: the least busy replica that is up takes a call; one that broke off (a crash) or refused
    is passed over, and the call is retried once on the other — the crashed replica's requests get a strike,
    which a retry that is answered clears."""
    from serve.upstreams import UpstreamLost, Upstreams

    async def scenario() -> None:
        upstreams = Upstreams.on_ports([1, 2], [3, 4])
        digest, log = upstreams.memory.digest(b"request"), []
        answer = await _replay(upstreams, digest, ["crash", "ok"], log)
        (crashed, _), (other, _) = log
        assert crashed != other and answer == f"answered by {other}"
        assert not upstreams.memory.suspect(digest)  # answered on the retry: not a crasher
        log.clear()
        await _replay(upstreams, b"", ["ok"], log)
        assert log == [(other, "ok")]  # the crashed one is passed over for DOWN_S
        log.clear()
        with pytest.raises(UpstreamLost):  # both unreachable: tried once each, then 503 "restarting" from the front
            await _replay(upstreams, digest, ["refused", "refused"], log)
        assert sorted(r for r, _ in log) == [0, 1] and not upstreams.memory.suspect(digest)
        for replica in upstreams.replicas:
            replica.down_until = 0.0
        log.clear()
        await asyncio.gather(*(_replay(upstreams, b"", ["ok"] * 4, log) for _ in range(4)))
        assert sorted(r for r, _ in log) == [0, 0, 1, 1]  # spread by what each has in flight

    asyncio.run(scenario())


def test_suspects_run_one_at_a_time_so_a_crasher_alone_is_there_twice() -> None:
    """A request in flight at a crash is retried on the other replica; were it the crasher, it takes that one down
    too. Suspects run one at a time, so the innocent requests of the first crash are answered (strikes cleared)
    and only the crasher was in flight at both crashes: only its repeats are refused."""
    from serve.upstreams import Upstreams

    async def scenario() -> None:
        upstreams = Upstreams.on_ports([1, 2], None)
        memory = upstreams.memory
        crasher, innocent = memory.digest(b"crasher"), memory.digest(b"innocent")
        for digest in (crasher, innocent):
            memory.crashed_during(digest)  # both were in flight when replica 0 crashed
        for replica in upstreams.replicas:
            replica.down_until = 0.0
        running: list[int] = []
        most = 0

        def sender(digest: bytes) -> Any:
            async def send(replica: Any) -> str:
                nonlocal most
                running.append(1)
                most = max(most, len(running))
                await asyncio.sleep(0.02)
                running.pop()
                if digest == crasher:
                    from serve.upstreams import UpstreamLost

                    raise UpstreamLost(broke_off=True)
                return "ok"

            return send

        results = await asyncio.gather(
            upstreams.call(crasher, sender(crasher)), upstreams.call(innocent, sender(innocent)), return_exceptions=True
        )
        assert results[1] == "ok" and isinstance(results[0], Exception)
        assert most == 1  # never two suspects in flight at once
        assert memory.refused_for(crasher) > 0 and memory.refused_for(innocent) == 0

    asyncio.run(scenario())


def test_the_replicas_metrics_are_one_page_each_sample_labelled() -> None:
    """serve/gate_metrics.py: each family's HELP and TYPE once, then its samples from every replica with a `replica`
    label (histogram parts stay in their family); a replica that could not be read is left out."""
    from serve.gate_metrics import merge_metrics

    def page(count: int) -> str:
        return (
            "# HELP nv_inference_count Number of inferences\n# TYPE nv_inference_count counter\n"
            f'nv_inference_count{{model="m",version="1"}} {count}\n'
            "# HELP zoo_latency_seconds Latency\n# TYPE zoo_latency_seconds histogram\n"
            f'zoo_latency_seconds_bucket{{model="m",le="0.1"}} {count}\nzoo_latency_seconds_count {count}\n'
        )

    merged = merge_metrics([page(3), None, page(5)])
    assert merged.splitlines() == [
        "# HELP nv_inference_count Number of inferences",
        "# TYPE nv_inference_count counter",
        'nv_inference_count{replica="0",model="m",version="1"} 3',
        'nv_inference_count{replica="2",model="m",version="1"} 5',
        "# HELP zoo_latency_seconds Latency",
        "# TYPE zoo_latency_seconds histogram",
        'zoo_latency_seconds_bucket{replica="0",model="m",le="0.1"} 3',
        'zoo_latency_seconds_count{replica="0"} 3',
        'zoo_latency_seconds_bucket{replica="2",model="m",le="0.1"} 5',
        'zoo_latency_seconds_count{replica="2"} 5',
    ]
