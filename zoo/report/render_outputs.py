"""REPORT.md's "do the outputs depend on the input?" table of a summarization suite (issue 64): per entry and seed,
distinct test outputs, the share of the most frequent one and the mean length against the references'; then the
baselines that cost nothing (constant, lead-k: zoo/report/baselines.py), scored at render time, and which entries beat
both on every seed. Summaries of near-constant text scored above most models here, and the score table alone does
not show it."""

from __future__ import annotations

from typing import Any

from zoo.report.claims import DEGENERATE_DISTINCT


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
        'outputs", not a verdict.',
        "",
        "| entry | distinct outputs | most frequent | mean words |",
        "|---|---|---|---|",
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
            + " |"
        )
    return [*lines, "", *baselines_section(data)]


def baselines_section(data: dict[str, Any]) -> list[str]:
    """The constant and lead-k rows and the entries above both on every seed (nothing without baselines.json.gz)."""
    base = data.get("baselines")
    if not base:
        return []
    constant, lead = base["constant"], base["lead"]
    rows = [
        ("constant", f"“{constant['text']}” (ROUGE-L {constant['valid_rougeL']:.2f})", constant["test"]),
        (f"lead-{lead['k']}", f"k = {lead['k']} of 1–40 (ROUGE-L {lead['valid_rougeL']:.2f})", lead["test"]),
    ]
    if "oracle" in base:  # an upper bound: shown for scale, not a floor entries must clear
        top = base["oracle"]
        words = f"the document's sentence closest to its own reference (mean {top['mean_words']:.1f} words)"
        rows.append(("oracle sentence (upper bound)", words, top["test"]))
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
        "| baseline | chosen on validation | ROUGE-1 | ROUGE-2 | ROUGE-L |",
        "|---|---|---|---|---|",
        *(f"| {n} | {c} | {t['rouge1']:.2f} | {t['rouge2']:.2f} | {t['rougeL']:.2f} |" for n, c, t in rows),
    ]
    lines.append("")
    floor = max(constant["test"]["rougeL"], lead["test"]["rougeL"])
    above, below = [], []
    for entry, rec in data["entries"].items():
        scores = [run["test"]["rougeL"] for run in rec["seeds"].values()]
        (above if scores and min(scores) > floor else below).append(f"`{entry}`")
    lines.append(
        f"Above both (test ROUGE-L > {floor:.2f}) on every seed: {', '.join(above) or 'no entry'}; "
        f"not on every seed: {', '.join(below) or 'none'}."
    )
    return [*lines, ""]


__all__ = ["baselines_section", "outputs_section"]
