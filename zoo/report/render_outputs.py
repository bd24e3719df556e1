"""REPORT.md's "do the outputs depend on the input?" table of a summarization suite (issue 64): per entry and seed,
distinct test outputs, the share of the most frequent one, the mean length against the references' and the
paired-minus-shuffled control (zoo/report/pairing.py: how much of the ROUGE-L its own document earns); then the
baselines that cost nothing (constant, lead-k: zoo/report/baselines.py), scored at render time, and which entries beat
each on every seed. Summaries of near-constant text scored above most models here, and the score table alone does
not show it."""

from __future__ import annotations

from typing import Any

from zoo.report.pairing import SHUFFLES, dependence_text
from zoo.report.run_state import DEGENERATE_DISTINCT


def outputs_section(data: dict[str, Any]) -> list[str]:
    if data["task"] == "translation":
        return []
    refs = data["references"]
    lines = [
        "## Do the outputs depend on the input?",
        "",
        f"Per seed: distinct test outputs of {refs['segments']} documents, the share of the most frequent one, and "
        f"the mean output length in words (references: {refs.get('mean_words', 0):.1f}). A run with fewer than "
        f'{DEGENERATE_DISTINCT:.0%} distinct outputs is near-constant (**bold**): its claims read "degenerate '
        "outputs\", not a verdict. *Own − shuffled*: the run's ROUGE-L against each document's own reference less "
        f"against other documents' references ({SHUFFLES} fixed derangements, the same for every run), ± its 95% "
        "interval over documents — what the input earns of the score: 0 for any output that ignores its document "
        "(exactly 0 for a constant), so a run whose interval holds 0 has not shown that it reads its input.",
        "",
        "| entry | distinct outputs | most frequent | mean words | own − shuffled ROUGE-L |",
        "|---|---|---|---|---|",
    ]
    for entry, rec in data["entries"].items():
        runs = [(seed, run["outputs"]) for seed, run in rec["seeds"].items() if run.get("outputs")]
        if not runs:
            continue

        def cell(o: dict[str, Any]) -> str:
            text = str(o["distinct"])
            return f"**{text}**" if o["distinct"] < DEGENERATE_DISTINCT * o["documents"] else text

        lines.append(
            f"| `{entry}` | "
            + ", ".join(f"s{seed}: {cell(o)}" for seed, o in runs)
            + " | "
            + ", ".join(f"s{seed}: {o['top_share']:.0%}" for seed, o in runs)
            + " | "
            + ", ".join(f"s{seed}: {o['mean_words']:.1f}" for seed, o in runs)
            + " | "
            + ", ".join(f"s{seed}: {_dependence_cell(rec['seeds'][seed])}" for seed, _ in runs)
            + " |"
        )
    return [*lines, *_reads_input(data), "", *_validation_ended(data), *baselines_section(data)]


def _validation_ended(data: dict[str, Any]) -> list[str]:
    """Each run's last validation point (records' learning curves): the loss tells models apart before their
    outputs do — a run whose loss trails another's at the same update has learned less, whatever its test string."""
    rows = []
    for entry, rec in data["entries"].items():
        last = {
            seed: points[-1]
            for seed, run in rec["seeds"].items()
            if (points := [p for p in run.get("learning_curve") or [] if p.get("valid_loss") is not None])
        }
        if last:
            rows.append((entry, last))
    if not rows:
        return []

    def cells(last: dict[Any, dict[str, Any]], key: str, fmt: str) -> str:
        return ", ".join(f"s{seed}: {'—' if p.get(key) is None else format(p[key], fmt)}" for seed, p in last.items())

    # runs recorded before the trainer counted distinct validation outputs have none: no column of dashes
    distinct = any(p.get("valid_distinct") is not None for _, last in rows for p in last.values())
    return [
        "### Where validation ended",
        "",
        "Each run's last validation: its update, the label-smoothed cross-entropy per target token on the whole "
        "validation split (nats), ROUGE-L of its greedy outputs on the validation sample the trainer scores"
        + (", and the share of distinct outputs in that sample." if distinct else "."),
        "",
        "| entry | update | validation loss | validation ROUGE-L (greedy) |"
        + (" distinct validation outputs |" if distinct else ""),
        "|---|---|---|---|" + ("---|" if distinct else ""),
        *(
            f"| `{entry}` | {cells(last, 'step', 'd')} | {cells(last, 'valid_loss', '.2f')} | "
            f"{cells(last, 'valid_quality', '.2f')} |"
            + (f" {cells(last, 'valid_distinct', '.0%')} |" if distinct else "")
            for entry, last in rows
        ),
        "",
    ]


def _reads_input(data: dict[str, Any]) -> list[str]:
    """The entries whose every seed's own − shuffled interval lies above 0, and the rest (nothing without it)."""
    measured = {
        entry: [run["dependence"] for run in rec["seeds"].values()]
        for entry, rec in data["entries"].items()
        if rec["seeds"] and all(run.get("dependence") for run in rec["seeds"].values())
    }
    if not measured:
        return []
    reads = [f"`{e}`" for e, ds in measured.items() if all(d["gain"] - d["ci95"] > 0 for d in ds)]
    rest = [f"`{e}`" for e in measured if f"`{e}`" not in reads]
    return [
        "",
        "Outputs that depend on their documents (own − shuffled above 0 beyond its 95% interval) on every seed: "
        f"{', '.join(reads) or 'no entry'}; not on every seed: {', '.join(rest) or 'none'}.",
    ]


def _dependence_cell(scored: dict[str, Any]) -> str:
    """A run's or baseline's own − shuffled cell; — where the render had nothing to pair (under 2 documents)."""
    return dependence_text(scored["dependence"]) if scored.get("dependence") else "—"


def baselines_section(data: dict[str, Any]) -> list[str]:
    """The constant and lead-k rows and the entries above each on every seed (nothing without baselines.json.gz)."""
    base = data.get("baselines")
    if not base:
        return []
    constant, lead = base["constant"], base["lead"]
    rows = [
        ("constant", f"“{constant['text']}” (ROUGE-L {constant['valid_rougeL']:.2f})", constant),
        (f"lead-{lead['k']}", f"k = {lead['k']} of 1–40 (ROUGE-L {lead['valid_rougeL']:.2f})", lead),
    ]
    if "oracle" in base:  # an upper bound: shown for scale, not a floor entries must clear
        top = base["oracle"]
        words = f"the document's sentence closest to its own reference (mean {top['mean_words']:.1f} words)"
        rows.append(("oracle sentence (upper bound)", words, top))
    lines = [
        "### Baselines that cost nothing",
        "",
        "Chosen on the validation split, scored here against the test references (zoo/report/baselines.py): "
        "*constant* is the training summary with the best validation ROUGE-L (every distinct one shortlisted by "
        f"unigram F1, the best {constant['candidates']} scored exactly), output for every document; *lead-k* is the "
        "document's first k words"
        + (
            "; the *oracle sentence* chooses with the reference in hand, so it bounds what one extracted sentence "
            "can score rather than being a floor."
            if "oracle" in base
            else "."
        ),
        "",
        "| baseline | chosen on validation | ROUGE-1 | ROUGE-2 | ROUGE-L | own − shuffled ROUGE-L |",
        "|---|---|---|---|---|---|",
        *(
            f"| {n} | {c} | {b['test']['rouge1']:.2f} | {b['test']['rouge2']:.2f} | {b['test']['rougeL']:.2f} | "
            f"{_dependence_cell(b)} |"
            for n, c, b in rows
        ),
    ]
    # each entry's worst seed, against each floor on a line of its own: an entry can clear the constant (its outputs
    # carry something) and still trail lead-k
    worst = {
        f"`{entry}`": min((run["test"]["rougeL"] for run in rec["seeds"].values()), default=None)
        for entry, rec in data["entries"].items()
    }
    for name, floor in (("the constant", constant["test"]["rougeL"]), (f"lead-{lead['k']}", lead["test"]["rougeL"])):
        above = [e for e, w in worst.items() if w is not None and w > floor]
        below = [e for e in worst if e not in above]
        lines += [
            "",
            f"Above {name} (test ROUGE-L > {floor:.2f}) on every seed: {', '.join(above) or 'no entry'}; "
            f"not on every seed: {', '.join(below) or 'none'}.",
        ]
    return [*lines, ""]


__all__ = ["baselines_section", "outputs_section"]
