"""Serving (issue 6): smoke-trained models → export → Triton repository → a real tritonserver from the
pytriton wheel → HTTP and gRPC clients, compared with the in-process export runtime; robustness, bounded
concurrent load, the summarizer, the NGC/BLS variant against Python stand-ins, the CLIs and the benchmark.

Generation in the server batches whatever the dynamic batcher gathered, and floating-point results may depend
on the batch composition (padding, GEMM shapes), so exact-equality checks send one request at a time: then an
execute call holds exactly that request and must equal `export.load(dir).translate(request texts)`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
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
from export import runtime as export_runtime
from export.exporter import export_checkpoint
from serve.client import Client, ClientError, translate
from serve.model_config import ModelSettings, RepositoryError, parse_config, python_config, read_manifest
from serve.ngc import python_standins
from serve.repository import write_repository
from serve.server import Server, ServerError
from serve.server_settings import free_ports, port_free
from serve.shm import OUR_SHM, SHM_DIR, _mapped_shm
from serve.warmup import SAMPLE_FILE, WARMUP_DIR, plan_warmup, serialize_strings
from tests.conftest import smoke_overrides
from tests.zoo_testing import REPO, compose_train
from zoo.entries import CONF_DIR

PROTOCOLS = ("http", "grpc")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _export(run_dir: Path, out: Path, *extra: str) -> Path:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="export",
            overrides=[f"checkpoint={run_dir}", f"out={out}", "runtime.threads=1", "verify.sentences=16", *extra],
        )
    export_checkpoint(cfg)
    return out


def _cli(module: str, *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        **kwargs,
    )


@pytest.fixture(scope="module")
def translator_export(exported) -> Path:
    """The smoke transformer with a vocabulary shortlist (served requests may ask for it, shortlist=1): the run's
    shared export (tests/conftest.py), verified by tests/test_export_shortlist.py; this file only reads it."""
    return exported("transformer", "shortlist.build=true")[0]


@pytest.fixture(scope="module")
def summarizer_export(tmp_path_factory) -> Path:
    """A smoke summarizer on real `data=summ` documents (Debian long description → synopsis), written as a small
    JSONL corpus named `summ` so the model is `transformer-summ` like a `data=summ` run."""
    from zoo.data import build_splits
    from zoo.train import train

    splits = build_splits(compose_train(["+model=transformer", "data=summ"]).data)
    root = tmp_path_factory.mktemp("summ_corpus")
    for split, examples, n in (("train", splits.train, 3000), ("valid", splits.valid, 24), ("test", splits.test, 24)):
        picked = [e for e in examples if len(e.src.split()) <= 60][:n]
        (root / f"{split}.jsonl").write_text("".join(json.dumps({"src": e.src, "tgt": e.tgt}) + "\n" for e in picked))
    runs = tmp_path_factory.mktemp("summ_runs")
    replaced = ("data.max_len=", "data.name=", "trainer.max_updates=")
    overrides = [o for o in smoke_overrides("transformer", root, runs) if not o.startswith(replaced)]
    overrides += [
        "data.format=jsonl",
        "data.name=summ",
        "data.task=summarization",
        "data.max_len=128",
        "trainer.max_updates=150",
    ]
    run_dir = Path(train(compose_train(overrides))["run_dir"])
    return _export(run_dir, tmp_path_factory.mktemp("exp") / "transformer-summ")


@pytest.fixture(scope="module")
def repo(translator_export, summarizer_export, tmp_path_factory) -> Path:
    """Both models in one repository, written by the CLI (key=value overrides for the Triton settings)."""
    repo = tmp_path_factory.mktemp("triton") / "repo"
    proc = _cli(
        "serve.repository",
        f"export_dir=[{translator_export},{summarizer_export}]",
        f"repo={repo}",
        "triton.max_batch_size=16",
        "triton.preferred_batch_size=[4,8,16]",
        "triton.max_queue_delay_microseconds=3000",
        "triton.threads=1",
    )
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


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """GET /metrics → (name, labels, value) per sample of Prometheus' text format."""
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if match and not line.startswith("#"):
            samples.append((match[1], dict(re.findall(r'(\w+)="([^"]*)"', match[2] or "")), float(match[3])))
    return samples


def metric(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


METRICS_AT_START: list[tuple[str, dict[str, str], float]] = []  # scraped before any test request


@pytest.fixture(scope="module")
def server(repo) -> Iterator[Server]:
    srv = Server.start(repo, http_port=0, grpc_port=0, metrics_port=0)
    try:
        for triton in srv.info.tritons:  # each replica's Python backend: its regions and its stubs
            assert _shm(triton.shm_prefix), "the Python backend should have created its shm regions"
            assert _processes(triton.shm_prefix, wait=0), "the Python backend stubs should be running"
        METRICS_AT_START[:] = scrape(srv.info.metrics_url)
        yield srv
    finally:
        srv.stop()
    assert not srv.alive(), "tritonserver still running after stop()"
    for triton in srv.info.tritons:
        _assert_gone(triton.pid, triton.shm_prefix)


@pytest.fixture(scope="module")
def local(translator_export, summarizer_export) -> dict[str, export.ExportedModel]:
    return {
        "transformer-smoke": export.load(translator_export, threads=1),
        "transformer-summ": export.load(summarizer_export, threads=1),
    }


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
    assert [(i.name, i.data_type, i.optional) for i in config.input] == [
        ("TEXT", model_config_pb2.TYPE_STRING, False),
        ("TARGET", model_config_pb2.TYPE_STRING, True),
        ("PREFIX", model_config_pb2.TYPE_STRING, True),
    ]
    assert {o.name for o in config.output} == {"OUTPUT", "TRUNCATED", "SCORES", "TOKEN_SCORES", "ALIGNMENT"}
    files = {p.name for p in (model / "1").iterdir()}
    assert files >= {
        "model.py",
        "model_common.py",
        "model_metrics.py",
        "model_requests.py",
        "model_outputs.py",
        "packages",
        "encoder.onnx",
        "encoder.onnx.data",
        "decoder.onnx",
        "decoder.onnx.data",
        "tokenizer.model",
        "manifest.json",
    }
    # the package `export` (its __init__ and the runtime, whole) is copied unchanged under its own import path, and
    # nothing in the model dir imports torch or any other part of the project
    copy = model / "1" / "packages"
    assert sorted(p.name for p in copy.iterdir()) == ["export"]
    assert sorted(p.name for p in (copy / "export").iterdir()) == ["__init__.py", "runtime"]
    package = sorted(p.name for p in (REPO / "export" / "runtime").glob("*.py"))
    assert sorted(p.name for p in (copy / "export" / "runtime").iterdir()) == package
    for name in ["__init__.py", *(f"runtime/{n}" for n in package)]:
        assert (copy / "export" / name).read_bytes() == (REPO / "export" / name).read_bytes(), name
    for py in (model / "1").rglob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported |= {f"{node.module}.{a.name}" for a in node.names}
        assert not {m for m in imported if m.split(".")[0] in ("torch", "zoo", "serve")}, py
        assert all(m.startswith("export.runtime") for m in imported if m.split(".")[0] == "export"), py


def test_models_are_warm_before_they_are_ready(server, repo, translator_export) -> None:
    """model_warmup: every instance of every replica translated the held-out sample (one row, then a batch) before
    the server reported the model ready — Triton's and our own counters, merged over the replicas by the gate, show
    exactly those rows, before any request."""
    model = repo / "transformer-smoke"
    config = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    plan = plan_warmup(translator_export, read_manifest(translator_export), 16, 10_000)
    assert plan is not None and plan.batch_sizes == (1, 8)
    assert [(w.batch_size, w.inputs["TEXT"].input_data_file) for w in config.model_warmup] == [
        (1, SAMPLE_FILE),
        (8, SAMPLE_FILE),
    ]
    assert (model / WARMUP_DIR / SAMPLE_FILE).read_bytes() == serialize_strings([plan.sentence])
    assert plan.sentence in json.loads((translator_export / "heldout.json").read_text())["src"]
    rows = sum(plan.batch_sizes) * config.instance_group[0].count
    for replica in range(len(server.info.tritons)):
        assert metric(METRICS_AT_START, "zoo_sentences_total", model="transformer-smoke", replica=str(replica)) == rows
    rows *= len(server.info.tritons)
    assert metric(METRICS_AT_START, "nv_inference_count", model="transformer-smoke") == rows
    assert metric(METRICS_AT_START, "zoo_sentences_total", model="transformer-smoke") == rows
    assert metric(METRICS_AT_START, "zoo_source_tokens_total", model="transformer-smoke") > rows


def test_the_metrics_port_serves_only_metrics(server) -> None:
    """Prometheus' endpoint is on by default, behind the proxy like HTTP: GET /metrics only, the replicas' pages
    merged by the gate; Triton's own metrics listeners are on loopback."""
    url = server.info.metrics_url
    assert url.startswith("127.0.0.1:")
    assert server.info.metrics_port not in {t.metrics_port for t in server.info.tritons}
    assert _http("GET", url + "/metrics") == 200
    assert _http("POST", url + "/metrics", b"x") == 403
    assert _http("GET", url + "/v2/health/ready") == 403
    names = {name for name, _, _ in scrape(url)}
    assert {"nv_inference_count", "nv_inference_request_duration_us", "zoo_sentences_total"} <= names


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metrics_count_what_was_served(server, local, translator_export, protocol) -> None:
    """The zoo_* counters move by exactly what was sent and returned: rows, source tokens after truncation,
    returned hypothesis tokens (n-best: all), truncated sources, refusals by reason, one latency per request."""
    model = local["transformer-smoke"]
    texts = _sources(translator_export, 5)
    long = (" ".join(_sources(translator_export, 12)) * 40)[:10_000]
    sent = [*texts, "", long]
    before = scrape(server.info.metrics_url)
    with Client(server.info.url(protocol), protocol, "transformer-smoke") as client:
        client.translate(sent, num_hypotheses=2, return_scores=True)
        with pytest.raises(ClientError):
            client.infer(["Hallo."], {"beam_size": 0})
        client.score(texts[:2], ["Good morning.", ""])
    after = scrape(server.info.metrics_url)

    def moved(name: str, **labels: str) -> float:
        return metric(after, name, model="transformer-smoke", **labels) - metric(
            before, name, model="transformer-smoke", **labels
        )

    live = [t for t in sent if t.strip()]
    nbest = model.translate(live, num_hypotheses=2, return_scores=True)
    assert moved("zoo_sentences_total") == len(sent) + 2
    assert moved("zoo_source_tokens_total") == sum(map(len, model.encode_texts(live + texts[:2])))
    assert moved("zoo_generated_tokens_total") == sum(len(t.tokens) for hyps in nbest for t in hyps)
    assert moved("zoo_truncated_sources_total") == 1
    assert moved("zoo_refused_requests_total", reason="invalid") == 1
    assert moved("zoo_refused_requests_total", reason="busy") == 0
    assert moved("zoo_request_latency_seconds_count") == 2
    # Triton counts the refused request as a success (the model answered it, with an error): ours tells them apart.
    # Triton moves its own counters when it releases a request, which may come after the client has the response
    # (ours move before the response is sent): read them again until they settle
    deadline = time.monotonic() + 10
    while moved("nv_inference_request_success") + moved("nv_inference_request_failure") < 3:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
        after = scrape(server.info.metrics_url)
    assert moved("nv_inference_request_success") + moved("nv_inference_request_failure") == 3


def test_free_ports_are_distinct_and_avoid_the_given_ones() -> None:
    """Ports picked for `port=0` are distinct (picked one at a time, bind-and-close may return one twice, and
    tritonserver refuses an HTTP and a metrics listener on the same port) and never one the caller chose."""
    taken = free_ports(1)[0]
    for _ in range(50):
        ports = free_ports(3, avoid={taken})
        assert len(set(ports)) == 3 and taken not in ports
        assert all(port_free(p) for p in ports)


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
    config = text_format.Parse(
        (tmp_path / "r/transformer-smoke/config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert list(config.version_policy.specific.versions) == [1, 2] and not config.HasField("dynamic_batching")
    assert config.instance_group[0].count == 2 and (tmp_path / "r/transformer-smoke/2/model.py").is_file()


def test_spinning_setting_round_trips_through_the_model_config() -> None:
    """serve.repository writes `spinning` as a text parameter; the served model reads back the same choice."""
    for choice in export_runtime.SPINNING:
        config = parse_config(python_config("m", ModelSettings.from_mapping({"spinning": choice})))
        assert export_runtime.spinning_from_text(config.parameters["spinning"].string_value) is choice
    built = "".join(["deco", "der"])  # a string equal to "decoder" but another object, as a config parser gives
    assert ModelSettings.from_mapping({"spinning": built}).spinning is export_runtime.SPINNING[2]
    assert ModelSettings().spinning == "auto"  # the runtime's own default: instances × threads decide (below)
    with pytest.raises(RepositoryError, match="use auto, false, true, decoder or shared"):
        ModelSettings.from_mapping({"spinning": "always"})
    with pytest.raises(export_runtime.ExportRuntimeError, match="choose one of"):
        export_runtime.spinning_from_text("yes")


def test_repository_refuses_a_traversal_key_and_writes_nothing_outside(translator_export, tmp_path) -> None:
    """A downloaded export whose manifest lists `../../x` must not write outside the repository (NGC variant
    too), and a file whose content no longer matches its checksum is refused before anything is copied."""
    copy = tmp_path / "exports" / "evil"
    copy.parent.mkdir()
    shutil.copytree(translator_export, copy)
    (copy / "payload.txt").write_text("attacker-chosen content")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["../../../escaped.txt"] = hashlib.sha256(b"attacker-chosen content").hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "repo").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(RepositoryError, match="not a plain file name"):
        write_repository([copy], tmp_path / "repo" / "r")
    with pytest.raises(RepositoryError, match="not a plain file name"):
        write_repository([copy], tmp_path / "repo" / "ngc", variant="ngc")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not list(tmp_path.parent.rglob("escaped.txt"))
    # a listed file whose bytes changed is refused before copying, naming the checksum
    manifest["files"].pop("../../../escaped.txt")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with open(copy / "tokenizer.model", "ab") as fh:
        fh.write(b"x")
    with pytest.raises(RepositoryError, match="sha256"):
        write_repository([copy], tmp_path / "repo" / "r")
    assert not (tmp_path / "repo" / "r").exists()


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
            assert client.translate(texts[:3], beam_size=1, max_len_b=5) == local[name].translate(
                texts[:3], beam_size=1, max_len_b=5
            )
            if name == "transformer-smoke":  # the export with a vocabulary shortlist
                assert client.translate(texts[:5], shortlist=1) == local[name].translate(texts[:5], shortlist=1)
            else:  # one without: refused per request, naming the fix
                with pytest.raises(ClientError, match=r"without a vocabulary shortlist.*shortlist\.build=true"):
                    client.translate(texts[:1], shortlist=1)
        outputs = local[name].translate(texts)
        assert len(set(outputs)) > 1 and any(outputs), f"{name}: degenerate smoke model {outputs}"


def test_client_function_and_cli(server, local, translator_export) -> None:
    texts = _sources(translator_export, 3)
    expected = [local["transformer-smoke"].translate([t])[0] for t in texts]
    for protocol in PROTOCOLS:
        assert [
            translate(t, url=server.info.url(protocol), protocol=protocol, model="transformer-smoke")[0] for t in texts
        ] == expected
    proc = _cli(
        "serve.client", "--protocol", "grpc", "--url", server.info.grpc_url, "--model", "transformer-smoke", texts[0]
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected[:1]
    proc = _cli("serve.client", "--url", server.info.http_url, "--model", "transformer-smoke", input=texts[1] + "\n")
    assert proc.returncode == 0 and proc.stdout.splitlines() == expected[1:2], proc.stderr
    # omitting --model lists the models, an admin API: without the key an error naming both ways out
    proc = _cli("serve.client", "--url", server.info.http_url, "Hallo")
    assert proc.returncode == 2 and "--model" in proc.stderr and "admin_key" in proc.stderr, proc.stderr
    # with the key, two models served: an error naming them
    proc = _cli("serve.client", "--url", server.info.http_url, "--admin-key-file", server.info.admin_key_file, "Hallo")
    assert proc.returncode == 2 and "transformer-smoke" in proc.stderr and "--model" in proc.stderr


# ---------------------------------------------------------------------------------------------- robustness
def _raw(
    server: Server,
    protocol: str,
    array: np.ndarray,
    dtype: str = "BYTES",
    shape: list[int] | None = None,
    parameters: dict | None = None,
    model: str = "transformer-smoke",
    target: np.ndarray | None = None,
):
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(server.info.url(protocol))
    inp = lib.InferInput("TEXT", shape or list(array.shape), dtype)
    inp.set_data_from_numpy(array)
    inputs = [inp]
    if target is not None:
        inputs.append(lib.InferInput("TARGET", list(target.shape), "BYTES"))
        inputs[-1].set_data_from_numpy(target)
    try:
        return client.infer(model, inputs, parameters=parameters)
    finally:
        client.close()


def _rows(texts: list[str | bytes]) -> np.ndarray:
    return np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=np.object_).reshape(-1, 1)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_nbest_with_scores_equals_the_runtime(server, local, translator_export, protocol) -> None:
    """num_hypotheses/return_scores: OUTPUT and SCORES [batch, n], the runtime's n-best (texts identical, scores
    to 1e-4); an empty source gives "" and NaN; the default response is unchanged ([batch, 1], no SCORES)."""
    model = local["transformer-smoke"]
    texts = _sources(translator_export, 4)
    with Client(server.info.url(protocol), protocol, "transformer-smoke") as client:
        served = client.translate([*texts, ""], num_hypotheses=3, return_scores=True)
        plain = client.infer(texts, None)[0]
    expected = model.translate(texts, num_hypotheses=3, return_scores=True)
    for got, want in zip(served, expected, strict=False):
        assert [h.text for h in got] == [t.text for t in want]
        assert np.allclose([h.score for h in got], [t.score for t in want], atol=1e-4)
        assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
    assert [h.text for h in served[-1]] == ["", "", ""] and all(np.isnan(h.score) for h in served[-1])
    assert plain == [hyps[0].text for hyps in expected] == model.translate(texts)
    default = _raw(server, protocol, _rows(texts))
    assert default.as_numpy("OUTPUT").shape == (4, 1) and default.as_numpy("SCORES") is None
    nbest_only = _raw(server, protocol, _rows(texts), parameters={"num_hypotheses": 2})
    assert nbest_only.as_numpy("OUTPUT").shape == (4, 2) and nbest_only.as_numpy("SCORES") is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_forced_decoding_equals_the_runtime(server, local, translator_export, protocol) -> None:
    """A request with TARGET is scored: per row the target tokens' and eos's log-probs (TOKEN_SCORES, NaN-padded)
    and the sentence score (SCORES), equal to `export.load(dir).score` to 1e-4 — and to the search's own score
    for the hypothesis it returned (scored by its token ids in the runtime, as its text may re-tokenise)."""
    model = local["transformer-smoke"]
    sources = _sources(translator_export, 4)
    targets = [*model.translate(sources[:3]), ""]  # hypotheses, and an empty target (eos alone)
    with Client(server.info.url(protocol), protocol, "transformer-smoke") as client:
        served = client.score(sources, targets)
        penalised = client.score(sources[:1], targets[:1], len_penalty=0.0)
    expected = model.score(sources, targets)
    for got, want in zip(served, expected, strict=True):
        assert np.allclose(got.token_logprobs, want.token_logprobs, atol=1e-4)
        assert abs(got.score - want.score) < 1e-4
    assert len(served[-1].token_logprobs) == 1  # eos alone
    assert abs(penalised[0].score - sum(expected[0].token_logprobs)) < 1e-3  # len_penalty 0: the plain sum
    raw = _raw(server, protocol, _rows(sources), target=_rows(targets))
    assert raw.as_numpy("SCORES").shape == (4, 1) and np.isnan(raw.as_numpy("TOKEN_SCORES")[-1, 1:]).all()


BAD_OUTPUT_REQUESTS = [  # (parameters, target rows, what the message must say)
    ({"num_hypotheses": 6}, None, r"num_hypotheses=6 is out of range; allowed: an integer in \[1, 5\]"),
    ({"num_hypotheses": 0}, None, r"num_hypotheses=0 is out of range; allowed: an integer in \[1, 5\]"),
    ({"num_hypotheses": 2.5}, None, r"num_hypotheses=2.5 is not an integer; allowed: an integer in \[1, 5\]"),
    ({"num_hypotheses": 2, "beam_size": 1}, None, r"allowed: an integer in \[1, 1\] \(at most beam_size=1\)"),
    ({"return_scores": "maybe"}, None, r"return_scores='maybe' is not a boolean; allowed: true or false"),
    (None, ["a", "b"], r"input 'TEXT' batch size does not match other inputs"),  # Triton's own check, first
    (None, [b"Good \xff morning"], r"TARGET row 0 is not valid UTF-8"),
    ({"beam_size": 2}, ["Good morning."], r"\['beam_size'\] do not apply to scoring .*allowed: \['len_penalty'\]"),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_nbest_and_target_values_are_refused_per_request(server, local, protocol) -> None:
    """Each bad value is INVALID_ARGUMENT naming the allowed values, sent together with good requests (so the
    dynamic batcher may gather them in one execute): every good request is still answered."""
    text = _rows(["Guten Morgen."])
    errors: dict[int, InferenceServerException] = {}
    good: dict[int, list[str]] = {}

    def bad_call(i: int) -> None:
        parameters, target, _ = BAD_OUTPUT_REQUESTS[i]
        try:
            _raw(server, protocol, text, parameters=parameters, target=None if target is None else _rows(target))
        except InferenceServerException as exc:
            errors[i] = exc

    def good_call(i: int) -> None:
        with Client(server.info.url(protocol), protocol, "transformer-smoke") as client:
            good[i] = client.translate(["Hallo."])

    threads = [threading.Thread(target=bad_call, args=(i,)) for i in range(len(BAD_OUTPUT_REQUESTS))]
    threads += [threading.Thread(target=good_call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, (_, _, message) in enumerate(BAD_OUTPUT_REQUESTS):
        assert i in errors, f"request {i} was not refused"
        assert _status(errors[i]) in ("400", "StatusCode.INVALID_ARGUMENT"), errors[i]
        assert re.search(message, errors[i].message()), errors[i].message()
    assert good == {i: local["transformer-smoke"].translate(["Hallo."]) for i in range(4)}


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
        with pytest.raises(ClientError, match=r"beam_size=0 is out of range; allowed: an integer in \[1, 64\]"):
            client.infer(["Hallo."], {"beam_size": 0})
        with pytest.raises(ClientError, match=r"max_len_b='ten' is not a number"):
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


def _status(exc: InferenceServerException) -> str:
    return str(exc.status())


BAD_SETTINGS = [
    ("max_len_a", float("inf")),
    ("max_len_a", float("nan")),
    ("max_len_a", 1e30),
    ("max_len_b", 2**63 - 1),
    ("len_penalty", float("nan")),
    ("len_penalty", 1e308),
    ("beam_size", 65),
    ("beam_size", 2.5),
    ("min_len", -1),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_search_settings_are_invalid_argument_naming_the_range(server, protocol) -> None:
    """Non-finite and out-of-range settings once returned "" or a one-token output, or failed as INTERNAL:
    now each is a client error (HTTP 400 / gRPC INVALID_ARGUMENT) naming the allowed range."""
    text = np.array([b"Guten Morgen."], dtype=np.object_).reshape(1, 1)
    for name, value in BAD_SETTINGS:
        with pytest.raises(InferenceServerException) as err:
            _raw(server, protocol, text, parameters={name: value})
        assert _status(err.value) in ("400", "StatusCode.INVALID_ARGUMENT"), (name, value, err.value)
        message = err.value.message()
        assert name in message and ("allowed" in message or "JSON" in message), (name, value, message)
    assert server.ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_over_the_cost_budget_is_refused_naming_it(server, protocol) -> None:
    rows = np.array([b"Guten Morgen."] * 16, dtype=np.object_).reshape(16, 1)
    with pytest.raises(InferenceServerException) as err:  # 16 rows x beam 64 x 250 tokens >> 10 000
        _raw(server, protocol, rows, parameters={"beam_size": 64, "max_len_b": 4000})
    assert _status(err.value) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "max_request_cost=10000" in err.value.message() and "beam_size" in err.value.message()


def test_runtime_refuses_the_same_settings(local) -> None:
    model = local["transformer-smoke"]
    for name, value in BAD_SETTINGS:
        with pytest.raises(export.SearchError, match=rf"{name}=.*allowed"):
            model.translate(["Guten Morgen."], **{name: value})


def test_a_heavy_allowed_request_does_not_delay_a_small_one(translator_export, local, tmp_path) -> None:
    """Two model instances: a request at the cost budget (forced to its full length) keeps one busy for
    seconds, a one-sentence greedy request sent meanwhile is answered by the other within 1 s. The smoke model is
    tiny (10 000 row-steps take ~0.5 s), so this server's budget is raised to make the heavy request heavy."""
    budget = 16 * 49 * 255  # rows × beam × the smoke model's longest output (max_positions 256)
    repo = tmp_path / "repo"
    write_repository(
        [translator_export],
        repo,
        ModelSettings(threads=1, instance_count=2, max_batch_size=16, max_request_cost=budget, max_execute_cost=budget),
    )
    sources = (_sources(translator_export, 16) * 2)[:16]
    heavy_rows = np.array([s.encode() for s in sources], dtype=np.object_).reshape(-1, 1)
    model = local["transformer-smoke"]
    assert model.request_cost([5] * 16, model.search_settings(beam_size=49, max_len_a=0.0, max_len_b=255)) == budget
    heavy: dict[str, float] = {}
    with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as server:

        def run_heavy() -> None:
            start = time.perf_counter()
            _raw(
                server,
                "grpc",
                heavy_rows,
                parameters={"beam_size": 49, "max_len_a": 0.0, "max_len_b": 255, "min_len": 255},
            )
            heavy["s"] = time.perf_counter() - start

        thread = threading.Thread(target=run_heavy)
        thread.start()
        time.sleep(0.5)
        with Client(server.info.grpc_url, "grpc", "transformer-smoke") as client:
            start = time.perf_counter()
            out, _ = client.infer(["Hallo."], {"beam_size": 1})
            small = time.perf_counter() - start
        thread.join(600)
    assert out == model.translate(["Hallo."], beam_size=1)
    assert heavy["s"] > 2.0 and heavy["s"] > 3 * small, heavy  # the heavy one really was heavy
    assert small < 1.0, (small, heavy)


def _http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(f"http://{url}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_admin_apis_need_the_key_and_the_shm_hijack_is_refused(server, local) -> None:
    """Shared memory, repository, logging, trace and statistics answer 403 (HTTP) / PERMISSION_DENIED (gRPC)
    without the admin key: registering the Python backend's own /dev/shm region — the published 2.51 crash —
    never reaches Triton's shared-memory code, and the server keeps serving."""
    url = server.info.http_url
    region = _shm(server.info.tritons[0].shm_prefix)[0]
    register = json.dumps({"key": f"/{region}", "offset": 0, "byte_size": 64}).encode()
    attempts = [
        ("POST", "/v2/systemsharedmemory/region/hijack/register", register),
        ("POST", "/v2/repository/index", b"{}"),
        ("POST", "/v2/repository/models/transformer-smoke/unload", b"{}"),
        ("POST", "/v2/logging", b'{"log_verbose_level": 5}'),
        ("GET", "/v2/trace/setting", None),
        ("GET", "/v2/models/transformer-smoke/stats", None),
    ]
    admin = server.admin_headers()
    internal = server.info.triton_http_url  # Triton's own listener, on loopback behind the proxy
    assert internal != url
    for method, path, body in attempts:
        assert _http(method, url + path, body) == 403, path  # refused by the proxy or by Triton behind it
        assert _http(method, internal + path, body) == 403, path  # Triton's own restriction
        if path != "/v2/repository/index":  # the one admin path the proxy passes (clients list models with it)
            assert _http(method, url + path, body, headers=admin) == 403, path  # the proxy: not even with the key
    assert _http("POST", url + "/v2/repository/index", b"{}", headers=admin) == 200
    assert oct(Path(server.info.admin_key_file).stat().st_mode & 0o777) == "0o600"
    assert _http("GET", internal + "/v2/logging", headers=admin) == 200
    assert _http("GET", internal + "/v2/models/transformer-smoke/stats", headers=admin) == 200
    client = grpcclient.InferenceServerClient(server.info.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.get_log_settings()
        assert "UNAVAILABLE" in _status(err.value) and "restricted" in err.value.message(), err.value
        with pytest.raises(InferenceServerException) as err:  # not a method the gate serves: Triton never sees it
            client.register_system_shared_memory("hijack", f"/{region}", 64, headers=server.admin_headers("grpc"))
        assert "UNIMPLEMENTED" in _status(err.value), err.value
        assert client.get_log_settings(headers=server.admin_headers("grpc")) is not None
    finally:
        client.close()
    assert server.ready() and _shm(server.info.tritons[0].shm_prefix)
    model = local["transformer-smoke"]
    assert translate("Hallo.", url=server.info.grpc_url, protocol="grpc", model="transformer-smoke") == model.translate(
        ["Hallo."]
    )


def _raw_http(host: str, port: int, head: bytes, body_parts: list[bytes]) -> bytes:
    with socket.create_connection((host, port), timeout=120) as sock:
        try:
            sock.sendall(head)
            for part in body_parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the proxy answered (413) and closed before the whole body was sent
        return sock.recv(4096)


def test_the_chunked_body_attack_does_not_reach_triton(server, local) -> None:
    """CVE-2025-23310/23311: a body of ~600k one-byte `Transfer-Encoding: chunked` chunks made tritonserver 2.51
    die with SIGSEGV within a second. nginx in front reads and caps the body and forwards it with a length:
    Triton answers that the JSON is invalid and keeps serving; a body over the cap gets 413 from nginx."""
    host, port = server.info.host, server.info.http_port
    head = (
        b"POST /v2/models/transformer-smoke/infer HTTP/1.1\r\nHost: zoo\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    reply = _raw_http(host, port, head, [b"1\r\na\r\n" * 100_000] * 6 + [b"0\r\n\r\n"])
    assert b"failed to parse the request JSON" in reply, reply[:300]  # Triton's own answer to the de-chunked body
    big = b"%x\r\n%s\r\n" % (1 << 20, b"a" * (1 << 20))
    reply = _raw_http(host, port, head, [big] * 5 + [b"0\r\n\r\n"])
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert server.alive() and server.ready()
    assert translate("Hallo.", url=server.info.http_url, model="transformer-smoke") == local[
        "transformer-smoke"
    ].translate(["Hallo."])


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


def _replicas_statistics(server: Server) -> dict[str, int]:
    """Triton's inference and execution counts of the model, summed over the replicas (each from its own
    listener: statistics are an admin API, per process)."""
    counts = {"inference_count": 0, "execution_count": 0}
    for triton in server.info.tritons:
        url = f"127.0.0.1:{triton.http_port}"
        with Client(url, "http", "transformer-smoke", headers=server.admin_headers()) as client:
            stats = client.statistics()
        for key in counts:
            counts[key] += int(stats[key])
    return counts


def test_bounded_concurrent_load(server, local, translator_export) -> None:
    """2 000 single-sentence requests, 32 in flight (16 HTTP + 16 gRPC clients): every one answered."""
    texts = _sources(translator_export, 32)
    total, threads_per_protocol = 2000, 16
    answers: list[tuple[str, str]] = []
    failures: list[str] = []
    lock = threading.Lock()
    counter = iter(range(total))
    before = _replicas_statistics(server)

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
    after = _replicas_statistics(server)
    assert failures == [] and len(answers) == total, failures[:3]
    served = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert served == total, f"Triton counted {served} inferences for {total} requests"
    assert executions < total, "dynamic batching never combined requests"
    greedy = {t: local["transformer-smoke"].translate([t], beam_size=1)[0] for t in texts}
    differing = sum(out != greedy[t] for t, out in answers)
    print(
        f"\n2000 requests in {elapsed:.1f} s, effective batch {served / executions:.2f}, "
        f"{differing} outputs differ from the per-sentence runtime (batch composition)"
    )
    assert server.ready()


# ---------------------------------------------------------------------------------------------- NGC / BLS
def test_ngc_variant_configs_and_bls_against_standins(translator_export, local, tmp_path) -> None:
    repo = tmp_path / "ngc"
    names = write_repository([translator_export], repo, ModelSettings(max_batch_size=8, threads=1), variant="ngc")
    assert names == ["transformer-smoke"]
    assert sorted(p.name for p in repo.iterdir()) == [
        "transformer-smoke",
        "transformer-smoke-decoder",
        "transformer-smoke-encoder",
    ]
    onnx_inputs = {
        "encoder": {i.name for i in local["transformer-smoke"].backend.encoder.get_inputs()},
        "decoder": {i.name for i in local["transformer-smoke"].backend.decoder.get_inputs()},
    }
    for part in ("encoder", "decoder"):
        config = text_format.Parse(
            (repo / f"transformer-smoke-{part}/config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )
        assert config.backend == "onnxruntime" and config.max_batch_size == 0
        assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        assert {i.name for i in config.input} == onnx_inputs[part]
        # the graph beside its weights, under the name the graph refers to
        assert {f.name for f in (repo / f"transformer-smoke-{part}/1").iterdir()} == {"model.onnx", f"{part}.onnx.data"}
    bls = text_format.Parse((repo / "transformer-smoke/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert bls.backend == "python" and bls.parameters["decoder_model"].string_value == "transformer-smoke-decoder"
    # no onnxruntime backend here: same-named Python stand-ins run the same model.onnx
    assert python_standins(repo) == ["transformer-smoke-decoder", "transformer-smoke-encoder"]
    texts = _sources(translator_export, 4)
    with (
        Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as srv,
        Client(srv.info.grpc_url, "grpc", "transformer-smoke") as client,
    ):
        for text in texts:
            assert client.translate([text]) == local["transformer-smoke"].translate([text])
        assert client.translate(texts, beam_size=1) == local["transformer-smoke"].translate(texts, beam_size=1)
        assert client.translate(texts, shortlist=1) == local["transformer-smoke"].translate(texts, shortlist=1)
        assert client.infer(["", "Hallo."], {"beam_size": 2})[0][0] == ""
        options = {"beam_size": 1, "sampling": 1, "seed": 3, "repetition_penalty": 1.3}  # whole distributions
        prefixes = ["The", "", "I", "We"]
        assert client.translate(texts, prefixes, **options) == local["transformer-smoke"].translate(
            texts, target_prefix=prefixes, **options
        )


# ---------------------------------------------------------------------------------------------- CLIs, errors
def _start_cli(repo: Path, ports: list[int]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serve.start",
            f"repo={repo}",
            f"http_port={ports[0]}",
            f"grpc_port={ports[1]}",
            f"metrics_port={ports[2]}",
        ],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until ready (or the process fails)
    if "ready" not in line:
        proc.kill()
        pytest.fail(f"serve.start failed: {line}{proc.stderr.read() if proc.stderr else ''}")
    return proc, line


def test_start_stop_cli(translator_export, local, tmp_path) -> None:
    repo = tmp_path / "one"
    # spinning="shared": the served model parses it (translator_model.py), makes the one thread pool of its instance's
    # process (Triton's Python backend runs each instance in a process of its own) and translates as in-process
    write_repository([translator_export], repo, ModelSettings(threads=1, spinning="shared"))
    ports = free_ports(3)  # distinct: three free_port() calls may return one port twice
    proc, _ = _start_cli(repo, ports)
    info = json.loads((tmp_path / "one.serve" / "server.json").read_text())
    try:
        pids = [t["pid"] for t in info["tritons"]]
        assert len(pids) == 2 and [int(p) for p in (tmp_path / "one.serve" / "server.pid").read_text().split()] == pids
        # one model: the client finds it without --model (listing models is an admin API: the key file)
        assert info["admin_key_file"] == str(tmp_path / "one.serve" / "admin_key")
        out = _cli(
            "serve.client",
            "--url",
            f"127.0.0.1:{ports[0]}",
            "--admin-key-file",
            info["admin_key_file"],
            "Guten Morgen.",
        )
        assert out.returncode == 0 and out.stdout.splitlines() == local["transformer-smoke"].translate(
            ["Guten Morgen."]
        ), out.stderr
        busy = _cli("serve.start", f"repo={tmp_path / 'other'}", f"http_port={ports[0]}")
        assert busy.returncode == 2 and "does not exist" in busy.stderr
        write_repository([translator_export], tmp_path / "other")
        busy = _cli("serve.start", f"repo={tmp_path / 'other'}", f"http_port={ports[0]}")
        assert busy.returncode == 2 and f"port {ports[0]}" in busy.stderr and "busy" in busy.stderr
        stop = _cli("serve.stop", f"repo={repo}")
        assert stop.returncode == 0 and f"pid {pids[0]}, {pids[1]}" in stop.stdout, stop.stderr
        assert proc.wait(30) == 0  # the foreground launcher notices and exits
    finally:
        if proc.poll() is None:
            proc.kill()
        if (tmp_path / "one.serve" / "server.json").exists():
            _cli("serve.stop", f"repo={repo}")
    for triton in info["tritons"]:
        _assert_gone(triton["pid"], triton["shm_prefix"])
    # foreground server stopped by SIGTERM (as a service manager would)
    proc, _ = _start_cli(repo, ports)
    info = json.loads((tmp_path / "one.serve" / "server.json").read_text())
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if (tmp_path / "one.serve" / "server.json").exists():
            _cli("serve.stop", f"repo={repo}")
    for triton in info["tritons"]:
        _assert_gone(triton["pid"], triton["shm_prefix"])
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
    proc = _cli(
        "serve.bench",
        f"exports=[{translator_export}]",
        f"out={out}",
        "concurrency=[1,4]",
        "client_batch=[2]",
        "repeats=2",
        "duration_s=1",
        "baseline_duration_s=0.5",
        "no_batching_concurrency=[4]",
        "server.threads=1",
        "max_requests=200",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    points = result["points"]
    assert len(points) == 2 * (2 + 1)  # protocols × (2 concurrencies + 1 without batching), median of 2 rounds
    for p in points:
        assert len(p["rounds_sentences_per_s"]) == len(p["rounds_ratio"]) == 2
        assert p["errors"] == 0 and p["sentences_per_s"] > 0 and p["effective_batch"] >= 1
        assert p["inprocess_sentences_per_s"] > 0 and p["ratio"] > 0
        lat = p["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
    assert any(not p["dynamic_batching"] for p in points)
    assert "| model | protocol |" in (out / "results.md").read_text()
    assert (out / "results.png").stat().st_size > 10_000
