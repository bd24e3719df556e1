"""Forward+backward time of every model entry's attention mechanism against plain `mha`, side by side.

    python -m zoo.attention_bench [--size small] [--batch-sentences 64] [--src-len 30] [--tgt-len 30]
        [--modes self,causal,cross] [--entries a,b,…] [--steps 20] [--warmup 3] [--threads N] [--json out.json]

Why: a mechanism that is much slower than the baseline per attention call makes every comparison in
the zoo expensive; this shows where each one stands, measured in one run under the same load.

What is timed: for each entry of conf/model (composed with Hydra's Compose API at the chosen size
preset, so whatever entries exist when it runs), its attention modules are built with
`zoo.attention.build_attention` from the entry's own attention key, heads, head size and options at
the preset's d_model — one module per mode, as in a model layer: "self" (encoder self-attention over
the padded source), "causal" (decoder self-attention over the target) and "cross" (target queries over
the padded source). One step = forward of every mode, backward of a fixed random output gradient
(plus the module's `extra_loss()` if it has one), zero_grad. The baseline row is `mha` with
`--baseline-heads` heads of size d_model/heads (the `transformer` entry's configuration, our fused
SDPA path). Registry keys no entry uses get a row with default options.

Measurement (zoo/DESIGN.md §3c): warm-up steps, then timed steps interleaved across all candidates (the
order rotates every round so none always runs first), medians (p10/p90) per candidate, and the ratio
of medians to the mha baseline; variants slower than `--flag-ratio` (2×) are flagged. A candidate that
fails to build or run is reported with its error and does not stop the others. On a machine shared
with other jobs use `--threads 1`: oversubscribed intra-op threads make medians swing by 2× or more.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf  # importing zoo.* registered the ${div:…} resolver entries may use
from torch import Tensor

from zoo.attention import ATTENTION_REGISTRY, Attention, build_attention
from zoo.entries import CONF_DIR, list_entries

MODES = ("self", "causal", "cross")
BASELINE = "mha (baseline)"


@dataclass
class Candidate:
    """One benchmarked row: an entry's attention configuration (or the baseline / a bare registry key)."""

    label: str
    key: str
    num_heads: int
    head_dim: int | None
    options: dict[str, Any] = field(default_factory=dict)
    dropout: float = 0.0
    error: str | None = None


def entry_candidates(size: str, entries: list[str] | None = None) -> tuple[int, list[Candidate]]:
    """(d_model, one Candidate per conf/model entry) composed like `zoo.train +model=<entry> size=<size>`."""
    names = entries or list_entries()
    found: list[Candidate] = []
    d_model = 0
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in names:
            try:
                cfg = compose(config_name="train", overrides=[f"+model={name}", f"size={size}"])
                m = OmegaConf.to_container(cfg.model, resolve=True)
                d_model = int(m["d_model"])
                found.append(
                    Candidate(
                        name,
                        m["attention"],
                        int(m["num_heads"]),
                        m.get("head_dim"),
                        dict(m.get("attention_options") or {}),
                        float(m.get("attention_dropout", 0.0)),
                    )
                )
            except Exception as exc:  # a half-written entry must not stop the benchmark
                found.append(Candidate(name, "?", 0, None, error=f"{type(exc).__name__}: {exc}"))
    if not d_model:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            d_model = int(compose(config_name="train", overrides=[f"size={size}"]).model.d_model)
    return d_model, found


def all_candidates(size: str, entries: list[str] | None, baseline_heads: int) -> tuple[int, list[Candidate]]:
    """Baseline first, then every entry, then registry keys that no selected entry uses."""
    d_model, found = entry_candidates(size, entries)
    rows = [Candidate(BASELINE, "mha", baseline_heads, None), *found]
    if entries is None:
        used = {c.key for c in found}
        rows += [
            Candidate(f"{key} (default options)", key, baseline_heads, None)
            for key in ATTENTION_REGISTRY
            if key not in used
        ]
    return d_model, rows


def make_inputs(
    batch: int, src_len: int, tgt_len: int, d_model: int, min_len_frac: float, seed: int
) -> dict[str, Tensor]:
    """Random source/target streams [B, L, D] and a source padding mask [B, S] (True = padding; lengths
    uniform in [min_len_frac·S, S], one full-length row, as a length-bucketed batch)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, math.ceil(min_len_frac * src_len)), src_len + 1, (batch,), generator=g)
    lengths[0] = src_len
    return {
        "src": torch.randn(batch, src_len, d_model, generator=g),
        "tgt": torch.randn(batch, tgt_len, d_model, generator=g),
        "src_pad": torch.arange(src_len)[None, :] >= lengths[:, None],
    }


def make_step(
    c: Candidate, d_model: int, modes: tuple[str, ...], data: dict[str, Tensor], seed: int
) -> tuple[Callable[[], None], int, int]:
    """(one forward+backward step over `modes`, attention parameters per module, head_dim)."""
    torch.manual_seed(seed)
    modules: dict[str, Attention] = {
        mode: build_attention(c.key, d_model, c.num_heads, head_dim=c.head_dim, dropout=c.dropout, **c.options).train()
        for mode in modes
    }
    g = torch.Generator().manual_seed(seed + 1)
    grads = {mode: torch.randn((data["src"] if mode == "self" else data["tgt"]).shape, generator=g) for mode in modes}

    def run(mode: str, m: Attention) -> Tensor:
        if mode == "self":
            return m(data["src"], key_padding_mask=data["src_pad"])
        if mode == "causal":
            return m(data["tgt"], causal=True)
        return m(data["tgt"], data["src"], key_padding_mask=data["src_pad"])

    def step() -> None:
        total: Tensor | None = None
        for mode, m in modules.items():
            out = run(mode, m)  # [B, T, D]
            term = (out * grads[mode]).sum()  # backward of a fixed output gradient
            extra = m.extra_loss()
            if extra is not None:
                term = term + extra
            total = term if total is None else total + term
        assert total is not None
        total.backward()
        for m in modules.values():
            m.zero_grad(set_to_none=True)

    first = next(iter(modules.values()))
    return step, sum(p.numel() for p in first.parameters()), first.head_dim


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Build every candidate, warm up, time interleaved steps; returns the result dict (also JSON).
    torch's thread count is restored afterwards, so an in-process caller keeps its own."""
    before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run_benchmark(args)
    finally:
        torch.set_num_threads(before)


def _run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    entries = [e.strip() for e in args.entries.split(",") if e.strip()] if args.entries else None
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    d_model, candidates = all_candidates(args.size, entries, args.baseline_heads)
    data = make_inputs(args.batch_sentences, args.src_len, args.tgt_len, d_model, args.min_len_frac, args.seed)
    steps: dict[str, Callable[[], None]] = {}
    info: dict[str, dict[str, Any]] = {}
    for c in candidates:
        row: dict[str, Any] = {"key": c.key, "num_heads": c.num_heads, "head_dim": c.head_dim, "options": c.options}
        if c.error is None:
            try:
                step, params, head_dim = make_step(c, d_model, modes, data, args.seed)
                for _ in range(args.warmup):
                    step()
                steps[c.label] = step
                row.update(params=params, head_dim=head_dim)
            except Exception as exc:  # report and continue with the others
                c.error = f"{type(exc).__name__}: {exc}"
        if c.error is not None:
            row["error"] = c.error
        info[c.label] = row
    times: dict[str, list[float]] = {label: [] for label in steps}
    order = list(steps)
    for i in range(args.steps):
        shift = i % max(len(order), 1)
        for label in order[shift:] + order[:shift]:  # interleaved, rotating start
            start = time.perf_counter()
            steps[label]()
            times[label].append(time.perf_counter() - start)
    base = statistics.median(times[BASELINE]) if times.get(BASELINE) else float("nan")
    for label, ts in times.items():
        ms = sorted(1000 * t for t in ts)
        median = statistics.median(ms)
        info[label].update(
            median_ms=median,
            p10_ms=ms[int(0.1 * (len(ms) - 1))],
            p90_ms=ms[math.ceil(0.9 * (len(ms) - 1))],
            ratio=median / (1000 * base),
            step_ms=ms,
        )
        r = info[label]
        r["slow"] = r["ratio"] > args.flag_ratio
        # a wider attention (more heads x head size than the baseline's) costs proportionally more: that
        # is the variant's design (fixed head size), not an inefficiency, so the table states it as the reason
        width = r.get("num_heads", 0) * r.get("head_dim", 0)
        base_width = info[BASELINE].get("num_heads", 0) * info[BASELINE].get("head_dim", 0)
        r["width_ratio"] = width / base_width if base_width else float("nan")
        r["ratio_per_width"] = r["ratio"] / r["width_ratio"] if r["width_ratio"] else float("nan")
        r["slow_reason"] = slow_reason(r["ratio"], r["width_ratio"], args.flag_ratio)
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "d_model": d_model,
        "modes": list(modes),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "src_pad_fraction": float(data["src_pad"].float().mean()),
        "rows": info,
    }


def slow_reason(ratio: float, width_ratio: float, flag_ratio: float) -> str:
    """Why a variant over the flag is slower, when its attention width explains it (else "")."""
    if ratio <= flag_ratio or not width_ratio or ratio / width_ratio > flag_ratio:
        return ""
    return f"attention width {width_ratio:g}× mha's: {ratio / width_ratio:.2f}× per unit of width"


def format_table(result: dict[str, Any]) -> str:
    """Side-by-side table of `run_benchmark`'s result, slow variants flagged."""
    c = result["config"]
    lines = [
        f"attention fwd+bwd per batch: size={c['size']} (d_model {result['d_model']}), modes "
        f"{'+'.join(result['modes'])}, batch {c['batch_sentences']} × src {c['src_len']} / tgt {c['tgt_len']} "
        f"(src pad {result['src_pad_fraction']:.0%}), threads {result['threads']}, torch {result['torch_version']}",
        f"{c['warmup']} warm-up + {c['steps']} timed steps each, interleaved; ratio = median / mha median",
        "",
        f"{'entry':<26}{'mechanism':<10}{'heads×dh':>10}{'params':>10}{'median ms':>11}{'p10':>8}{'p90':>8}"
        f"{'ratio':>8}",
    ]
    for label, r in result["rows"].items():
        if "error" in r:
            lines.append(f"{label:<26}{r['key']:<10}  ERROR {r['error']}")
            continue
        shape = f"{r['num_heads']}×{r['head_dim']}"
        flag = f"  SLOWER THAN {c['flag_ratio']:g}× mha" if r["slow"] else ""
        if r.get("slow_reason"):
            flag += f" (reason: {r['slow_reason']})"
        lines.append(
            f"{label:<26}{r['key']:<10}{shape:>10}{r['params']:>10,}{r['median_ms']:>11.2f}"
            f"{r['p10_ms']:>8.2f}{r['p90_ms']:>8.2f}{r['ratio']:>8.2f}{flag}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (argparse, like zoo.bench: numeric flags, no config tree of its own)."""
    p = argparse.ArgumentParser(prog="python -m zoo.attention_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small", help="size preset of conf/size/ giving d_model")
    p.add_argument(
        "--entries",
        default="",
        help="comma-separated entries (default: every conf/model entry plus unused registry keys)",
    )
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of self,causal,cross")
    p.add_argument("--baseline-heads", type=int, default=8)
    p.add_argument("--batch-sentences", type=int, default=64)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--min-len-frac", type=float, default=0.7, help="shortest source as a fraction of the width")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--flag-ratio", type=float, default=2.0, help="flag variants slower than this × mha")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="write the full result here")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    bad = {m.strip() for m in args.modes.split(",") if m.strip()} - set(MODES)
    if bad or not args.modes.strip():
        p.error(f"--modes takes a non-empty subset of {','.join(MODES)}; got {args.modes!r}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run, print the table, write JSON if asked."""
    args = parse_args(argv)
    result = run_benchmark(args)
    print(format_table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
