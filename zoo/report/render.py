"""REPORT.md, report.json and plots from the collected records (no number is typed here: every cell is
read from the collected data, and a missing measurement shows as "—" with the reason listed)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

from zoo.flops import format_count, format_flops

LABELS = {"bleu": "BLEU", "chrf": "chrF", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}


def _pm(stat: dict[str, float] | None, digits: int = 2) -> str:
    if not stat:
        return "—"
    if stat["n"] < 2:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def _speed_cell(speed: dict[str, Any], key: str, notes: list[str], entry: str) -> str:
    rec = speed.get(key)
    if rec is None:
        return "—"
    if "error" in rec:
        notes.append(f"`{entry}` {key}: {rec['error']}")
        return "error"
    return f"{rec['sentences_per_s']:.1f}"


def _triton_cell(served: dict[str, Any] | None, notes: list[str], entry: str) -> str:
    if not served:
        return "—"
    if "error" in served:
        if not any(n.startswith("Triton:") for n in notes):
            notes.append(f"Triton: {served['error']}")
        return "error"
    return f"{served['sentences_per_s']:.1f}"


def _bootstrap_cell(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "—"
    return "; ".join(f"{r['delta']:+.2f} (p={r['p_value']:.3f}{'*' if r['significant'] else ''})" for r in rows)


def _peak(speed: dict[str, Any], engine: str) -> str:
    peaks = [r["peak_rss_mb"] for k, r in speed.items() if k.endswith(f"/{engine}") and "peak_rss_mb" in r]
    return f"{max(peaks):.0f}" if peaks else "—"


def markdown(data: dict[str, Any], settings: list[dict[str, Any]], command: str) -> str:
    metrics = data["metrics"]
    notes: list[str] = []
    lines = [f"# Zoo report: suite `{data['suite']}`", "",
             f"Task: {data['task']} on `data={data['data']}`; seeds {data['seeds']}; baseline `{data['baseline']}`. "
             f"Regenerate with `{command}`.", "",
             "Quality is mean ± std over seeds of the test split (detokenized sacreBLEU / chrF, or ROUGE F1). "
             "Δ is the paired-bootstrap difference against the baseline trained with the same seed, one per seed "
             "(`*` = p < 0.05). Parameters and FLOPs (forward, source length 30) are of the model as served "
             "(pruned for GHT-PS). Speed: sentences/s decoding the first test sentences with the stated beam "
             "and batch, each engine in its own process; peak memory is that process's maximum RSS.", ""]
    speed_cols = [(s["name"], e) for s in settings for e in ("torch", "ort")]
    header = ["entry", *(LABELS[m] for m in metrics)]
    if data["task"] == "translation":
        header.append("Δ BLEU vs baseline")
    header += ["params excl. emb", "params", "FLOPs"]
    header += [f"{name} {'PyTorch' if e == 'torch' else 'ORT'} sent/s" for name, e in speed_cols]
    header += ["Triton sent/s", "peak MB PyTorch", "peak MB ORT", "train min", "updates"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry, rec in data["entries"].items():
        size = rec["size"] or {}
        row = [f"`{entry}`", *(_pm(rec["quality"].get(m)) for m in metrics)]
        if data["task"] == "translation":
            row.append(_bootstrap_cell(rec["bootstrap"]))
        row += [format_count(size["params_excl_emb"]) if size else "—",
                format_count(size["params"]) if size else "—",
                format_flops(size["flops"]) if size else "—"]
        row += [_speed_cell(rec["speed"], f"{name}/{e}", notes, entry) for name, e in speed_cols]
        row += [_triton_cell(rec.get("triton"), notes, entry), _peak(rec["speed"], "torch"), _peak(rec["speed"], "ort"),
                _pm(rec["train_minutes"], 1),
                _pm(rec["updates"], 0)]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if settings:
        lines += ["Speed settings: " + "; ".join(
            f"`{s['name']}` = beam {s['beam_size']}, batch {s['batch']}, max length {s['max_len_a']}·src + "
            f"{s['max_len_b']}" for s in settings) + ".", ""]
    else:
        lines += ["Speed was not measured in this report (`suite.speed.enabled=false`).", ""]
    tcfg = data.get("triton_settings") or {}
    if settings and tcfg.get("enabled"):
        lines += [f"Triton: the export served by a real `tritonserver` (Python backend, the same ORT runtime, the "
                  f"manifest's beam), one sentence per request over {tcfg.get('protocol', 'grpc')}, "
                  f"{tcfg.get('concurrency', 16)} requests in flight, dynamic batching on, "
                  f"{tcfg.get('instance_count', 1)} model instance(s) × "
                  f"{tcfg.get('threads') or data.get('speed_threads') or 'default'} ORT thread(s), "
                  f"{tcfg.get('duration_s', 20)} s per model.", ""]
    per_source = {e: r["per_source"] for e, r in data["entries"].items() if r["per_source"]}
    if per_source:
        origins = sorted({o for ps in per_source.values() for o in ps})
        key = metrics[0]
        lines += [f"## {LABELS[key]} per data source (mean over seeds)", "",
                  "| entry | " + " | ".join(origins) + " |", "|" + "---|" * (len(origins) + 1)]
        for entry, ps in per_source.items():
            lines.append(f"| `{entry}` | " + " | ".join(
                f"{ps[o][key]:.2f}" if o in ps and key in ps[o] else "—" for o in origins) + " |")
        lines.append("")
    lines += _ght_section(data)
    lines += ["## Plots", "", "![quality vs parameters](quality_vs_params.png)",
              "![quality vs speed](quality_vs_speed.png)", "![learning curves](learning_curves.png)", ""]
    if notes:
        lines += ["## Measurement errors", "", *(f"- {n}" for n in notes), ""]
    return "\n".join(lines)


def _ght_section(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for entry, rec in data["entries"].items():
        for seed, run in rec["seeds"].items():
            if not run.get("head_plan") and not run.get("compactness"):
                continue
            if not lines:
                lines += ["## GHT: head plans and compactness", ""]
            lines.append(f"### `{entry}` seed {seed}")
            comp = run.get("compactness")
            if comp:
                b, a = comp["before"], comp["after"]
                lines += ["", "| probe | update | intra-group cos | inter-group cos | silhouette | Dunn |",
                          "|---|---|---|---|---|---|"]
                first = "before GCT" if b["step"] == 0 else "first probe of GCT"
                for label, p in ((first, b), ("end of GCT", a)):
                    lines.append(f"| {label} | {p['step']} | {p['intra_cos']:.3f} | {p['inter_cos']:.3f} | "
                                 f"{p['silhouette']:.3f} | {p['dunn']:.3f} |")
            plan = run.get("head_plan")
            if plan:
                lines += ["", "Kept heads per module: " + ", ".join(
                    f"`{name.replace('.layers.', '.')}` {kept}" for name, kept in plan.items())]
            if run.get("votes_png"):
                lines += ["", f"![votes {entry} seed {seed}](votes-{entry}-seed{seed}.png)"]
            lines.append("")
    return lines


def _plot_scatter(data: dict[str, Any], out: Path, x_of, xlabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = data["metrics"][0] if data["task"] == "translation" else "rougeL"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for entry, rec in data["entries"].items():
        q, x = rec["quality"].get(key), x_of(rec)
        if q is None or x is None:
            continue
        ax.errorbar([x], [q["mean"]], yerr=[q["std"]], fmt="o", capsize=3)
        ax.annotate(entry, (x, q["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"test {LABELS[key]}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _plot_learning_curves(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for entry, rec in data["entries"].items():
        first = next(iter(rec["seeds"].values()), None)
        if not first or not first.get("metrics_csv"):
            continue
        rows = [r for r in csv.DictReader(open(first["metrics_csv"])) if r.get("valid_quality") not in (None, "")]
        if rows:
            ax.plot([float(r["step"]) for r in rows], [float(r["valid_quality"]) for r in rows], marker=".",
                    label=entry)
    ax.set_xlabel("update")
    ax.set_ylabel("validation quality (greedy BLEU / ROUGE-L)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _fastest(rec: dict[str, Any], engine: str, setting: str) -> float | None:
    r = rec["speed"].get(f"{setting}/{engine}")
    return r.get("sentences_per_s") if r and "error" not in r else None


def render(report_dir: Path, data: dict[str, Any], settings: list[dict[str, Any]], command: str) -> Path:
    """Write REPORT.md, report.json and the plots; returns the REPORT.md path."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "report.json").write_text(json.dumps({**data, "speed_settings": settings}, indent=2))
    _plot_scatter(data, report_dir / "quality_vs_params.png",
                  lambda r: r["size"]["params_excl_emb"] / 1e6 if r["size"] else None,
                  "parameters excl. embeddings (M)")
    first = settings[0]["name"] if settings else None
    _plot_scatter(data, report_dir / "quality_vs_speed.png",
                  lambda r: (_fastest(r, "ort", first) or _fastest(r, "torch", first)) if first else None,
                  f"sentences/s ({first}; ORT where exported, else PyTorch)")
    _plot_learning_curves(data, report_dir / "learning_curves.png")
    for entry, rec in data["entries"].items():
        for seed, run in rec["seeds"].items():
            if run.get("votes_png"):
                shutil.copyfile(run["votes_png"], report_dir / f"votes-{entry}-seed{seed}.png")
    path = report_dir / "REPORT.md"
    path.write_text(markdown(data, settings, command))
    return path
