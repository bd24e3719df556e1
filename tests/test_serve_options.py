"""The served search options (issue: decoding options of MT engines): target prefixes as the optional PREFIX
input, the repetition options and sampling as request parameters, over real HTTP and gRPC against one real
tritonserver, each equal to the in-process export runtime; bad values answered 400 / INVALID_ARGUMENT in one
line naming the parameter; what batches with what. The smoke transformer shared with tests/test_serve.py (one
export per test run); one request at a time, so an execute call holds just that request (test_serve.py says why).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import export
from serve.client import OPTIONS, SEARCH_PARAMETERS, Client
from serve.model_config import ModelSettings
from serve.repository import write_repository
from serve.server import Server
from tests.zoo_testing import REPO

PROTOCOLS = ("http", "grpc")
MODEL = "transformer-smoke"
PREFIXES = ["The", "", "I", "We"]  # "" = none: rows with and without a prefix in one request
REPEAT = {"no_repeat_ngram_size": 2, "repetition_penalty": 1.3}
SAMPLE = {"beam_size": 1, "sampling": 1, "top_p": 0.9, "temperature": 1.2, "seed": 7}
ALIGNED = export.Search(beam_size=2, num_hypotheses=2, return_alignments=True)  # one value: every option


@pytest.fixture(scope="module")
def export_dir(exported) -> Path:
    return exported("transformer", "shortlist.build=true")[0]  # tests/test_serve.py's translator


@pytest.fixture(scope="module")
def server(export_dir, tmp_path_factory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("options") / "repo"
    write_repository([export_dir], repo, ModelSettings(threads=1, max_batch_size=16, warmup=False))
    with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def local(export_dir) -> export.ExportedModel:
    return export.load(export_dir, threads=1)


@pytest.fixture(scope="module")
def texts(export_dir) -> list[str]:
    return json.loads((export_dir / "heldout.json").read_text())["src"][:4]


def _texts(nbest) -> list[list[str]]:
    return [[h.text for h in hyps] for hyps in nbest]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_option_served_equals_the_runtime(server, local, texts, protocol) -> None:
    """Per option family one request equal to `export.load(dir).translate`: a prefix per row (or none), the
    repetition options, sampling with a seed (the same request twice: the same samples) and n samples per
    source with their scores."""
    with Client(server.info.url(protocol), protocol, MODEL) as client:
        assert client.translate(texts, PREFIXES) == local.translate(texts, target_prefix=PREFIXES)
        assert client.translate(["", texts[0]], ["The", "The"])[0] == ""  # an empty source is not run
        assert client.translate(texts, **REPEAT) == local.translate(texts, **REPEAT)
        sampled = client.translate(texts, **SAMPLE)
        assert sampled == client.translate(texts, **SAMPLE) == local.translate(texts, **SAMPLE)
        assert sampled == local.translate(texts, **SAMPLE)  # in process too, twice the same
        assert sampled != client.translate(texts, **{**SAMPLE, "seed": 8})
        served = client.translate(texts, PREFIXES, num_hypotheses=3, return_scores=True, **SAMPLE)
        aligned = client.translate(
            texts, PREFIXES, export.Search(beam_size=2, num_hypotheses=2, return_alignments=True)
        )
    expected = local.translate(texts, num_hypotheses=3, return_scores=True, target_prefix=PREFIXES, **SAMPLE)
    assert _texts(served) == _texts(expected)
    assert np.allclose([h.score for r in served for h in r], [t.score for r in expected for t in r], atol=1e-4)
    assert all(h.text.startswith(p) for p, hyps in zip(PREFIXES, served, strict=True) for h in hyps)
    want = local.translate(texts, ALIGNED, PREFIXES)  # one value, sent whole
    assert [[(h.text, h.alignment) for h in r] for r in aligned] == [[(t.text, t.alignment) for t in r] for r in want]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_alignments_are_served_as_the_runtime_returns_them(server, local, texts, protocol) -> None:
    """return_alignments=true adds ALIGNMENT [rows, n, T] int32: each hypothesis' source position per token, as
    `translate(return_alignments=True)` returns them in process, -1 after its last token (beam 2, 2-best, a prefix)."""
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(server.info.url(protocol))
    inputs = []
    for name, rows in (("TEXT", texts), ("PREFIX", PREFIXES)):
        inputs.append(lib.InferInput(name, [len(rows), 1], "BYTES"))
        inputs[-1].set_data_from_numpy(np.array([r.encode() for r in rows], dtype=np.object_).reshape(-1, 1))
    wanted = [lib.InferRequestedOutput(name) for name in ("OUTPUT", "ALIGNMENT")]
    parameters = {"beam_size": 2, "num_hypotheses": 2, "return_alignments": True}
    try:
        got = client.infer(MODEL, inputs, parameters=parameters, outputs=wanted).as_numpy("ALIGNMENT")
    finally:
        client.close()
    expected = local.translate(texts, beam_size=2, num_hypotheses=2, return_alignments=True, target_prefix=PREFIXES)
    assert got.dtype == np.int32 and got.shape[:2] == (len(texts), 2)
    for r, hyps in enumerate(expected):
        for j, h in enumerate(hyps):
            assert h.alignment is not None and len(h.alignment) == len(h.tokens)
            assert got[r, j, : len(h.alignment)].tolist() == h.alignment
            assert (got[r, j, len(h.alignment) :] == -1).all()


def _raw(server: Server, protocol: str, parameters: dict, inputs: dict[str, list[str]]) -> None:
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(server.info.url(protocol))
    tensors = []
    for name, rows in inputs.items():
        tensors.append(lib.InferInput(name, [len(rows), 1], "BYTES"))
        tensors[-1].set_data_from_numpy(np.array([r.encode() for r in rows], dtype=np.object_).reshape(-1, 1))
    try:
        client.infer(MODEL, tensors, parameters=parameters)
    finally:
        client.close()


LONG = {"max_len_a": 0.0, "max_len_b": 3}  # an output of at most 3 tokens, eos included
BAD_OPTIONS = [  # (parameters, inputs beside TEXT, what the one-line message must say)
    ({"no_repeat_ngram_size": -1}, {}, r"no_repeat_ngram_size=-1 is out of range; allowed: an integer in \[0, 64\]"),
    ({"top_p": 0}, {}, r"top_p=0 is out of range; allowed: a finite number in \(0\.0, 1\.0\]"),
    ({"top_p": 1.5}, {}, r"top_p=1\.5 is out of range; allowed: a finite number in \(0\.0, 1\.0\]"),
    ({"top_p": 0.5}, {}, r"top_p=0\.5 acts only when sampling; set sampling=1 too"),
    ({"sampling": 1, "beam_size": 4}, {}, r"sampling=1 with beam_size=4: .*set beam_size=1"),
    ({**SAMPLE, "num_hypotheses": 65}, {}, r"num_hypotheses=65 is out of range; allowed: an integer in \[1, 64\]"),
    (LONG, {"PREFIX": ["Good morning to you"]}, r"PREFIX: target prefix 0 has \d+ tokens but the output length"),
    ({}, {"PREFIX": ["Good"], "TARGET": ["Good morning."]}, r"PREFIX does not apply to scoring"),
    ({**SAMPLE, "num_hypotheses": 64, "max_len_b": 200}, {}, r"max_request_cost=10000.*num_hypotheses"),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_option_values_are_one_line_400s_naming_the_parameter(server, protocol) -> None:
    for parameters, inputs, message in BAD_OPTIONS:
        with pytest.raises(InferenceServerException) as err:
            _raw(server, protocol, parameters, {"TEXT": ["Guten Morgen."], **inputs})
        assert str(err.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT"), (parameters, err.value)
        assert re.search(message, err.value.message()) and "\n" not in err.value.message(), err.value.message()
    assert server.ready()


def test_the_cli_sends_options_and_prefixes(server, local, texts) -> None:
    """`python -m serve.client --prefix` reads `source<TAB>prefix` lines; the option flags are the parameters."""
    flags = ["--beam-size", "1", "--sampling", "1", "--top-p", "0.9", "--temperature", "1.2", "--seed", "7"]
    proc = subprocess.run(
        [sys.executable, "-m", "serve.client", "--url", server.info.grpc_url, "--protocol", "grpc"]
        + ["--model", MODEL, "--prefix", *flags],
        input="".join(f"{t}\t{p}\n" for t, p in zip(texts, PREFIXES, strict=True)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == local.translate(texts, target_prefix=PREFIXES, **SAMPLE)


def test_requests_batch_unless_their_options_change_the_search(local) -> None:
    """The batching key (model_requests.batch_key) leaves out what each row keeps for itself (its length
    settings; its prefix and sampling key are not settings) and holds every other search setting, so requests
    with different repetition or sampling settings are never generated in one call. The client names every
    served setting; with sampling a source's rows are its samples (the cost counts them)."""
    sys.path.insert(0, str(REPO / "serve" / "triton"))  # the served model's modules import each other by name
    try:
        from model_requests import batch_key
    finally:
        sys.path.remove(str(REPO / "serve" / "triton"))
    base = local.search_settings(beam_size=1, sampling=1, seed=7, num_hypotheses=2)
    same = [dataclasses.replace(base, min_len=3), dataclasses.replace(base, max_len_a=0.5, max_len_b=40)]
    assert {batch_key(s) for s in [base, *same]} == {batch_key(base)}
    differ = [{"seed": 8}, {"top_p": 0.9}, {"top_k": 5}, {"temperature": 0.5}, {"repetition_penalty": 1.3}]
    differ += [{"no_repeat_ngram_size": 2}, {"len_penalty": 0.5}, {"sampling": 0, "num_hypotheses": 1}]
    differ += [{"num_hypotheses": 3}, {"return_scores": True}, {"return_alignments": True}]
    keys = {batch_key(dataclasses.replace(base, **change)) for change in differ}
    assert len(keys | {batch_key(base)}) == len(differ) + 1
    assert set(SEARCH_PARAMETERS) == set(export.SEARCH_LIMITS)
    assert set(OPTIONS) == {f.name for f in dataclasses.fields(export.Search)}
    one = dataclasses.replace(base, num_hypotheses=1)
    three = dataclasses.replace(base, num_hypotheses=3)
    assert local.request_cost([5, 7], three) == 3 * local.request_cost([5, 7], one)
    four = local.search_settings(beam_size=4, num_hypotheses=3)
    assert local.request_cost([5], four) == 4 * local.request_cost([5], one)
