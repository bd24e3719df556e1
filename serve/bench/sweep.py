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

One point — our generator or perf_analyzer on it, Triton's statistics, the in-process baseline, the median
of rounds — is serve/bench/points.py; results.md's table and results.png are serve/bench/tables.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import export
from serve.bench import perf_analyzer as pa
from serve.bench.points import (
    NO_BATCHING,
    Point,
    inprocess_rate,
    load_sentences,
    median_point,
    run_perf_analyzer,
    run_point,
    served_rate,
)
from serve.bench.tables import cell, comparisons, markdown, plot, tool_agreement
from serve.errors import ServeError
from serve.model_config import ModelSettings, read_manifest
from serve.proxy import ProxySettings
from serve.repository import write_python_model
from serve.server import Server

TOOLS = ("ours", "perf_analyzer", "both")


def bench(cfg: Any) -> dict[str, Any]:
    """Run the whole sweep described by `cfg` (conf/bench.yaml); returns the JSON written."""
    run = _write_repository(cfg)
    tools = _tools(cfg, run)
    # the bench is one client address: let it keep its highest concurrency in flight (ProxySettings' per-address cap)
    most = max([int(c) for c in (*cfg.concurrency, *(cfg.no_batching_concurrency or []))], default=0)
    proxy = ProxySettings(per_client_requests=max(ProxySettings().per_client_requests, most + 8))
    # one tritonserver: the sweep measures what one does (its statistics split the time), replicas are for crashes
    server = Server.start(
        run.repo, http_port=0, grpc_port=0, metrics_port=0, timeout=run.timeout, proxy=proxy, replicas=1
    )
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
        line += f"perf_analyzer {p.pa_sentences_per_s:.1f} sent/s, p95 {cell(p.pa_latency_ms.get('p95'))} ms"
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
