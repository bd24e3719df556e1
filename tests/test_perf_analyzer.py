"""perf_analyzer (issue 22): NVIDIA's real binary, installed by `serve.bench.perf_analyzer` into the cache (downloaded
once; without network the install's error fails these tests, it never skips them), run for a few seconds against
the smoke model served by a real tritonserver, and its CSV parsed; `serve.bench tool=both` puts its numbers next
to ours. No stand-in for the binary anywhere.

The CSVs under tests/data_fixtures/perf_analyzer/ were written by this binary (`-f`, with and without
--verbose-csv) against a served export on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from export.runtime import SEARCH_LIMITS
from serve.bench import perf_analyzer as pa
from serve.bench.points import load_sentences
from serve.client import Client
from serve.model_config import ModelSettings
from serve.repository import write_python_model
from serve.server import Server
from tests.zoo_testing import REPO

FIXTURES = REPO / "tests" / "data_fixtures" / "perf_analyzer"
MODEL = "transformer-smoke"
CONCURRENCY = 2
# short windows and a lenient stability rule: the machine may be shared, and these tests check the plumbing and
# the numbers' consistency, not the model's speed
QUICK = pa.Measurement(interval_ms=1000, stability_percentage=100, max_trials=10)


@pytest.fixture(scope="module")
def installation() -> pa.Installation:
    return pa.install()


@pytest.fixture(scope="module")
def smoke_export(exported) -> Path:
    """The smoke transformer's export (`MODEL`, unpruned) that tests/test_serve.py serves too: made once per run."""
    return exported("transformer", "shortlist.build=true")[0]


@pytest.fixture(scope="module")
def server(smoke_export, tmp_path_factory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("pa_repo") / "repo"
    write_python_model(smoke_export, repo, ModelSettings.from_mapping({"instance_count": 1, "threads": 1}))
    # one tritonserver, as serve.bench runs it: perf_analyzer reads one server's statistics
    with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0, replicas=1) as srv:
        yield srv


def _counts(server: Server) -> tuple[int, int]:
    """(successful, failed) requests of the model, from Triton's statistics (an admin API)."""
    with Client(server.info.triton_http_url, "http", MODEL, headers=server.admin_headers()) as client:
        stats = client.statistics()["inference_stats"]
    return int(stats["success"]["count"]), int(stats["fail"]["count"])


def test_install_is_cached_verified_and_pinned(installation) -> None:
    assert pa.install() == installation  # the second call finds the stamped install
    assert pa.check(installation) == pa.VERSION  # the binary starts with both cached libraries
    stamp = json.loads((installation.binary.parent.parent / pa.STAMP).read_text())
    assert stamp["wheels"] == {w.filename: w.sha256 for w in (pa.PERF_ANALYZER_WHEEL, pa.CUDART_WHEEL)}
    assert sorted(p.name for p in installation.lib_dir.iterdir()) == ["libb64.so.0d", "libcudart.so.12"]
    proc = subprocess.run(
        [sys.executable, "-m", "serve.bench.perf_analyzer", "install"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and str(installation.binary) in proc.stdout and pa.VERSION in proc.stdout


def test_an_unreachable_index_is_one_line_naming_the_fix(tmp_path) -> None:
    """No index reachable (pip pointed at a closed port, no config, no local wheel directories)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0"}
    env[pa.ENV_DIR] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "serve.bench.perf_analyzer", "install"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "network access to PyPI" in proc.stderr and "install`" in proc.stderr
    assert not (tmp_path / "cache" / pa.VERSION).exists()  # nothing half-installed looks complete


def test_parse_csv_written_by_the_binary(tmp_path) -> None:
    for name in ("grpc_verbose.csv", "http.csv"):
        path = FIXTURES / name
        header, values = (line.split(",") for line in path.read_text().splitlines())
        raw = dict(zip(header, values, strict=True))
        (row,) = pa.parse_csv(path)
        assert row.concurrency == int(raw["Concurrency"]) and row.inferences_per_s == float(raw["Inferences/Second"])
        assert row.latency_ms["p99"] == pytest.approx(float(raw["p99 latency"]) / 1e3)  # µs → ms
        assert row.server_queue_ms == pytest.approx(float(raw["Server Queue"]) / 1e3)
        assert row.latency_ms["p50"] <= row.latency_ms["p95"] <= row.latency_ms["p99"]
        assert ("mean" in row.latency_ms) == ("Avg latency" in raw)
    broken = tmp_path / "broken.csv"
    broken.write_text("Concurrency,Inferences/Second\n4,1.0\n")
    with pytest.raises(pa.PerfAnalyzerError, match="p50 latency"):
        pa.parse_csv(broken)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_measures_the_smoke_model(installation, server, smoke_export, protocol, tmp_path) -> None:
    """A few seconds of real load with the export's held-out sentences; every request it sent succeeded (Triton's
    own statistics), and the parsed numbers are consistent."""
    data = pa.write_input_data(load_sentences(smoke_export, None), tmp_path / "input.json")
    url = server.info.grpc_url if protocol == "grpc" else server.info.triton_http_url
    before = _counts(server)
    result = pa.run(
        installation,
        url,
        protocol,
        MODEL,
        data,
        CONCURRENCY,
        tmp_path / "pa.csv",
        headers=server.admin_headers(protocol),
        measurement=QUICK,
    )
    succeeded, failed = (a - b for a, b in zip(_counts(server), before, strict=True))
    row = result.row
    assert row.concurrency == CONCURRENCY and row.inferences_per_s > 0 and row.requests
    assert failed == 0 and succeeded >= row.requests  # its measured windows plus warm-up and earlier windows
    assert 0 < row.latency_ms["p50"] <= row.latency_ms["p95"] <= row.latency_ms["p99"]
    assert row.server_compute_infer_ms > 0


def test_a_failed_request_stops_it_with_the_servers_reason(installation, server, smoke_export, tmp_path) -> None:
    data = pa.write_input_data(load_sentences(smoke_export, None), tmp_path / "input.json")
    too_wide = int(SEARCH_LIMITS["beam_size"][1]) + 1
    with pytest.raises(pa.PerfAnalyzerError, match=r"beam_size.*out of range"):
        pa.run(
            installation,
            server.info.grpc_url,
            "grpc",
            MODEL,
            data,
            CONCURRENCY,
            tmp_path / "pa.csv",
            headers=server.admin_headers("grpc"),
            parameters={"beam_size": too_wide},
            measurement=QUICK,
        )


def test_bench_reports_perf_analyzer_next_to_ours(installation, smoke_export, tmp_path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "serve.bench",
            f"exports=[{smoke_export}]",
            f"out={out}",
            "tool=both",
            "protocols=[grpc]",
            f"concurrency=[{CONCURRENCY}]",
            "no_batching_concurrency=[]",
            "baseline=false",
            "duration_s=2",
            "server.instance_count=1",
            f"perf_analyzer.measurement_interval_ms={QUICK.interval_ms}",
            f"perf_analyzer.stability_percentage={QUICK.stability_percentage}",
            f"perf_analyzer.max_trials={QUICK.max_trials}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    (point,) = result["points"]
    assert result["tool"] == "both" and result["perf_analyzer"]["version"] == pa.VERSION
    assert point["pa_error"] is None and point["sentences_per_s"] > 0 and point["pa_sentences_per_s"] > 0
    assert point["pa_ratio"] == pytest.approx(point["pa_sentences_per_s"] / point["sentences_per_s"])
    assert Path(point["pa_csv"]).is_file() and point["pa_latency_ms"]["p95"] >= point["pa_latency_ms"]["p50"]
    table = (out / "results.md").read_text()
    assert "| perf_analyzer sent/s |" in table and "perf_analyzer ÷ ours" in table
    assert f"{MODEL} grpc batch 1 concurrency {CONCURRENCY}: perf_analyzer" in table
