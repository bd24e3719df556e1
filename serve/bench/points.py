"""One load point of `python -m serve.bench`: our generator keeping `concurrency` requests in flight, or
perf_analyzer on the same point, Triton's own statistics around it, the in-process baseline at its effective
batch, and the median over rounds.

Why apart from the sweep (sweep.py): a point is what every round measures, whichever tool; the sweep decides
which points, in which order, on which server.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serve.bench import perf_analyzer as pa
from serve.client import Client, ClientError
from serve.errors import ServeError
from serve.model_config import read_manifest

NO_BATCHING = "-nodb"  # suffix of the copy of a model served without dynamic batching
# the per-request latency percentiles every point reports (p90 beside p50: the batch-1 latency of issue 65)
LATENCY_PERCENTILES = (50, 90, 95, 99)


@dataclass
class Point:
    """One measured load point."""

    model: str
    protocol: str
    dynamic_batching: bool
    client_batch: int
    concurrency: int
    requests: int = 0
    errors: int = 0
    sentences: int = 0
    seconds: float = 0.0
    sentences_per_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    effective_batch: float = 0.0
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    inprocess_sentences_per_s: float | None = None
    ratio: float | None = None
    first_error: str | None = None
    rounds_sentences_per_s: list[float] = field(default_factory=list)
    rounds_ratio: list[float] = field(default_factory=list)
    measured_by_ours: bool = True  # False with tool=perf_analyzer: the fields above then stay empty
    # perf_analyzer on the same point (tool=perf_analyzer|both): sentences/s (= its inferences/s), latency,
    # requests in its reported windows, Triton's queue / compute per request as it reports them, and the ratio
    # perf_analyzer ÷ ours; pa_error when it failed (the other tools' numbers stand)
    pa_sentences_per_s: float | None = None
    pa_latency_ms: dict[str, float] = field(default_factory=dict)
    pa_requests: int | None = None
    pa_queue_ms: float | None = None
    pa_compute_ms: float | None = None
    pa_ratio: float | None = None
    pa_error: str | None = None
    pa_csv: str | None = None
    rounds_pa_sentences_per_s: list[float] = field(default_factory=list)


def load_sentences(export_dir: Path, path: str | None) -> list[str]:
    if path:
        lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    else:
        manifest = read_manifest(export_dir)
        lines = json.loads((export_dir / manifest["heldout"]).read_text(encoding="utf-8"))["src"]
    if not lines:
        raise ServeError(f"no source sentences for {export_dir} (give sentences=<file>)")
    return lines


def _stats(url: str, model: str, headers: dict[str, str] | None = None) -> tuple[int, int, int, int]:
    """(inference_count, execution_count, queue ns, compute_infer ns) from Triton's statistics API (an admin
    API: `headers` carries the server's admin key)."""
    with Client(url, "http", model, headers=headers) as c:
        s = c.statistics()
    inf = s["inference_stats"]
    return (
        int(s["inference_count"]),
        int(s["execution_count"]),
        int(inf["queue"]["ns"]),
        int(inf["compute_infer"]["ns"]),
    )


def run_point(
    url: str,
    stats_url: str,
    point: Point,
    pool: Sequence[str],
    search: dict[str, Any] | Sequence[dict[str, Any]],
    duration: float,
    max_requests: int,
    warmup: int,
    admin: dict[str, str] | None = None,
) -> Point:
    """Keep `concurrency` requests in flight for `duration` s or `max_requests`; fill in the point's numbers.
    `search`: the settings of every request, or (client batch 1) one per pool sentence."""
    b, n = point.client_batch, len(pool)

    def settings(first: int) -> dict[str, Any]:
        return search if isinstance(search, dict) else search[first % n]

    lock = threading.Lock()
    issued = [0]
    latencies: list[float] = []
    errors: list[str] = []
    clock: dict[str, Any] = {}

    def begin() -> None:  # runs once, when every client is connected and warmed up
        clock["stats"] = _stats(stats_url, point.model, admin)
        clock["start"] = time.perf_counter()
        clock["deadline"] = clock["start"] + duration

    barrier = threading.Barrier(point.concurrency, action=begin)

    def worker(k: int) -> None:
        # each thread makes its own client: the HTTP client (gevent) only works in the thread that created it
        try:
            client = Client(url, point.protocol, point.model)
            if k < warmup:
                client.infer([pool[(k + j) % n] for j in range(b)], settings(k))
        except Exception as exc:
            with lock:
                errors.append(f"client setup: {exc}")
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            while True:
                with lock:
                    i = issued[0]
                    if i >= max_requests or time.perf_counter() >= clock["deadline"]:
                        return
                    issued[0] += 1
                texts = [pool[(i * b + j) % n] for j in range(b)]
                t0 = time.perf_counter()
                try:
                    client.infer(texts, settings(i * b))
                except Exception as exc:  # every failure is counted, never lost with its thread
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    latencies.append(time.perf_counter() - t0)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(point.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if "start" not in clock:
        raise ClientError(f"load point {point} could not start: {errors[:1]}")
    elapsed = time.perf_counter() - clock["start"]
    start_stats = clock["stats"]
    end_stats = _stats(stats_url, point.model, admin)
    lat = np.array(latencies) * 1e3
    point.requests, point.errors = len(latencies) + len(errors), len(errors)
    point.first_error = errors[0] if errors else None
    point.sentences, point.seconds = len(latencies) * b, elapsed
    point.sentences_per_s = point.sentences / elapsed if elapsed > 0 else 0.0
    if lat.size:
        point.latency_ms = {f"p{q}": float(np.percentile(lat, q)) for q in LATENCY_PERCENTILES}
        point.latency_ms["mean"] = float(lat.mean())
    _server_side(point, start_stats, end_stats, len(latencies) + len(errors))
    return point


def _server_side(point: Point, start: tuple[int, ...], end: tuple[int, ...], requests: int) -> None:
    """Effective batch, queue time per request and compute time per execution from two `_stats` readings."""
    d_inf, d_exec, d_queue, d_compute = (e - s for e, s in zip(end, start, strict=True))
    point.effective_batch = d_inf / d_exec if d_exec else 0.0
    point.queue_ms = d_queue / max(requests, 1) / 1e6
    point.compute_ms = d_compute / max(d_exec, 1) / 1e6


def run_perf_analyzer(
    found: pa.Installation,
    url: str,
    stats_url: str,
    point: Point,
    input_data: Path,
    search: dict[str, Any],
    measurement: pa.Measurement,
    csv_path: Path,
    headers: dict[str, str],
    admin: dict[str, str] | None = None,
) -> Point:
    """perf_analyzer on the same point: fills the `pa_*` fields, or `pa_error` when it failed (a busy machine
    that never gave it three agreeing windows, search settings over HTTP) so the sweep goes on. Without our
    measurement (tool=perf_analyzer), Triton's statistics around its run give the effective batch."""
    start = None if point.measured_by_ours else _stats(stats_url, point.model, admin)
    try:
        result = pa.run(
            found,
            url,
            point.protocol,
            point.model,
            input_data,
            point.concurrency,
            csv_path,
            batch=point.client_batch,
            headers=headers,
            parameters=search,
            measurement=measurement,
        )
    except pa.PerfAnalyzerError as exc:
        point.pa_error = str(exc)
        return point
    row = result.row
    point.pa_sentences_per_s = row.inferences_per_s  # one inference = one batch row = one text
    point.pa_latency_ms = row.latency_ms
    point.pa_requests = row.requests
    point.pa_queue_ms, point.pa_compute_ms = row.server_queue_ms, row.server_compute_infer_ms
    point.pa_csv = str(csv_path)
    if start is not None:
        end = _stats(stats_url, point.model, admin)
        _server_side(point, start, end, (end[0] - start[0]) // max(point.client_batch, 1))
    return point


def served_rate(point: Point) -> float:
    """The served sentences/s the in-process baseline is compared with: ours, else perf_analyzer's."""
    return point.sentences_per_s if point.measured_by_ours else point.pa_sentences_per_s or 0.0


def inprocess_rate(model: Any, pool: Sequence[str], batch: int, search: dict[str, Any], duration: float) -> float:
    """Sentences/s of the export runtime translating batches of `batch` sentences in this process."""
    n, done, i = len(pool), 0, 0
    model.translate([pool[j % n] for j in range(batch)], max_sentences=batch, max_tokens=1 << 30, **search)  # warm
    t0 = time.perf_counter()
    while True:
        texts = [pool[(i + j) % n] for j in range(batch)]
        model.translate(texts, max_sentences=batch, max_tokens=1 << 30, **search)
        done += batch
        i += batch
        if time.perf_counter() - t0 >= duration:
            break
    return done / (time.perf_counter() - t0)


def median_point(rounds: list[Point]) -> Point:
    """The round with the median sentences/s stands for the point; every round's rate and ratio are kept, the
    ratio reported is the median of the per-round ratios (each measured right after its served run)."""
    ordered = sorted(rounds, key=lambda p: p.sentences_per_s)
    point = ordered[(len(ordered) - 1) // 2]
    point.rounds_sentences_per_s = [p.sentences_per_s for p in rounds]
    ratios = [p.ratio for p in rounds if p.ratio is not None]
    point.rounds_ratio = ratios
    point.ratio = float(np.median(ratios)) if ratios else None
    point.errors = sum(p.errors for p in rounds)
    _median_perf_analyzer(point, rounds)
    return point


PA_FIELDS = ("pa_sentences_per_s", "pa_latency_ms", "pa_requests", "pa_queue_ms", "pa_compute_ms", "pa_csv")


def _median_perf_analyzer(point: Point, rounds: list[Point]) -> None:
    """perf_analyzer's numbers from its own median round (chosen independently of ours), its first error, and
    the ratio perf_analyzer ÷ ours of the two medians."""
    measured = sorted((p for p in rounds if p.pa_sentences_per_s is not None), key=lambda p: p.pa_sentences_per_s)
    point.rounds_pa_sentences_per_s = [p.pa_sentences_per_s for p in rounds if p.pa_sentences_per_s is not None]
    if measured:
        middle = measured[(len(measured) - 1) // 2]
        for name in PA_FIELDS:
            setattr(point, name, getattr(middle, name))
    point.pa_error = next((p.pa_error for p in rounds if p.pa_error), None)
    ours, theirs = point.sentences_per_s, point.pa_sentences_per_s
    point.pa_ratio = theirs / ours if point.measured_by_ours and theirs is not None and ours > 0 else None
