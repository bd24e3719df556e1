"""Serving (issue 6): smoke-trained models → export → Triton repository → a real tritonserver from the
pytriton wheel → HTTP and gRPC clients, compared with the in-process export runtime; robustness, bounded
concurrent load, the summarizer, the NGC/BLS variant against Python stand-ins, the CLIs and the benchmark.

Generation in the server batches whatever the dynamic batcher gathered, and floating-point results may depend
on the batch composition (padding, GEMM shapes), so exact-equality checks send one request at a time: then an
execute call holds exactly that request and must equal `export.load(dir).translate(request texts)`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from hydra import compose, initialize_config_dir
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

import export
from export.exporter import export_checkpoint
from serve.client import Client, ClientError, translate
from serve.ngc import python_standins
from serve.repository import ModelSettings, RepositoryError, write_repository
from serve.server import OUR_SHM, SHM_DIR, Server, ServerError, _mapped_shm, free_port
from tests.conftest import smoke_overrides
from tests.zoo_testing import REPO, compose_train
from zoo.entries import CONF_DIR

PROTOCOLS = ("http", "grpc")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _export(run_dir: Path, out: Path) -> Path:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="export", overrides=[f"checkpoint={run_dir}", f"out={out}", "runtime.threads=1",
                                                       "verify.sentences=16"])
    export_checkpoint(cfg)
    return out


def _cli(module: str, *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=ENV, **kwargs)


@pytest.fixture(scope="module")
def translator_export(smoke_run, tmp_path_factory) -> Path:
    return _export(smoke_run("transformer"), tmp_path_factory.mktemp("exp") / "transformer-smoke")


@pytest.fixture(scope="module")
def summarizer_export(tmp_path_factory) -> Path:
    """A smoke summarizer on real `data=summ` documents (Debian long description → synopsis), written as a small
    JSONL corpus named `summ` so the model is `transformer-summ` like a `data=summ` run."""
    from zoo.data import build_splits
    from zoo.train import train

    splits = build_splits(compose_train(["+model=transformer", "data=summ"]).data)
    root = tmp_path_factory.mktemp("summ_corpus")
    for split, examples, n in (("train", splits.train, 3000), ("valid", splits.valid, 24),
                               ("test", splits.test, 24)):
        picked = [e for e in examples if len(e.src.split()) <= 60][:n]
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"src": e.src, "tgt": e.tgt}) + "\n"
                                                     for e in picked))
    runs = tmp_path_factory.mktemp("summ_runs")
    replaced = ("data.max_len=", "data.name=", "trainer.max_updates=")
    overrides = [o for o in smoke_overrides("transformer", root, runs) if not o.startswith(replaced)]
    overrides += ["data.format=jsonl", "data.name=summ", "data.task=summarization", "data.max_len=128",
                  "trainer.max_updates=150"]
    run_dir = Path(train(compose_train(overrides))["run_dir"])
    return _export(run_dir, tmp_path_factory.mktemp("exp") / "transformer-summ")


@pytest.fixture(scope="module")
def repo(translator_export, summarizer_export, tmp_path_factory) -> Path:
    """Both models in one repository, written by the CLI (key=value overrides for the Triton settings)."""
    repo = tmp_path_factory.mktemp("triton") / "repo"
    proc = _cli("serve.repository", f"export_dir=[{translator_export},{summarizer_export}]", f"repo={repo}",
                "triton.max_batch_size=16", "triton.preferred_batch_size=[4,8,16]",
                "triton.max_queue_delay_microseconds=3000", "triton.threads=1")
    assert proc.returncode == 0, proc.stderr
    return repo


def _shm(prefix: str) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{prefix}*"))


def _processes(marker: str, wait: float = 15.0) -> list[int]:
    """Live processes whose command line contains `marker` (the server's shm prefix is in every Python stub's
    arguments), after up to `wait` s for them to exit."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if marker.encode() in cmdline.read_bytes():
                    stat = (cmdline.parent / "stat").read_text()
                    if stat.rsplit(") ", 1)[-1][:1] != "Z":
                        found.append(int(cmdline.parent.name))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _assert_gone(pid: int, prefix: str) -> None:
    assert _processes(prefix) == [], "Python backend stubs left running"
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1]
    assert _shm(prefix) == [], "shared-memory regions left behind"


@pytest.fixture(scope="module")
def server(repo) -> Iterator[Server]:
    srv = Server.start(repo, http_port=0, grpc_port=0, metrics_port=0)
    try:
        assert _shm(srv.info.shm_prefix), "the Python backend should have created its shm regions"
        assert _processes(srv.info.shm_prefix, wait=0), "the Python backend stubs should be running"
        yield srv
    finally:
        srv.stop()
    assert not srv.alive(), "tritonserver still running after stop()"
    _assert_gone(srv.info.pid, srv.info.shm_prefix)


@pytest.fixture(scope="module")
def local(translator_export, summarizer_export) -> dict[str, export.ExportedModel]:
    return {"transformer-smoke": export.load(translator_export, threads=1),
            "transformer-summ": export.load(summarizer_export, threads=1)}


def _sources(export_dir: Path, n: int = 12) -> list[str]:
    return json.loads((export_dir / "heldout.json").read_text())["src"][:n]


# ---------------------------------------------------------------------------------------------- repository
def test_repository_is_self_contained_and_configs_parse(repo, translator_export) -> None:
    assert sorted(p.name for p in repo.iterdir()) == ["transformer-smoke", "transformer-summ"]  # §3b names
    model = repo / "transformer-smoke"
    config = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.backend == "python" and config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 16]
    assert config.dynamic_batching.max_queue_delay_microseconds == 3000
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.version_policy.latest.num_versions == 1
    assert [(i.name, i.data_type) for i in config.input] == [("TEXT", model_config_pb2.TYPE_STRING)]
    assert {o.name for o in config.output} == {"OUTPUT", "TRUNCATED"}
    files = {p.name for p in (model / "1").iterdir()}
    assert files >= {"model.py", "model_common.py", "export_runtime.py", "encoder.onnx", "decoder.onnx",
                     "tokenizer.model", "manifest.json"}
    # the runtime is copied unchanged, and nothing in the model dir imports the project or torch
    assert (model / "1" / "export_runtime.py").read_bytes() == (REPO / "export" / "runtime.py").read_bytes()
    for py in (model / "1").glob("*.py"):
        text = py.read_text()
        assert "import torch" not in text and "from zoo" not in text and "from export" not in text, py


def test_repository_errors(translator_export, tmp_path) -> None:
    with pytest.raises(RepositoryError, match="not an export directory"):
        write_repository([tmp_path], tmp_path / "r")
    with pytest.raises(RepositoryError, match="distinct name"):
        write_repository([translator_export, translator_export], tmp_path / "r")
    with pytest.raises(RepositoryError, match="instance_kind"):
        ModelSettings.from_mapping({"instance_kind": "KIND_TPU"})
    write_repository([translator_export], tmp_path / "r")
    with pytest.raises(RepositoryError, match="overwrite=true"):
        write_repository([translator_export], tmp_path / "r")
    settings = ModelSettings(version_policy=[1, 2], dynamic_batching=False, instance_count=2, version=2)
    write_repository([translator_export], tmp_path / "r", settings, overwrite=True)
    config = text_format.Parse((tmp_path / "r/transformer-smoke/config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert list(config.version_policy.specific.versions) == [1, 2] and not config.HasField("dynamic_batching")
    assert config.instance_group[0].count == 2 and (tmp_path / "r/transformer-smoke/2/model.py").is_file()


# ---------------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_equals_in_process_runtime(server, local, translator_export, summarizer_export, protocol) -> None:
    url = server.info.url(protocol)
    for name, export_dir in (("transformer-smoke", translator_export), ("transformer-summ", summarizer_export)):
        texts = _sources(export_dir)
        with Client(url, protocol, name) as client:
            for text in texts:  # one request per sentence: an execute call holds just this request
                assert client.translate([text]) == local[name].translate([text]), (name, text)
            assert client.translate(texts[:5]) == local[name].translate(texts[:5])  # one multi-sentence request
            assert client.translate(texts[:3], beam_size=1, max_len_b=5) == \
                local[name].translate(texts[:3], beam_size=1, max_len_b=5)
        outputs = local[name].translate(texts)
        assert len(set(outputs)) > 1 and any(outputs), f"{name}: degenerate smoke model {outputs}"


def test_client_function_and_cli(server, local, translator_export) -> None:
    texts = _sources(translator_export, 3)
    expected = [local["transformer-smoke"].translate([t])[0] for t in texts]
    for protocol in PROTOCOLS:
        assert [translate(t, url=server.info.url(protocol), protocol=protocol, model="transformer-smoke")[0]
                for t in texts] == expected
    proc = _cli("serve.client", "--protocol", "grpc", "--url", server.info.grpc_url, "--model", "transformer-smoke",
                texts[0])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected[:1]
    proc = _cli("serve.client", "--url", server.info.http_url, "--model", "transformer-smoke", input=texts[1] + "\n")
    assert proc.returncode == 0 and proc.stdout.splitlines() == expected[1:2], proc.stderr
    # two models served: omitting --model is an error naming them
    proc = _cli("serve.client", "--url", server.info.http_url, "Hallo")
    assert proc.returncode == 2 and "transformer-smoke" in proc.stderr and "--model" in proc.stderr


# ---------------------------------------------------------------------------------------------- robustness
def _raw(server: Server, protocol: str, array: np.ndarray, dtype: str = "BYTES", shape: list[int] | None = None,
         parameters: dict | None = None, model: str = "transformer-smoke"):
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(server.info.url(protocol))
    inp = lib.InferInput("TEXT", shape or list(array.shape), dtype)
    inp.set_data_from_numpy(array)
    try:
        return client.infer(model, [inp], parameters=parameters)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_robustness(server, local, translator_export, protocol) -> None:
    url = server.info.url(protocol)
    model = local["transformer-smoke"]
    with Client(url, protocol, "transformer-smoke") as client:
        # defined results: empty / whitespace-only → "" (the model is not run on nothing)
        assert client.infer(["", "   \t "], None) == (["", ""], [False, False])
        # 10 000 characters: truncated to the model's limit, flagged, same output as the runtime
        long = " ".join(_sources(translator_export, 12)) * 40
        long = long[:10_000]
        out, truncated = client.infer([long, "Hallo."], None)
        assert truncated == [True, False] and out == model.translate([long, "Hallo."])
        # invalid UTF-8 → an error for this request only
        with pytest.raises(ClientError, match="not valid UTF-8"):
            client.infer([b"Guten \xff\xfe Morgen"], None)
        # unknown and invalid parameters → errors naming the allowed ones
        with pytest.raises(ClientError, match=r"unknown request parameter.*beam_size"):
            client.infer(["Hallo."], {"beam": 2})
        with pytest.raises(ClientError, match=r"beam_size.*≥ 1"):
            client.infer(["Hallo."], {"beam_size": 0})
        with pytest.raises(ClientError, match=r"max_len_b.*int"):
            client.infer(["Hallo."], {"max_len_b": "ten"})
        # batch above max_batch_size (16): refused by Triton; the client function splits instead
        with pytest.raises(InferenceServerException, match="batch"):
            _raw(server, protocol, np.array([b"Hallo."] * 17, dtype=np.object_).reshape(17, 1))
        assert client.translate(["Hallo."] * 17) == model.translate(["Hallo."] * 17)
    # wrong dtype and wrong shape: refused by Triton before the model runs
    with pytest.raises(InferenceServerException):
        _raw(server, protocol, np.array([[1], [2]], dtype=np.int32), dtype="INT32")
    with pytest.raises(InferenceServerException):
        _raw(server, protocol, np.array([b"a", b"b", b"c"], dtype=np.object_).reshape(1, 3))
    with pytest.raises(InferenceServerException):
        _raw(server, protocol, np.array([b"a"], dtype=np.object_).reshape(1, 1), model="no-such-model")
    assert server.ready()
    assert translate("Hallo.", url=url, protocol=protocol, model="transformer-smoke") == model.translate(["Hallo."])


def test_bad_requests_in_a_dynamic_batch_fail_alone(server, local, translator_export) -> None:
    """Good and bad requests at once (so the dynamic batcher mixes them): each bad one gets its own error, every
    good one its answer."""
    texts = _sources(translator_export, 8)
    bad = [[b"\xff"], ["x"], ["y"]]
    bad_params = [None, {"nope": 1}, {"beam_size": -1}]
    results: dict[int, object] = {}

    def call(i: int) -> None:
        with Client(server.info.http_url, "http", "transformer-smoke") as c:
            try:
                results[i] = c.infer(*((bad[i - 100], bad_params[i - 100]) if i >= 100 else ([texts[i]], None)))[0]
            except ClientError as exc:
                results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in [*range(len(texts)), 100, 101, 102]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(results[i], ClientError) for i in (100, 101, 102))
    for i in range(len(texts)):
        assert isinstance(results[i], list) and len(results[i]) == 1 and isinstance(results[i][0], str), results[i]
    assert server.ready()


def test_bounded_concurrent_load(server, local, translator_export) -> None:
    """2 000 single-sentence requests, 32 in flight (16 HTTP + 16 gRPC clients): every one answered."""
    texts = _sources(translator_export, 32)
    total, threads_per_protocol = 2000, 16
    answers: list[tuple[str, str]] = []
    failures: list[str] = []
    lock = threading.Lock()
    counter = iter(range(total))
    before = Client(server.info.http_url, "http", "transformer-smoke").statistics()

    def worker(protocol: str) -> None:
        with Client(server.info.url(protocol), protocol, "transformer-smoke", timeout=300) as c:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                text = texts[i % len(texts)]
                try:
                    out = c.translate([text], beam_size=1)
                    with lock:
                        answers.append((text, out[0]))
                except ClientError as exc:
                    with lock:
                        failures.append(str(exc))

    workers = [threading.Thread(target=worker, args=(p,)) for p in PROTOCOLS for _ in range(threads_per_protocol)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join(600)
    elapsed = time.perf_counter() - t0
    after = Client(server.info.http_url, "http", "transformer-smoke").statistics()
    assert failures == [] and len(answers) == total, failures[:3]
    served = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert served == total, f"Triton counted {served} inferences for {total} requests"
    assert executions < total, "dynamic batching never combined requests"
    greedy = {t: local["transformer-smoke"].translate([t], beam_size=1)[0] for t in texts}
    differing = sum(out != greedy[t] for t, out in answers)
    print(f"\n2000 requests in {elapsed:.1f} s, effective batch {served / executions:.2f}, "
          f"{differing} outputs differ from the per-sentence runtime (batch composition)")
    assert server.ready()


# ---------------------------------------------------------------------------------------------- NGC / BLS
def test_ngc_variant_configs_and_bls_against_standins(translator_export, local, tmp_path) -> None:
    repo = tmp_path / "ngc"
    names = write_repository([translator_export], repo, ModelSettings(max_batch_size=8, threads=1), variant="ngc")
    assert names == ["transformer-smoke"]
    assert sorted(p.name for p in repo.iterdir()) == ["transformer-smoke", "transformer-smoke-decoder",
                                                      "transformer-smoke-encoder"]
    onnx_inputs = {"encoder": {i.name for i in local["transformer-smoke"].encoder.get_inputs()},
                   "decoder": {i.name for i in local["transformer-smoke"].decoder.get_inputs()}}
    for part in ("encoder", "decoder"):
        config = text_format.Parse((repo / f"transformer-smoke-{part}/config.pbtxt").read_text(),
                                   model_config_pb2.ModelConfig())
        assert config.backend == "onnxruntime" and config.max_batch_size == 0
        assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        assert {i.name for i in config.input} == onnx_inputs[part]
        assert (repo / f"transformer-smoke-{part}/1/model.onnx").is_file()
    bls = text_format.Parse((repo / "transformer-smoke/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert bls.backend == "python" and bls.parameters["decoder_model"].string_value == "transformer-smoke-decoder"
    # no onnxruntime backend here: same-named Python stand-ins run the same model.onnx
    assert python_standins(repo) == ["transformer-smoke-decoder", "transformer-smoke-encoder"]
    texts = _sources(translator_export, 4)
    with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as srv, \
            Client(srv.info.grpc_url, "grpc", "transformer-smoke") as client:
        for text in texts:
            assert client.translate([text]) == local["transformer-smoke"].translate([text])
        assert client.translate(texts, beam_size=1) == local["transformer-smoke"].translate(texts, beam_size=1)
        assert client.infer(["", "Hallo."], {"beam_size": 2})[0][0] == ""


# ---------------------------------------------------------------------------------------------- CLIs, errors
def _start_cli(repo: Path, ports: list[int]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "serve.start", f"repo={repo}", f"http_port={ports[0]}",
                             f"grpc_port={ports[1]}", f"metrics_port={ports[2]}"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until ready (or the process fails)
    if "ready" not in line:
        proc.kill()
        pytest.fail(f"serve.start failed: {line}{proc.stderr.read() if proc.stderr else ''}")
    return proc, line


def test_start_stop_cli(translator_export, local, tmp_path) -> None:
    repo = tmp_path / "one"
    write_repository([translator_export], repo, ModelSettings(threads=1))
    ports = [free_port(), free_port(), free_port()]
    proc, _ = _start_cli(repo, ports)
    info = json.loads((tmp_path / "one.serve" / "server.json").read_text())
    try:
        assert int((tmp_path / "one.serve" / "server.pid").read_text()) == info["pid"]
        # one model: the client finds it without --model
        out = _cli("serve.client", "--url", f"127.0.0.1:{ports[0]}", "Guten Morgen.")
        assert out.returncode == 0 and out.stdout.splitlines() == local["transformer-smoke"].translate(
            ["Guten Morgen."]), out.stderr
        busy = _cli("serve.start", f"repo={tmp_path / 'other'}", f"http_port={ports[0]}")
        assert busy.returncode == 2 and "does not exist" in busy.stderr
        write_repository([translator_export], tmp_path / "other")
        busy = _cli("serve.start", f"repo={tmp_path / 'other'}", f"http_port={ports[0]}")
        assert busy.returncode == 2 and f"port {ports[0]}" in busy.stderr and "busy" in busy.stderr
        stop = _cli("serve.stop", f"repo={repo}")
        assert stop.returncode == 0 and f"pid {info['pid']}" in stop.stdout, stop.stderr
        assert proc.wait(30) == 0  # the foreground launcher notices and exits
    finally:
        if proc.poll() is None:
            proc.kill()
        if (tmp_path / "one.serve" / "server.json").exists():
            _cli("serve.stop", f"repo={repo}")
    _assert_gone(info["pid"], info["shm_prefix"])
    # foreground server stopped by SIGTERM (as a service manager would)
    proc, _ = _start_cli(repo, ports)
    info = json.loads((tmp_path / "one.serve" / "server.json").read_text())
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if (tmp_path / "one.serve" / "server.json").exists():
            _cli("serve.stop", f"repo={repo}")
    _assert_gone(info["pid"], info["shm_prefix"])
    assert not (tmp_path / "one.serve" / "server.json").exists()


def test_model_load_failure_shows_tritons_reason(translator_export, tmp_path) -> None:
    repo = tmp_path / "broken"
    write_repository([translator_export], repo, ModelSettings(threads=1))
    onnx_file = repo / "transformer-smoke/1/decoder.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[:-10] + b"corrupted!")
    with pytest.raises(ServerError, match="sha256"):
        Server.start(repo, http_port=0, grpc_port=0, metrics_port=0)
    # the failed server's regions are gone: every region of ours still there belongs to a live server
    mapped = _mapped_shm()
    assert [p.name for p in SHM_DIR.glob(f"{OUR_SHM}*") if p.name not in mapped] == []
    (repo / "transformer-smoke/config.pbtxt").write_text("name: 'x' max_batch_size: banana\n")
    with pytest.raises(ServerError, match=r"config\.pbtxt is invalid"):
        Server.start(repo, http_port=0, grpc_port=0, metrics_port=0)


def test_bench_smoke(translator_export, tmp_path) -> None:
    out = tmp_path / "bench"
    proc = _cli("serve.bench", f"exports=[{translator_export}]", f"out={out}", "concurrency=[1,4]",
                "client_batch=[2]", "repeats=2", "duration_s=1", "baseline_duration_s=0.5",
                "no_batching_concurrency=[4]", "server.threads=1", "max_requests=200", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    points = result["points"]
    assert len(points) == 2 * (2 + 1)  # protocols × (2 concurrencies + 1 without batching), median of 2 rounds
    for p in points:
        assert len(p["rounds_sentences_per_s"]) == len(p["rounds_ratio"]) == 2
        assert p["errors"] == 0 and p["sentences_per_s"] > 0 and p["effective_batch"] >= 1
        assert p["inprocess_sentences_per_s"] > 0 and p["ratio"] > 0
        assert set(p["latency_ms"]) >= {"p50", "p95", "p99"}
    assert any(not p["dynamic_batching"] for p in points)
    assert "| model | protocol |" in (out / "results.md").read_text()
    assert (out / "results.png").stat().st_size > 10_000
