"""What `python -m serve.bench` writes for people: results.md's table, the comparisons under it (dynamic batching
on/off, perf_analyzer against ours) and results.png.

Why apart from the sweep (sweep.py): rendering reads finished points only, and is read by whoever changes the
table without touching how points are measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serve.bench.points import LATENCY_PERCENTILES, NO_BATCHING, Point


def cell(value: float | None, digits: int = 1) -> str:
    """A table cell: empty where a tool did not measure (None, or NaN from a failed percentile)."""
    return "" if value is None or np.isnan(value) else f"{value:.{digits}f}"


def markdown(points: list[Point]) -> str:
    """The results table; with perf_analyzer's numbers (or errors) in any point, its columns beside ours."""
    with_pa = any(p.pa_sentences_per_s is not None or p.pa_error for p in points)
    head = (
        "| model | protocol | dyn. batching | client batch | concurrency | sent/s | p50 ms | p90 ms | p95 ms | p99 ms "
        "| eff. batch | in-process sent/s | served / in-process | requests | errors |"
        + (
            " perf_analyzer sent/s | its p50 ms | its p90 ms | its p95 ms | its p99 ms | perf_analyzer ÷ ours |"
            if with_pa
            else ""
        )
        + "\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|---:|---:|---:|---:|" if with_pa else "")
        + "\n"
    )
    rows = []
    for p in points:
        lat = p.latency_ms if p.measured_by_ours else {}
        ours = [p.sentences_per_s, *(lat.get(f"p{q}") for q in LATENCY_PERCENTILES)] if p.measured_by_ours else []
        row = (
            f"| {p.model} | {p.protocol} | {'on' if p.dynamic_batching else 'off'} | {p.client_batch} "
            f"| {p.concurrency} | {' | '.join(cell(v) for v in ours) if ours else ' |  |  |  | '} "
            f"| {p.effective_batch:.2f} | {cell(p.inprocess_sentences_per_s)} | {cell(p.ratio, 2)} "
            f"| {p.requests if p.measured_by_ours else ''} | {p.errors if p.measured_by_ours else ''} |"
        )
        if with_pa:
            theirs = p.pa_latency_ms
            if p.pa_sentences_per_s is None:
                row += " failed (below) |  |  |  |  |  |"
            else:
                cells = [p.pa_sentences_per_s, *(theirs.get(f"p{q}") for q in LATENCY_PERCENTILES)]
                row += f" {' | '.join(cell(v) for v in cells)} | {cell(p.pa_ratio, 2)} |"
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
                f"(×{p.pa_ratio:.2f}: {verdict} {tolerance:.0%}); p95 {cell(p.pa_latency_ms.get('p95'))} "
                f"vs {cell(p.latency_ms.get('p95'))} ms"
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
