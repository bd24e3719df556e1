"""What the runs behind a verdict were, beside the verdict (zoo/report/claims.py): the budget they trained for,
whether they were still climbing, whether each seed's pair ran on one CPU model and commit, whether their outputs
depend on the input at all, and how compact GHT's trained groups were. Kept apart from the statistics of the rule:
these describe runs, they decide nothing but the words beside a verdict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CLIMBING_GAIN = 0.5  # validation BLEU gained over the last 20% of updates that counts as still climbing …
CLIMBING_LOSS_FALL = 0.05  # … or validation loss fallen over the last quarter, nats per token (≈ 5% perplexity)
COMPACT_SILHOUETTE = 0.25  # mean silhouette of the trained groups from which they read "compact"
DEGENERATE_DISTINCT = 0.02  # a run with fewer distinct test outputs than this share of its documents is near-constant


def climbing(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many of a comparison's runs were still climbing — their validation loss still fell by
    CLIMBING_LOSS_FALL over their last quarter of updates, or their validation quality rose by CLIMBING_GAIN over
    their last 20% — and the largest of each. The loss is read on the whole validation split, the quality on a
    small greedy sample, which can stall while the model still learns (issue 86)."""
    states = [r["convergence"] for r in runs if r.get("convergence")]
    gains = [c["last20_gain"] for c in states]
    falls = [c["last25_loss_fall"] for c in states if c.get("last25_loss_fall") is not None]
    up = [
        c
        for c in states
        if c["last20_gain"] >= CLIMBING_GAIN or (c.get("last25_loss_fall") or 0.0) >= CLIMBING_LOSS_FALL
    ]
    return {
        "runs": len(states),
        "climbing": len(up),
        "max_gain": max(gains) if gains else None,
        "max_loss_fall": max(falls) if falls else None,
    }


def budget_words(state: Mapping[str, Any]) -> str:
    """ "1200 updates ≈ 1.07 epochs" (the epochs only where an epoch's length is known; a range over runs)."""
    if not state.get("updates"):
        return "—"
    epochs = f" ≈ {_span(state['epochs'], '.2f')} epochs" if state.get("epochs") else ""
    return f"{_span(state['updates'], 'd')} updates{epochs}"


def climbing_words(state: Mapping[str, Any], validation: str) -> str:
    """ "3 of 6 runs still climbing (validation loss down up to 0.19 nats over the last quarter; ROUGE-L up to
    +2.2 over the last 20%)"."""
    parts = []
    if state.get("max_loss_fall") is not None:
        parts.append(f"validation loss down up to {state['max_loss_fall']:.2f} nats over the last quarter")
    if state.get("max_gain") is not None:
        parts.append(f"{validation} up to {state['max_gain']:+.1f} over the last 20%")
    return f"{state['climbing']} of {state['runs']} runs still climbing ({'; '.join(parts)})"


def _span(values: Sequence[float], fmt: str) -> str:
    lo, hi = values
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def same_machine(a: str, b: str) -> bool | None:
    """Whether two records' machine classes name one CPU model: True, False, or None where one record predates the
    CPU signature ("cpu:AMD EPYC" beside "cpu:AMD EPYC (family 25 model 1, AVX2)": same vendor, model unrecorded)."""
    if a == b:
        return True
    shorter, longer = sorted((a, b), key=len)
    return None if longer.startswith(shorter + " (") else False


def pairing(pairs: Sequence[tuple[int, Mapping[str, Any], Mapping[str, Any]]]) -> dict[str, Any]:
    """Whether a claim's seed pairs (seed, system run, baseline run) ran on one CPU model and at one commit: the
    paired design controls machine and code only where they did (issue 86). The seeds of each kind, and for pairs
    across CPUs, the two machines."""
    cpu = {seed: same_machine(str(a.get("machine", "")), str(b.get("machine", ""))) for seed, a, b in pairs}
    return {
        "pairs": len(pairs),
        "across_cpus": {
            seed: [str(a.get("machine", "")), str(b.get("machine", ""))] for seed, a, b in pairs if cpu[seed] is False
        },
        "cpu_unrecorded": [seed for seed in cpu if cpu[seed] is None],
        "across_commits": [seed for seed, a, b in pairs if a.get("git_sha") != b.get("git_sha")],
    }


def pairing_text(p: Mapping[str, Any]) -> str:
    """'pairs on one CPU model: 1 of 3 (seeds 2, 3: Intel Xeon (…) vs AMD EPYC (…)); at one commit: 0 of 3'."""
    n = p["pairs"]
    across = p["across_cpus"]
    same = n - len(across) - len(p["cpu_unrecorded"])
    text = f"pairs on one CPU model: {same} of {n}"
    details = []
    if across:
        machines = {tuple(m) for m in across.values()}
        shown_ = "; ".join(f"{a.removeprefix('cpu:')} vs {b.removeprefix('cpu:')}" for a, b in sorted(machines))
        details.append(f"seed{'s' if len(across) > 1 else ''} {', '.join(map(str, across))} across CPUs: {shown_}")
    if p["cpu_unrecorded"]:
        unrecorded = p["cpu_unrecorded"]
        details.append(
            f"seed{'s' if len(unrecorded) > 1 else ''} {', '.join(map(str, unrecorded))}: a CPU model unrecorded"
        )
    if details:
        text += f" ({'; '.join(details)})"
    return f"{text}; at one commit: {n - len(p['across_commits'])} of {n}"


def degenerate_outputs(sides: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> str | None:
    """'degenerate outputs (`ght_summ`: 5, 1, 13 distinct of 1492; …)' when any run of either side gives fewer
    distinct test outputs than DEGENERATE_DISTINCT of its documents, or does not score above the suite's constant
    summary beyond its 95% interval over documents (issue 86: runs with 181–193 distinct outputs scored within
    +0.06–0.18 of the constant string) — output whose score differences say nothing about the claim — else None."""
    parts = []
    for name, runs in sides:
        stats = [r["outputs"] for r in runs if r.get("outputs") and r["outputs"]["documents"]]
        if any(o["distinct"] < DEGENERATE_DISTINCT * o["documents"] for o in stats):
            distinct = ", ".join(str(o["distinct"]) for o in stats)
            parts.append(f"`{name}`: {distinct} distinct of {stats[0]['documents']}")
            continue
        floors = [r["above_constant"] for r in runs if r.get("above_constant")]
        if any(f["gain"] - f["ci95"] <= 0 for f in floors):
            shown = ", ".join(f"{f['gain']:+.2f} ± {f['ci95']:.2f}" for f in floors)
            parts.append(f"`{name}`: {shown} over the constant summary")
    if not parts:
        return None
    return (
        f"degenerate outputs ({'; '.join(parts)}; near-constant below {DEGENERATE_DISTINCT:.0%} distinct, or not "
        "above the constant summary beyond its 95% interval)"
    )


def compaction(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The diagnostic beside a GHT / GHT-PS verdict: over the comparison's runs that trained groups, the range of
    the last check's mean silhouette and intra-group cos (at the vote for GHT-PS, at the end for GHT), which
    partition they describe (`trained`; records before issue 62: the probe batch's own k-means) and how many
    runs read compact. None when no run trained groups."""
    grouped = [r["compactness"] for r in runs if r.get("compactness")]
    if not grouped:
        return None
    sil = [c["after"]["silhouette"] for c in grouped]
    intra = [c["after"]["intra_cos"] for c in grouped]
    kinds = sorted({c.get("partition", "probe") for c in grouped})
    return {
        "runs": len(grouped),
        "silhouette": (min(sil), max(sil)),
        "intra_cos": (min(intra), max(intra)),
        "compact": sum(v >= COMPACT_SILHOUETTE for v in sil),
        "partition": "/".join(kinds),
        "at_vote": any(r.get("voting") and r["voting"].get("step") is not None for r in runs),
    }


def compaction_text(d: Mapping[str, Any]) -> str:
    """'groups at the vote: silhouette 0.01–0.05, intra cos 0.49–0.50 (trained partition), compact in 0 of 3 runs'."""

    def span(lo: float, hi: float) -> str:
        return f"{lo:.2f}" + (f"–{hi:.2f}" if f"{hi:.2f}" != f"{lo:.2f}" else "")

    where = "at the vote" if d["at_vote"] else "at the end"
    return (
        f"groups {where}: silhouette {span(*d['silhouette'])}, intra cos {span(*d['intra_cos'])} "
        f"({d['partition']} partition), compact (≥ {COMPACT_SILHOUETTE}) in {d['compact']} of {d['runs']} runs"
    )


def budget(runs: Sequence[Mapping[str, Any]], epoch_batches: float | None) -> dict[str, Any]:
    """The comparison's updates (min, max over its runs) and, where an epoch's length is known, epochs."""
    updates = sorted(int(r["updates"]) for r in runs)
    batches = sorted(int(r["updates"]) * int(r.get("update_freq") or 1) for r in runs)
    return {
        "updates": [updates[0], updates[-1]] if updates else None,
        "epochs": [round(b / epoch_batches, 2) for b in (batches[0], batches[-1])] if epoch_batches and runs else None,
    }
