"""REPORT.md, report.json, plots and the README block from the collected records (no number is typed here:
every cell is read from the collected data, and a missing measurement shows as "—" with the reason listed).

The output is a pure function of the records, so re-rendering on a fresh clone reproduces the committed
REPORT.md and the README block byte for byte (tests/test_results.py checks exactly that).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from zoo.flops import format_count, format_flops
from zoo.plots import save_report_figure as _save
from zoo.report.budget_probe import plot_probe, probe_section
from zoo.report.claims import ALPHA, LEVEL
from zoo.report.render_curves import plot_learning_curves
from zoo.report.render_ght import compaction_table, ght_section, plot_compaction, plot_vote_maps
from zoo.report.render_outputs import outputs_section
from zoo.report.render_second_look import second_look_section
from zoo.report.render_speed import plot_quality_vs_speed, readme_speed_column, speed_section, widest_file
from zoo.report.run_state import (
    CLIMBING_GAIN,
    CLIMBING_LOSS_FALL,
    COMPACT_SILHOUETTE,
    DEGENERATE_DISTINCT,
    budget_words,
    climbing_words,
    compaction_text,
    pairing_text,
)
from zoo.report.verdict import MIN_SEEDS, Verdict, percent, verdict_cell

LABELS = {"bleu": "BLEU", "chrf": "chrF", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}


def _pm(stat: dict[str, float] | None, digits: int = 2) -> str:
    if not stat:
        return "—"
    if stat["n"] < 2:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def _bootstrap_cell(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "—"
    return "; ".join(f"{r['delta']:+.2f} (p={r['p_value']:.3f}{'*' if r['significant'] else ''})" for r in rows)


def _heads(rec: dict[str, Any]) -> str:
    """ "mha 8 × 32": the mechanism, its heads and head size, read from the record's model config (and, for a
    pruned entry, how many heads voting kept per module)."""
    c = rec["config"]
    head_dim = c.get("head_dim") or (c["d_model"] // c["num_heads"] if c.get("d_model") else None)
    shared = " shared key" if (c.get("attention_options") or {}).get("shared_key") else ""
    plans = [run.get("head_plan") or {} for run in (rec.get("seeds") or {}).values()]
    kept = sorted({len(heads) for plan in plans for heads in plan.values()})
    pruned = ""
    if kept:  # GHT-PS: what voting kept, per module (the model as served)
        pruned = f" → {kept[0] if len(kept) == 1 else f'{kept[0]}–{kept[-1]}'} kept per module"
    return f"{c.get('attention')}{shared} {c.get('num_heads')} × {head_dim}{pruned}"


def machine_line(data: dict[str, Any]) -> str:
    m = data["machine"]
    where = f"accelerator {m['accelerator']}" if m.get("accelerator") else "CPU only"
    cpus = ", ".join(f"{name} × {n} records" if len(m["cpus"]) > 1 else name for name, n in m["cpus"].items())
    threads = "/".join(str(t) for t in m["torch_threads"]) or "?"
    return (
        f"Machine class `{m['class']}` ({where}): {cpus}; {threads} torch thread(s) per run; "
        f"torch {', '.join(m['torch'])}."
    )


def _budget_line(data: dict[str, Any]) -> str:
    overrides = " ".join(data["budget"]) or "the presets' defaults"
    return (
        f"Budget: `{overrides}`; seeds {data['seeds']}; `data={data['data']}` test split "
        f"({data['references']['segments']} segments, references sha256 `{data['references']['sha256'][:12]}`)."
    )


def _headline(data: dict[str, Any]) -> str:
    """The label of the suite's headline metric (BLEU; ROUGE-L for summarization)."""
    return LABELS[data["headline"]]


def _translation(data: dict[str, Any]) -> bool:
    return data["task"] == "translation"


def _segments(data: dict[str, Any]) -> str:
    return "sentences" if _translation(data) else "documents"


def _difference(data: dict[str, Any]) -> str:
    return "corpus-BLEU difference" if _translation(data) else f"mean per-document {_headline(data)} F1 difference"


def _validation(data: dict[str, Any]) -> str:
    return "BLEU" if _translation(data) else f"{_headline(data)} (greedy)"


def _per_seed_test(data: dict[str, Any]) -> str:
    if _translation(data):
        return "sacreBLEU's paired bootstrap"
    return f"the paired bootstrap of per-document {_headline(data)} (sacreBLEU's rule, documents resampled)"


def _state_line(data: dict[str, Any]) -> list[str]:
    """How far training got: the budget in epochs and how many runs were still climbing at their end."""
    state = data.get("state") or {}
    if not state.get("updates"):
        return []
    epoch = state.get("epoch")
    where = (
        f" (an epoch is ≈ {epoch['batches']} batches, as the Voting-to-Stay pass of `{epoch['source']}` counted it)"
        if epoch
        else " (no record of this budget counts an epoch's batches)"
    )
    line = f"State: {budget_words(state)}{where}"
    if state.get("runs"):
        falls = (
            f"; validation loss down by a median {state['median_loss_fall']:.2f}, up to "
            f"{state['max_loss_fall']:.2f}, over the last quarter"
            if state.get("max_loss_fall") is not None
            else ""
        )
        line += (
            f"; {state['climbing']} of {state['runs']} runs were still climbing at their end (validation loss "
            f"down by ≥ {CLIMBING_LOSS_FALL} nats over their last quarter of updates, or validation "
            f"{_validation(data)} up by ≥ {CLIMBING_GAIN} over their last 20%: {_validation(data)} median "
            f"{state['median_gain']:+.1f}, up to {state['max_gain']:+.1f}{falls})"
        )
    epochs = state.get("epochs")
    if epochs and epochs[-1] < 1.5:
        line += " — one-epoch evidence" + (", not converged models" if state.get("climbing") else "")
    return [line + "."]


def _compute_line(data: dict[str, Any]) -> list[str]:
    """The table's training cost, the unit a compute budget is stated in (core-hours; accelerator-hours)."""
    compute = data.get("compute") or {}
    if not compute.get("runs"):
        return []
    spent = []
    if compute["core_hours"] or not compute["device_hours"]:
        spent.append(f"{compute['core_hours']:.1f} core-hours (training minutes × torch threads)")
    if compute["device_hours"]:
        spent.append(f"{compute['device_hours']:.2f} accelerator-hours")
    shared = f", {compute['shared']} of them shared from another suite" if compute["shared"] else ""
    runs = f"{compute['runs']} run{'s' if compute['runs'] != 1 else ''}"
    return [f"Compute: {runs}{shared}, {' and '.join(spent)} of training; evaluation not counted."]


def _missing_line(data: dict[str, Any]) -> list[str]:
    shared = [
        f"Shared with suite `{origin}` (the same runs: same budget and test references): {', '.join(runs)}."
        for origin, runs in data.get("shared", {}).items()
    ]
    lines = [*shared, ""] if shared else []
    if not data["missing"]:
        return lines
    return [*lines, f"Not recorded yet: {', '.join(data['missing'])}.", ""]


def markdown(data: dict[str, Any], command: str) -> str:
    metrics = data["metrics"]
    lines = [
        f"# Zoo report: suite `{data['suite']}`",
        "",
        f"Task: {data['task']} on `data={data['data']}`; baseline `{data['baseline']}`. "
        f"Rendered from the results records by `{command}`.",
        "",
        machine_line(data),
        _budget_line(data),
        *_state_line(data),
        *_compute_line(data),
        "",
        "Quality is mean ± std over seeds of the test split (detokenized sacreBLEU / chrF, or ROUGE F1). "
        "Δ is the paired-bootstrap difference against the baseline trained with the same seed, one per seed "
        "(`*` = p < 0.05), recomputed from the records' hypotheses. Parameters and FLOPs (forward, source "
        "length 30) are of the model as served (pruned for GHT-PS); speed is in its own section below.",
        "",
    ]
    lines += _missing_line(data)
    header = ["entry", "heads", *(LABELS[m] for m in metrics)]
    header.append(f"Δ {_headline(data)} vs baseline")
    header += ["params excl. emb", "params", "FLOPs"]
    header += ["train min", "updates"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry, rec in data["entries"].items():
        size = rec["size"]
        row = [f"`{entry}`", _heads(rec), *(_pm(rec["quality"].get(m)) for m in metrics)]
        row.append(_bootstrap_cell(rec["bootstrap"]))
        row += [format_count(size["params_excl_emb"]), format_count(size["params"]), format_flops(size["flops"])]
        row += [_pm(rec["train_minutes"], 1), _pm(rec["updates"], 0)]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += probe_section(data)
    lines += outputs_section(data)
    lines += claims_section(data)
    lines += speed_section(data["speed"], data["baseline"], data["speed_claims"], data["speed_enabled"])
    lines += _per_source_section(data)
    lines += compaction_table(data)
    lines += ght_section(data)
    lines += [
        "## Plots",
        "",
        "![quality vs parameters](quality_vs_params.png)",
        "![learning curves](learning_curves.png)",
        "",
    ]
    if data["speed"]:
        lines.insert(-1, "![quality vs speed](quality_vs_speed.png)")
    return "\n".join(lines)


def readme_block(data: dict[str, Any], command: str) -> str:
    """The README's table of a suite: the headline columns of REPORT.md with the machine and budget lines."""
    metrics = data["metrics"]
    lines = [
        machine_line(data),
        "",
        _budget_line(data),
        *_state_line(data),
        "",
        f"Rendered by `{command}` from the records in `{data['results_dir']}/` (its REPORT.md adds per-source "
        "scores, GHT probes and plots).",
        "",
    ]
    lines += _missing_line(data)
    header = ["entry", "heads", *(LABELS[m] for m in metrics)]
    header.append(f"Δ {_headline(data)} vs `{data['baseline']}` (per seed)")
    header += ["params excl. emb", "FLOPs @ src 30", "train min"]
    speed = readme_speed_column(data["speed"])  # (header, cell per entry) when speed was measured
    if speed:
        header.append(speed[0])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry, rec in data["entries"].items():
        row = [f"`{entry}`", _heads(rec), *(_pm(rec["quality"].get(m)) for m in metrics)]
        row.append(_bootstrap_cell(rec["bootstrap"]))
        row += [
            format_count(rec["size"]["params_excl_emb"]),
            format_flops(rec["size"]["flops"]),
            _pm(rec["train_minutes"], 1),
        ]
        if speed:
            row.append(speed[1].get(entry, "—"))
        lines.append("| " + " | ".join(row) + " |")
    claims = claims_section(data, heading=False)
    return "\n".join(lines + ([""] + claims[:-1] if claims else [])) + "\n"


def _size_cell(sizes: dict[str, Any]) -> str:
    system, baseline = sizes["system"], sizes["baseline"]
    if not system or not baseline:
        return "—"
    params = system["params_excl_emb"] / baseline["params_excl_emb"] - 1
    flops = system["flops"] / baseline["flops"]
    return (
        f"{format_count(system['params_excl_emb'])} vs {format_count(baseline['params_excl_emb'])} "
        f"({params:+.1%}); FLOPs ×{flops:.2f}"
    )


def _delta_cell(c: dict[str, Any]) -> str:
    """Δ̄ over seeds with its 95% interval and effective df, the interval at the claim's Holm step level, the
    claim's p and its Holm-adjusted p: every number the verdict's words are made from."""
    d, v = c.get("delta"), Verdict.from_json(c["verdict"])
    if not d:
        return "—"
    if d["low"] is None:
        return f"{d['mean']:+.2f} ({d['seeds']} seeds: no interval)"
    df = f"df {d['df']:.0f}" if d.get("df") is not None else "df ∞"
    plain = f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] ({df})"
    if v.p is None or v.p_holm is None:  # an interval, but no test: the verdict cell says why (degenerate outputs)
        return f"{plain}; not tested"
    adjusted = ""
    if v.level is not None and v.interval is not None and v.family_size > 1:
        adjusted = f"; at the Holm level {percent(v.level)}: [{v.interval[0]:+.2f}, {v.interval[1]:+.2f}]"
    return f"{plain}{adjusted}; {v.p_words()}"


def _state_cell(state: dict[str, Any]) -> str:
    if not state.get("runs"):
        return budget_words(state)
    climbing = (
        climbing_words(state, "quality")
        if state["climbing"]
        else f"stopped climbing (quality ≤ {state['max_gain']:+.1f} over the last 20%"
        + (f", loss down ≤ {state['max_loss_fall']:.2f} over the last quarter)" if state.get("max_loss_fall") else ")")
    )
    return f"{budget_words(state)}; {climbing}"


def _pairing_cell(c: dict[str, Any]) -> str:
    """'; pairs on one CPU model: 3 of 3; at one commit: 1 of 3' for a claim with pairs, else ''."""
    return f"; {pairing_text(c['pairing'])}" if (c.get("pairing") or {}).get("pairs") else ""


def _compaction_cell(c: dict[str, Any]) -> str:
    """'; groups at the vote: silhouette …' for a claim with GHT runs (a diagnostic, not a gate), else ''."""
    return f"; {compaction_text(c['compaction'])}" if c.get("compaction") else ""


def _source_cell(source: dict[str, str] | None, quote: bool = True) -> str:
    if not source:
        return "—"
    where = f"{source['paper']}, {source['where']}"
    return f"{where}: “{source['quote']}”" if quote else where


def _families(claims: list[dict[str, Any]]) -> str:
    """`Ni et al. 2023: 6 claims, 3 tested`: each Holm family of a table and how many of its claims were tested."""
    names = dict.fromkeys(c["family"] for c in claims)
    parts = []
    for name in names:
        members = [c for c in claims if c["family"] == name]
        tested = sum(c["verdict"]["p"] is not None for c in members)
        parts.append(f"{name}: {len(members)} claim{'s' * (len(members) != 1)}, {tested} tested")
    return "; ".join(parts)


def _rule_text(data: dict[str, Any], compact: bool) -> str:
    margins = sorted({c["margin"] for c in data.get("claims") or [] if c.get("margin") is not None})
    margin = f"{'/'.join(f'{m:g}' for m in margins)} {_headline(data)}" if margins else "the suite's equivalence margin"
    if compact:
        return (
            f"Verdicts by the rule in `zoo/report/claims.py` (REPORT.md states it and quotes each source): Δ̄ over "
            f"seeds with a {LEVEL:.0%} interval whose variance adds the seeds' spread and the test-set sampling they "
            "share; holds / does not hold when the Holm-adjusted p is below α — the interval at the claim's Holm "
            "level then lies inside / outside the claim's region"
            + (f" (margin ±{margin} for comparable / match / no-improvement claims)" if margins else "")
            + f"; Holm per paper at α = {ALPHA}; ≥ {MIN_SEEDS} seeds per verdict; inconclusive verdicts say what "
            "would decide them."
        )
    return (
        "Verdicts follow from the rule in `zoo/report/claims.py`. Δ̄ is the mean over seeds of the system's "
        f"{_difference(data)} from the baseline trained with the same seed. **Variance model**: Var(Δ̄) = S²/n + c̄ "
        "— S² the sample variance of the n per-seed Δs (n − 1 degrees of freedom: seed-to-seed variation and the "
        "test-set noise that differs between seeds), c̄ the test-set noise every seed shares, estimated as the mean "
        f"covariance of two seeds' Δs over {data.get('bootstrap_samples')} resamples of the test {_segments(data)} "
        "(one draw for both systems and every seed; the segments' count − 1 degrees of freedom). The intervals "
        "read Δ̄ against Cochran–Cox's reference — the two components' Student-t critical values averaged with "
        "their variances as weights — and the df shown is the effective one (a plain t with that df has the same "
        "95% critical value): near n − 1 when seeds dominate, large when the test set does. Welch–Satterthwaite "
        "degrees of freedom were simulated and rejected (7.6% false positives at 3 seeds: they rise when S² is "
        "small by chance); Cochran–Cox stayed at or below 5% in every simulated case (tests/test_verdicts.py). "
        "Each expectation is a region for the true Δ — better "
        f"Δ > 0, worse Δ < 0, match |Δ| < m, not worse Δ > −m, not better Δ < m, m = {margin} — with p = twice the "
        "smaller one-sided p-value for being inside / outside it. **Families**: Holm at "
        f"α = {ALPHA} over each paper's claims in this suite, our questions a family of their own "
        f"({_families(data.get('claims') or [])}). A claim's test runs at its Holm step level α/(m − rank); the "
        "interval at 1 − that level is shown beside the 95% one. **holds** / **does not hold**: the Holm-adjusted "
        "p is below α, so that interval lies inside / outside the region; otherwise **inconclusive**, with the "
        "bound its interval crosses and what would decide it (about how many seeds, if Δ̄ and the seeds' spread "
        "stay; or that the test set's own sampling error is wider than the distance to the bound, so no number "
        f'of seeds can). A verdict needs ≥ {MIN_SEEDS} seeds; fewer render "too few seeds (n)". '
        "A verdict's words carry the budget it was measured at. Runs whose validation loss (the whole validation "
        f"split) still fell by ≥ {CLIMBING_LOSS_FALL} nats over their last quarter of updates, or whose validation "
        f"{_validation(data)} (a small greedy sample) rose by ≥ {CLIMBING_GAIN} over their last 20%, were still "
        "climbing, and the verdict says so. GHT and GHT-PS are judged as the paper's procedure runs "
        "(voting at a fixed point of the budget, compact groups or not); the compaction of the groups the loss "
        f"trained stands beside their verdicts as a diagnostic (silhouette ≥ {COMPACT_SILHOUETTE}: compact). "
        f"A claim one of whose runs gives fewer distinct test outputs than {DEGENERATE_DISTINCT:.0%} of its documents, "
        "or (summarization) does not score above the constant summary beyond its 95% interval over documents, "
        'reads "degenerate outputs" with the numbers, not a verdict. '
        f"The per-seed column is {_per_seed_test(data)} of each "
        f"seed's two runs (test {_segments(data)} only; `*` = p < 0.05). "
        "Params are non-embedding, FLOPs at source length 30."
    )


def claims_section(data: dict[str, Any], heading: bool = True) -> list[str]:
    """The papers' claims, then our own questions, each a table of measured comparisons with the verdict of
    zoo/report/claims.py's rule; `heading=False` is the README's compact form (source cited, not quoted)."""
    claims = data.get("claims") or []
    if not claims:
        return []
    metric = _headline(data)
    papers, ours = [c for c in claims if not c.get("ours")], [c for c in claims if c.get("ours")]
    rule = [_rule_text(data, compact=not heading), "", *second_look_section(data, compact=not heading)]
    lines: list[str] = []
    if papers:
        lines += [*(["## The papers' claims", ""] if heading else []), *rule]
        lines += _claims_table(data, papers, metric, full=heading, source=True)
    if ours:
        if heading:
            lines += ["## Our questions", "", *([] if papers else rule)]
            lines += [
                "Questions of this project, not claims of the papers (nothing to quote), judged by the same rule, "
                "one Holm family of their own.",
                "",
            ]
        else:
            lines += [*([] if papers else rule), "Our questions (not claims of the papers):", ""]
        lines += _claims_table(data, ours, metric, full=heading, source=False)
    return lines


def _claims_table(
    data: dict[str, Any], claims: list[dict[str, Any]], metric: str, full: bool, source: bool
) -> list[str]:
    if full:
        header = ["paper", "claim", *(["source"] if source else []), "design", "system vs baseline"]
        header += [f"{metric} system / baseline", f"Δ {metric} per seed"]
        header.append(f"Δ̄ {metric} [{LEVEL:.0%} CI] (df); at the Holm level; p")
        header += ["budget and state", "verdict"]
    else:
        header = [*(["source"] if source else []), "claim", "system vs baseline", f"Δ {metric} per seed"]
        header += [f"Δ̄ [{LEVEL:.0%} CI]", "budget", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in claims:
        pair = f"`{c['system']}` vs `{c['baseline']}`"
        if full:
            quality = " / ".join(
                _pm((q or {}).get(data["headline"])) for q in (c["quality"]["system"], c["quality"]["baseline"])
            )
            row = [c["paper"], c["claim"], *([_source_cell(c["source"])] if source else [])]
            row += [f"{c['design']}; {_size_cell(c['size'])}", pair, quality, _bootstrap_cell(c["bootstrap"])]
            row += [_delta_cell(c), _state_cell(c["state"]) + _compaction_cell(c) + _pairing_cell(c)]
        else:
            short = [f"{c['paper']} ({_source_cell(c['source'], quote=False)})"] if source else []
            budget = budget_words(c["state"]) + _compaction_cell(c) + _pairing_cell(c)
            row = [*short, c["claim"], pair, _bootstrap_cell(c["bootstrap"]), _delta_cell(c), budget]
        words = verdict_cell(Verdict.from_json(c["verdict"]), c["state"], "BLEU" if _translation(data) else "ROUGE-L")
        lines.append("| " + " | ".join(row) + f" | **{words}** |")
    return [*lines, ""]


def _per_source_section(data: dict[str, Any]) -> list[str]:
    per_source = {e: r["per_source"] for e, r in data["entries"].items() if r["per_source"]}
    if not per_source:
        return []
    origins = sorted({o for ps in per_source.values() for o in ps})
    key = data["headline"]
    lines = [
        f"## {LABELS[key]} per data source (mean over seeds)",
        "",
        "| entry | " + " | ".join(origins) + " |",
        "|" + "---|" * (len(origins) + 1),
    ]
    for entry, ps in per_source.items():
        lines.append(
            f"| `{entry}` | "
            + " | ".join(f"{ps[o][key]:.2f}" if o in ps and key in ps[o] else "—" for o in origins)
            + " |"
        )
    return [*lines, ""]


def _plot_scatter(data: dict[str, Any], out: Path, x_of: Callable[[dict[str, Any]], float | None], xlabel: str) -> None:
    key = data["headline"]
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
    _save(fig, out)


def render(out_dir: Path, data: dict[str, Any], command: str) -> Path:
    """Write REPORT.md, report.json and the plots into `out_dir`; returns the REPORT.md path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    _plot_scatter(
        data,
        out_dir / "quality_vs_params.png",
        lambda r: r["size"]["params_excl_emb"] / 1e6,
        "parameters excl. embeddings (M)",
    )
    if data["speed"]:
        figure = out_dir / "quality_vs_speed.png"
        plot_quality_vs_speed(data, widest_file(data["speed"]), figure, LABELS[data["headline"]])
    plot_learning_curves(data, out_dir / "learning_curves.png")
    plot_vote_maps(data, out_dir)
    plot_compaction(data, out_dir)
    plot_probe(data, out_dir)
    path = out_dir / "REPORT.md"
    path.write_text(markdown(data, command))
    return path


__all__ = ["machine_line", "markdown", "readme_block", "render"]
