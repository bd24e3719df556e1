"""`python -m serve.bench exports=[…]`: served sentences/s and latency, measured by our load generator on
tritonclient and/or NVIDIA's perf_analyzer (`tool=ours|perf_analyzer|both`).

One run: write a repository with every export as `<name>` (dynamic batching on) and `<name>-nodb` (off), start a
real tritonserver, and for each model × protocol × client batch × concurrency keep `concurrency` requests in
flight (one client thread each). Ours runs for `duration_s` or `max_requests`, whichever ends first; per point:
sentences/s, latency p50/p95/p99, errors, and Triton's effective batch (Δinference_count / Δexecution_count from
its statistics API); then the in-process export runtime (same ORT threads) translating batches of that size
gives the overhead ratio served / in-process. perf_analyzer (serve/bench/perf_analyzer.py, installed into the cache on
first use) measures the same point — server, model, protocol, concurrency, client batch, texts and search
settings — with its own windows and stabilisation; its sentences/s and p50/p95/p99 go beside ours (`pa_*`
fields) with the ratio perf_analyzer ÷ ours.

Why we keep our own generator: it measures what perf_analyzer cannot (the in-process baseline at the served
effective batch, a bounded request count, HTTP through the nginx proxy users reach — perf_analyzer needs the
statistics API, which the proxy does not pass, so over HTTP it talks to Triton's loopback listener — and search
settings over HTTP, which perf_analyzer 2.51 sends over gRPC only), and it needs no download. perf_analyzer is
the tool Triton users know, so `tool=both` cross-checks our numbers with it.
Results: results.json, results.md (table), results.png (plot).

`bench` reads as its steps:
  repository  the out directory, a repository with every export as `<name>` (and `<name>-nodb`), sentence pools
  tools       which load generators measure; perf_analyzer installed and its input data written before any server
  sweep       one tritonserver; every round covers the whole plan (compared settings interleaved), each point
              with the in-process baseline at its effective batch; the median of the rounds per point
  results     results.json, results.md, results.png; the server is stopped first, whatever happened
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

import export
from export.runtime import ExportRuntimeError
from serve.bench import perf_analyzer as pa
from serve.client import Client, ClientError
from serve.errors import ServeError
from serve.model_config import ModelSettings, read_manifest
from serve.proxy import ProxySettings
from serve.repository import write_python_model
from serve.server import Server
from zoo.errors import one_line_errors

NO_BATCHING = "-nodb"
TOOLS = ("ours", "perf_analyzer", "both")


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
        point.latency_ms = {f"p{q}": float(np.percentile(lat, q)) for q in (50, 95, 99)}
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


def _cell(value: float | None, digits: int = 1) -> str:
    return "" if value is None or np.isnan(value) else f"{value:.{digits}f}"


def markdown(points: list[Point]) -> str:
    """The results table; with perf_analyzer's numbers (or errors) in any point, its columns beside ours."""
    with_pa = any(p.pa_sentences_per_s is not None or p.pa_error for p in points)
    head = (
        "| model | protocol | dyn. batching | client batch | concurrency | sent/s | p50 ms | p95 ms | p99 ms "
        "| eff. batch | in-process sent/s | served / in-process | requests | errors |"
        + (" perf_analyzer sent/s | its p50 ms | its p95 ms | its p99 ms | perf_analyzer ÷ ours |" if with_pa else "")
        + "\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|---:|---:|---:|" if with_pa else "")
        + "\n"
    )
    rows = []
    for p in points:
        lat = p.latency_ms if p.measured_by_ours else {}
        ours = [p.sentences_per_s, lat.get("p50"), lat.get("p95"), lat.get("p99")] if p.measured_by_ours else []
        row = (
            f"| {p.model} | {p.protocol} | {'on' if p.dynamic_batching else 'off'} | {p.client_batch} "
            f"| {p.concurrency} | {' | '.join(_cell(v) for v in ours) if ours else ' |  |  | '} "
            f"| {p.effective_batch:.2f} | {_cell(p.inprocess_sentences_per_s)} | {_cell(p.ratio, 2)} "
            f"| {p.requests if p.measured_by_ours else ''} | {p.errors if p.measured_by_ours else ''} |"
        )
        if with_pa:
            theirs = p.pa_latency_ms
            if p.pa_sentences_per_s is None:
                row += " failed (below) |  |  |  |  |"
            else:
                cells = [p.pa_sentences_per_s, theirs.get("p50"), theirs.get("p95"), theirs.get("p99")]
                row += f" {' | '.join(_cell(v) for v in cells)} | {_cell(p.pa_ratio, 2)} |"
        rows.append(row)
    return head + "\n".join(rows) + "\n"


def comparisons(points: list[Point]) -> list[str]:
    """Dynamic batching on vs off, and model vs model, at the same protocol / batch / concurrency."""
    lines = []
    key = {(p.model, p.protocol, p.dynamic_batching, p.client_batch, p.concurrency): p for p in points}
    for p in points:
        if p.dynamic_batching:
            continue
        on = key.get((p.model.removesuffix(NO_BATCHING), p.protocol, True, p.client_batch, p.concurrency))
        if on and p.sentences_per_s:
            lines.append(
                f"- {on.model} {p.protocol} batch {p.client_batch} concurrency {p.concurrency}: dynamic "
                f"batching on {on.sentences_per_s:.1f} vs off {p.sentences_per_s:.1f} sent/s "
                f"(×{on.sentences_per_s / p.sentences_per_s:.2f})"
            )
    models = sorted({p.model for p in points if p.dynamic_batching})
    for a in models:
        for b in models:
            if a >= b:
                continue
            for p in points:
                if p.model != a or not p.dynamic_batching:
                    continue
                q = key.get((b, p.protocol, True, p.client_batch, p.concurrency))
                if q and q.sentences_per_s:
                    lines.append(
                        f"- {p.protocol} batch {p.client_batch} concurrency {p.concurrency}: {a} "
                        f"{p.sentences_per_s:.1f} vs {b} {q.sentences_per_s:.1f} sent/s "
                        f"(×{p.sentences_per_s / q.sentences_per_s:.2f})"
                    )
    return lines


def tool_agreement(points: list[Point], tolerance: float) -> list[str]:
    """perf_analyzer vs ours at each point both measured (agreeing when |ratio − 1| ≤ `tolerance`), and
    perf_analyzer's failures."""
    lines = []
    for p in points:
        where = f"{p.model} {p.protocol} batch {p.client_batch} concurrency {p.concurrency}"
        if p.pa_ratio is not None and p.pa_sentences_per_s is not None:
            verdict = "within" if abs(p.pa_ratio - 1) <= tolerance else "more than"
            lines.append(
                f"- {where}: perf_analyzer {p.pa_sentences_per_s:.1f} vs ours {p.sentences_per_s:.1f} sent/s "
                f"(×{p.pa_ratio:.2f}: {verdict} {tolerance:.0%}); p95 {_cell(p.pa_latency_ms.get('p95'))} "
                f"vs {_cell(p.latency_ms.get('p95'))} ms"
            )
        elif p.pa_error:
            lines.append(f"- {where}: {p.pa_error}")
    return lines


def plot(points: list[Point], path: Path) -> None:
    # imported here: matplotlib is slow to import and only plotting needs it, and the Agg backend must be
    # selected before pyplot loads (at module level that would change the backend of whoever imports us)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    series: dict[tuple[str, str, int], list[Point]] = {}
    for p in points:
        if p.dynamic_batching:
            series.setdefault((p.model, p.protocol, p.client_batch), []).append(p)
    for (model, protocol, batch), ps in sorted(series.items()):
        ps.sort(key=lambda p: p.concurrency)
        label = f"{model} {protocol} b={batch}"
        xs = [p.concurrency for p in ps]
        ours = [(p.sentences_per_s, p.latency_ms.get("p95", np.nan)) for p in ps if p.measured_by_ours]
        theirs = [(p.concurrency, p.pa_sentences_per_s, p.pa_latency_ms.get("p95", np.nan)) for p in ps]
        theirs = [t for t in theirs if t[1] is not None]
        color = None
        if ours:
            (line,) = ax1.plot(xs, [r for r, _ in ours], marker="o", label=label)
            ax2.plot(xs, [q for _, q in ours], marker="o", color=line.get_color(), label=label)
            color = line.get_color()
        if theirs:
            tx, rates, p95 = zip(*theirs, strict=True)
            (line,) = ax1.plot(tx, rates, marker="x", ls="--", color=color, label=f"{label} perf_analyzer")
            ax2.plot(tx, p95, marker="x", ls="--", color=line.get_color(), label=f"{label} perf_analyzer")
            color = line.get_color()
        base = [(p.concurrency, p.inprocess_sentences_per_s) for p in ps if p.inprocess_sentences_per_s]
        if base:
            ax1.plot(*zip(*base, strict=True), ls=":", color=color, alpha=0.7)
    ax1.set(
        xscale="log",
        xlabel="concurrency",
        ylabel="sentences/s",
        title="served: ours (o), perf_analyzer (x); in-process (dotted)",
    )
    ax2.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="p95 latency (ms)", title="latency")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench(cfg: Any) -> dict[str, Any]:
    """Run the whole sweep described by `cfg` (conf/bench.yaml); returns the JSON written."""
    run = _write_repository(cfg)
    tools = _tools(cfg, run)
    # the bench is one client address: let it keep its highest concurrency in flight (ProxySettings' per-address cap)
    most = max([int(c) for c in (*cfg.concurrency, *(cfg.no_batching_concurrency or []))], default=0)
    proxy = ProxySettings(per_client_requests=max(ProxySettings().per_client_requests, most + 8))
    server = Server.start(run.repo, http_port=0, grpc_port=0, metrics_port=0, timeout=run.timeout, proxy=proxy)
    try:
        points = _sweep(cfg, run, tools, server)
    finally:
        server.stop()
    return _write_results(cfg, run, tools, points)


# ---------------------------------------------------------------------------------------------- the steps' results
@dataclass
class _Run:
    """What the sweep serves and how (the repository step)."""

    exports: list[Path]
    stamp: str  # UTC start time: names the default out directory, recorded as "created"
    out: Path
    repo: Path
    timeout: float  # seconds the server may take to get every model ready
    names: list[str]  # one model per export (`<name>-nodb` beside it without dynamic batching)
    pools: dict[str, list[str]]  # model name → the sentences its requests draw from
    search: dict[str, Any]  # search settings sent with every request (those set in cfg.search)
    forced: dict[str, list[dict[str, Any]]]  # model name → per pool sentence, its forced-length settings (lengths=)
    repeats: int
    baseline_threads: int | None  # ORT threads of the in-process baseline


@dataclass
class _Tools:
    """Which load generators measure, and what perf_analyzer needs (the tools step)."""

    tool: str
    use_ours: bool
    use_pa: bool
    found: pa.Installation | None  # perf_analyzer, installed (tool=perf_analyzer|both)
    measurement: pa.Measurement
    pa_dir: Path
    inputs: dict[str, Path]  # model → perf_analyzer's input data


# ---------------------------------------------------------------------------------------------- repository
def _write_repository(cfg: Any) -> _Run:
    """The out directory and one model repository for the whole sweep: every export with dynamic batching, and
    beside it a copy without when no_batching_concurrency measures one, so one server serves both."""
    exports = [Path(e) for e in ([cfg.exports] if isinstance(cfg.exports, str) else cfg.exports)]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"bench/serve-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    repo = out / "repo"
    srv = OmegaConf.to_container(cfg.server, resolve=True)
    timeout = float(srv.pop("timeout_s", 300))  # type: ignore[union-attr]
    settings = ModelSettings.from_mapping(srv)  # type: ignore[arg-type]
    off = ModelSettings.from_mapping({**srv, "dynamic_batching": False})  # type: ignore[dict-item]
    names, pools = [], {}
    for e in exports:
        manifest = read_manifest(e)  # checked (files hashed) once for both models of the export
        name = write_python_model(e, repo, settings, overwrite=True, manifest=manifest)
        names.append(name)
        pools[name] = load_sentences(e, cfg.sentences)
        if cfg.no_batching_concurrency:
            write_python_model(e, repo, off, overwrite=True, name=name + NO_BATCHING, manifest=manifest)
    search = {k: v for k, v in OmegaConf.to_container(cfg.search, resolve=True).items() if v is not None}  # type: ignore[union-attr]
    forced = _forced_lengths(cfg, names, pools, search)
    repeats = max(1, int(cfg.repeats))
    baseline_threads = _baseline_threads(cfg.baseline_threads, settings)
    return _Run(exports, stamp, out, repo, timeout, names, pools, search, forced, repeats, baseline_threads)


def _forced_lengths(
    cfg: Any, names: list[str], pools: dict[str, list[str]], search: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """`lengths=[file per export]`: each sentence's request carries min_len = max_len_b - 1 = its length and
    max_len_a = 0, so the server decodes a known amount of work (zoo.report's speed stage, whose rebuilt models
    have random weights). One sentence per request, our load generator only, no in-process baseline."""
    if not cfg.get("lengths"):
        return {}
    files = [cfg.lengths] if isinstance(cfg.lengths, str) else list(cfg.lengths)
    if len(files) != len(names):
        raise ServeError(f"lengths= lists {len(files)} files for {len(names)} exports; give one per export")
    if list(cfg.client_batch) != [1] or str(cfg.tool) != "ours" or cfg.baseline:
        raise ServeError("lengths= needs client_batch=[1] tool=ours baseline=false (one forced length per request)")
    forced = {}
    for name, path in zip(names, files, strict=True):
        lengths = json.loads(Path(path).read_text())
        if len(lengths) != len(pools[name]):
            raise ServeError(f"{path} has {len(lengths)} lengths for {len(pools[name])} sentences; give one each")
        forced[name] = [{**search, "min_len": int(n), "max_len_a": 0, "max_len_b": int(n) + 1} for n in lengths]
    return forced


# ---------------------------------------------------------------------------------------------- tools
def _tools(cfg: Any, run: _Run) -> _Tools:
    """The load generators `tool=` asks for; perf_analyzer is installed and its inputs written before the server
    starts, so a failed download stops the run here."""
    tool = str(cfg.tool)
    if tool not in TOOLS:
        raise ServeError(f"tool={tool} is not one of {', '.join(TOOLS)}")
    use_ours, use_pa = tool != "perf_analyzer", tool != "ours"
    found = pa.install() if use_pa else None
    measurement = _measurement(cfg)
    pa_dir = run.out / "perf_analyzer"
    inputs: dict[str, Path] = {}
    if use_pa:
        pa_dir.mkdir(exist_ok=True)
        for name in run.names:
            inputs[name] = inputs[name + NO_BATCHING] = pa.write_input_data(run.pools[name], pa_dir / f"{name}.json")
    return _Tools(tool, use_ours, use_pa, found, measurement, pa_dir, inputs)


# ---------------------------------------------------------------------------------------------- sweep
def _plan(cfg: Any, names: list[str]) -> list[tuple[str, str, int, int, bool]]:
    """Every (model, protocol, client batch, concurrency, dynamic batching) point of one round."""
    plan = []
    for name in names:
        for protocol in cfg.protocols:
            for b in cfg.client_batch:
                plan += [(name, protocol, int(b), int(c), True) for c in cfg.concurrency]
                plan += [(name, protocol, int(b), int(c), False) for c in cfg.no_batching_concurrency]
    return plan


def _sweep(cfg: Any, run: _Run, tools: _Tools, server: Server) -> list[Point]:
    """Every round covers the whole plan, so compared settings are interleaved; each point is the median of its
    rounds."""
    plan = _plan(cfg, run.names)
    rounds: dict[tuple, list[Point]] = {}
    inproc: dict[str, Any] = {}  # model name → its export loaded in this process (the baseline)
    for r in range(run.repeats):
        baselines: dict[tuple[str, int], float] = {}  # in-process rate per effective batch, this round
        for k, (name, protocol, b, c, db) in enumerate(plan, 1):
            model = name if db else name + NO_BATCHING
            p = Point(model, protocol, db, b, c, measured_by_ours=tools.use_ours)
            p = _measure(cfg, run, tools, server, p, name, r)
            if cfg.baseline and p.effective_batch > 0 and served_rate(p) > 0:
                eff = max(1, round(p.effective_batch))
                if (name, eff) not in baselines:
                    if name not in inproc:
                        inproc[name] = export.load(run.exports[run.names.index(name)], threads=run.baseline_threads)
                    baselines[(name, eff)] = inprocess_rate(
                        inproc[name], run.pools[name], eff, run.search, float(cfg.baseline_duration_s)
                    )
                p.inprocess_sentences_per_s = baselines[(name, eff)]
                p.ratio = served_rate(p) / p.inprocess_sentences_per_s
            rounds.setdefault((model, protocol, b, c), []).append(p)
            print(f"[round {r + 1}/{run.repeats}, {k}/{len(plan)}] {_progress(p)}", flush=True)
    return [median_point(ps) for ps in rounds.values()]


def _measure(cfg: Any, run: _Run, tools: _Tools, server: Server, p: Point, name: str, round_index: int) -> Point:
    """One point by each tool asked for; with both, which goes first alternates round by round."""
    info = server.info
    pa_first = tools.use_pa and round_index % 2 == 1
    if pa_first:
        p = _measure_pa(run, tools, server, p, round_index)
    if tools.use_ours:
        p = run_point(
            info.url(p.protocol),
            info.triton_http_url,
            p,
            run.pools[name],
            run.forced.get(name) or run.search,
            float(cfg.duration_s),
            int(cfg.max_requests),
            int(cfg.warmup_requests),
            server.admin_headers(),
        )
    if tools.use_pa and not pa_first:
        p = _measure_pa(run, tools, server, p, round_index)
    return p


def _measure_pa(run: _Run, tools: _Tools, server: Server, p: Point, round_index: int) -> Point:
    """perf_analyzer on one point: over gRPC, or over HTTP to Triton's own listener (see the module docstring)."""
    assert tools.found is not None
    info = server.info
    return run_perf_analyzer(
        tools.found,
        info.grpc_url if p.protocol == "grpc" else info.triton_http_url,
        info.triton_http_url,
        p,
        tools.inputs[p.model],
        run.search,
        tools.measurement,
        tools.pa_dir / f"{p.model}-{p.protocol}-b{p.client_batch}-c{p.concurrency}-round{round_index + 1}.csv",
        server.admin_headers(p.protocol),
        server.admin_headers(),
    )


# ---------------------------------------------------------------------------------------------- results
def _write_results(cfg: Any, run: _Run, tools: _Tools, points: list[Point]) -> dict[str, Any]:
    """results.json, results.md (table and comparisons) and results.png, the table also printed."""
    agreement = tool_agreement(points, float(cfg.perf_analyzer.agree_within))
    found = tools.found
    result = {
        "repeats": run.repeats,
        "baseline_threads": run.baseline_threads,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "models": run.names,
        "search": run.search,
        "forced_lengths": bool(run.forced),
        "created": run.stamp,
        "machine": _machine(),
        "tool": tools.tool,
        "perf_analyzer": {"version": found.version, "measurement": asdict(tools.measurement)} if found else None,
        "points": [asdict(p) for p in points],
        "comparisons": comparisons(points),
        "tool_agreement": agreement,
    }
    out = run.out
    (out / "results.json").write_text(json.dumps(result, indent=1))
    table = markdown(points)
    notes = result["comparisons"] + agreement
    (out / "results.md").write_text(
        f"# Served throughput ({', '.join(run.names)})\n\n{table}\n" + "\n".join(notes) + "\n"
    )
    plot(points, out / "results.png")
    print(table + "\n".join(notes))
    print(f"wrote {out}/results.json, results.md, results.png")
    return result


def _progress(p: Point) -> str:
    """One line per measured point while the sweep runs."""
    line = f"{p.model} {p.protocol} b={p.client_batch} c={p.concurrency}: "
    if p.measured_by_ours:
        line += f"{p.sentences_per_s:.1f} sent/s, p95 {p.latency_ms.get('p95', float('nan')):.1f} ms, "
    if p.pa_sentences_per_s is not None:
        line += f"perf_analyzer {p.pa_sentences_per_s:.1f} sent/s, p95 {_cell(p.pa_latency_ms.get('p95'))} ms"
        if p.measured_by_ours and p.sentences_per_s:
            line += f" (×{p.pa_sentences_per_s / p.sentences_per_s:.2f} ours)"
        line += ", "
    line += f"eff. batch {p.effective_batch:.2f}"
    line += f", in-process {p.inprocess_sentences_per_s:.1f} (×{p.ratio:.2f})" if p.ratio else ""
    line += f", {p.errors} errors: {p.first_error}" if p.errors else ""
    line += f", {p.pa_error}" if p.pa_error else ""
    return line


def _measurement(cfg: Any) -> pa.Measurement:
    """perf_analyzer's windows: `measurement_interval_ms`, by default duration_s split over the windows it
    reports, so its measured time matches ours."""
    settings = cfg.perf_analyzer
    interval = settings.measurement_interval_ms or round(float(cfg.duration_s) * 1000 / pa.REPORTED_WINDOWS)
    return pa.Measurement(int(interval), float(settings.stability_percentage), int(settings.max_trials))


def _baseline_threads(requested: int | None, settings: ModelSettings) -> int | None:
    """ORT threads of the in-process baseline: by default the CPU the served model may use (threads per
    instance × instances, at most the machine's cores), so `instance_count: 2, threads: 1` is compared with one
    2-thread runtime on a 2-core machine, not with a 1-thread one that leaves a core idle."""
    if requested:
        return int(requested)
    if not settings.threads:
        return None  # ORT's default (all cores), as the served instances use
    return min(int(settings.threads) * int(settings.instance_count), os.cpu_count() or 1)


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def main() -> None:
    @hydra.main(config_path="../../conf", config_name="bench", version_base="1.3")
    def run(cfg: DictConfig) -> None:
        with one_line_errors(ServeError, ExportRuntimeError):
            bench(cfg)

    run()


if __name__ == "__main__":
    main()
