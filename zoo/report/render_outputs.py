"""REPORT.md's "do the outputs depend on the input?" table of a summarization suite (issue 64): per entry and seed,
distinct test outputs, the share of the most frequent one and the mean length against the references'. Summaries
of near-constant text scored above most models here, and the score table alone does not show it."""

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
    return [*lines, ""]


__all__ = ["outputs_section"]
