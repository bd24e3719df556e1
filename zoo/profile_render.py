"""Stored training-step profiles (zoo.step_profile) → one Markdown page: per profile, the variants' update times
side by side, where an update's time goes, and its matmuls against this machine's own matmul speed."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

PAGE = "PROFILE.md"


def write_profile(out: Path, name: str, result: dict[str, Any]) -> Path:
    """Store one profile as <out>/<name>.json (a rerun replaces it)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def _variants_table(p: dict[str, Any]) -> list[str]:
    tokens = p["tokens_per_update"]["median"]
    lines = [
        "| variant | overrides | s / update (median, p10–p90) | updates/s | target tokens/s | × first (median of "
        f"{p['rounds']} rounds, min–max) |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in p["variants"].items():
        s = v["seconds_per_update"]
        ratios = sorted(v["round_ratios"])
        median = statistics.median(ratios)
        overrides = " ".join(f"`{o}`" for o in v["overrides"]) or "—"
        lines.append(
            f"| {name} | {overrides} | {s['median']:.3f} ({s['p10']:.3f}–{s['p90']:.3f}) | {1 / s['median']:.2f} | "
            f"{tokens / s['median']:.0f} | {median:.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f}) |"
        )
    return lines


def _categories_table(p: dict[str, Any]) -> list[str]:
    names = list(p["variants"])
    first = p["variants"][names[0]]["profile"]
    categories = list(first["ms_per_update"])
    for name in names[1:]:
        categories += [c for c in p["variants"][name]["profile"]["ms_per_update"] if c not in categories]
    lines = [
        "| where the time goes (ms / profiled update) | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for c in categories:
        cells = []
        for name in names:
            prof = p["variants"][name]["profile"]
            ms = prof["ms_per_update"].get(c, 0.0)
            cells.append(f"{ms:.1f} ({100 * ms / prof['wall_ms_per_update']:.0f}%)")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    walls = [f"{p['variants'][n]['profile']['wall_ms_per_update']:.1f}" for n in names]
    unprofiled = [f"{1e3 * p['variants'][n]['seconds_per_update']['median']:.1f}" for n in names]
    lines.append("| **profiled update** | " + " | ".join(walls) + " |")
    lines.append("| unprofiled update (median) | " + " | ".join(unprofiled) + " |")
    return lines


def _matmul_lines(p: dict[str, Any]) -> list[str]:
    lines = []
    for name, v in p["variants"].items():
        mm = v["profile"]["matmul"]
        flops = mm["flops_per_update"]
        step_s = v["seconds_per_update"]["median"]
        lines.append(
            f"- **{name}**: {flops / 1e9:.1f} GFLOP of matmuls per update ({mm['calls_per_update']:.0f} calls, "
            f"{len(mm['shapes'])} shapes): {flops / step_s / 1e9:.1f} GFLOP/s over the whole update, "
            f"{flops / mm['kernel_ms_per_update'] / 1e6:.1f} GFLOP/s inside the matmul kernels, against "
            f"{flops / mm['roofline_ms_per_update'] / 1e6:.1f} GFLOP/s where torch.mm runs each shape alone "
            f"(the roofline: {mm['roofline_ms_per_update']:.0f} ms of the {1e3 * step_s:.0f} ms update)."
        )
    return lines


def render_profile(name: str, p: dict[str, Any]) -> list[str]:
    """One stored profile as a Markdown section."""
    machine = p["machine"]
    trainer = p["trainer"]
    return [
        f"## {name}: `{p['entry']}`",
        "",
        f"CPU {machine['cpu_model']} ({machine['cpu_signature']}), {machine['torch_threads']} torch threads, torch "
        f"{machine['torch']}, commit {p['git_sha'][:10]}. Trainer preset: max_tokens {trainer['max_tokens']}, "
        f"precision {trainer['precision']}; {p['warmup_updates']} warm-up updates, then {p['rounds']} rounds × "
        f"{p['updates_per_round']} updates per variant (order alternating), the same batches for every variant; "
        f"median {p['tokens_per_update']['median']:.0f} target tokens per update.",
        "",
        *_variants_table(p),
        "",
        *_categories_table(p),
        "",
        *_matmul_lines(p),
        "",
    ]


def render_profiles(out: Path) -> Path:
    """Render every <out>/*.json profile into <out>/PROFILE.md (sorted by name; a rerun rewrites it)."""
    sections = [
        "# Training-step profiles",
        "",
        "Rendered by `python -m zoo.step_profile` from the JSON files beside this page (the command of each is in "
        "README.md). Categories: zoo/profiling.py. Timings of different CPUs are never compared.",
        "",
    ]
    for path in sorted(out.glob("*.json")):
        sections += render_profile(path.stem, json.loads(path.read_text()))
    page = out / PAGE
    page.write_text("\n".join(sections))
    return page
