"""Training-step speed of our `Transformer` against `torch.nn.Transformer` doing the same work.

    python -m zoo.bench --d-model 256 --layers 3 --heads 8 --ffn 1024 --batch-sentences 64 \
        --src-len 30 --tgt-len 30 --vocab 8000 --steps 20 --warmup 3 [--threads N] [--json out.json]

Why: the zoo's pluggable attention contract (per-head gate, separate q/k/v projections, capture
hooks) must not make plain MHA training noticeably slower than torch's own implementation; the
issue's target is ours/torch ≤ 1.25 in median step time.

What one step is, identically for both models: forward of one batch (post-norm encoder-decoder,
dropout p on embeddings/residuals/attention weights/FFN activations as nn.Transformer applies it),
label-smoothed cross-entropy over non-pad targets, backward, Adam step, zero_grad. Both models get
the same token tensors, the same src padding pattern (lengths drawn in [min_len_frac·L, L], padding
at the end), the same masks (source/memory key padding + causal self-attention; target padding is
only excluded from the loss, as in fairseq), separate source/target embeddings ×√D plus sinusoidal
positions, and an output projection tied to the target embedding. nn.Transformer's final encoder/
decoder LayerNorms (which a post-norm model does not have) are removed so the work is equal.

Measurement (zoo/DESIGN.md §3c): warm-up steps for both, then steps interleaved A, B, A, B, … so drift
(thermal, other load) hits both alike; medians (and p10/p90) of per-step wall time are reported.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from zoo.attention import causal_mask
from zoo.model import ModelConfig, Transformer, build_model, count_parameters, sinusoidal_positions
from zoo.training.threads import wait_policy

PAD, BOS, EOS = 0, 2, 3
TARGET_RATIO = 1.25


class TorchSeq2Seq(nn.Module):
    """`nn.Transformer` wrapped with the same embeddings, positions and tied output as ours."""

    def __init__(
        self, vocab: int, d_model: int, layers: int, heads: int, ffn: int, dropout: float, max_positions: int = 1024
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.dropout = dropout
        self.src_embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
        for emb in (self.src_embed, self.tgt_embed):
            nn.init.normal_(emb.weight, 0, d_model**-0.5)
            nn.init.zeros_(emb.weight[PAD])
        self.transformer = nn.Transformer(
            d_model,
            heads,
            layers,
            layers,
            ffn,
            dropout,
            activation="relu",
            batch_first=True,
            norm_first=False,
        )
        # post-norm layers already end in a LayerNorm; nn.Transformer's extra final norms would be extra work
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        self.register_buffer("positions", sinusoidal_positions(max_positions, d_model), persistent=False)
        # [P, P] True above the diagonal = may not attend (built once, sliced per batch)
        causal = ~causal_mask(max_positions, max_positions)
        self.register_buffer("causal", causal, persistent=False)

    def _embed(self, emb: nn.Embedding, tokens: Tensor) -> Tensor:
        # tokens [B, T] -> [B, T, D]
        x = emb(tokens) * math.sqrt(self.d_model) + self.positions[: tokens.shape[1]]
        return F.dropout(x, self.dropout, self.training)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V]."""
        src_pad = src.eq(PAD)  # [B, S] True at padding
        t = tgt_in.shape[1]
        y = self.transformer(
            self._embed(self.src_embed, src),
            self._embed(self.tgt_embed, tgt_in),
            tgt_mask=self.causal[:t, :t],
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )  # [B, T, D]
        return y @ self.tgt_embed.weight.t()  # [B, T, V]


def make_batch(
    sentences: int, src_len: int, tgt_len: int, vocab: int, min_len_frac: float, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(src [B, S], tgt_in [B, T], tgt_out [B, T]) with random tokens and end padding.

    Lengths are uniform in [min_len_frac·L, L] per sentence: what a length-bucketed batch looks
    like (a max-length sentence always present, so the padded width is exactly L)."""
    gen = torch.Generator().manual_seed(seed)

    def lengths(full: int) -> Tensor:
        low = max(1, math.ceil(min_len_frac * full))
        n = torch.randint(low, full + 1, (sentences,), generator=gen)
        n[0] = full
        return n

    src = torch.randint(EOS + 1, vocab, (sentences, src_len), generator=gen)
    src[torch.arange(src_len)[None, :] >= lengths(src_len)[:, None]] = PAD
    # target sentence y_1..y_n (last = EOS); decoder input BOS y_1..y_{n-1}; targets y_1..y_n
    tgt_n = lengths(tgt_len)
    words = torch.randint(EOS + 1, vocab, (sentences, tgt_len), generator=gen)
    pos = torch.arange(tgt_len)[None, :]
    tgt_out = torch.where(pos < tgt_n[:, None] - 1, words, torch.full_like(words, EOS))
    tgt_out[pos >= tgt_n[:, None]] = PAD
    tgt_in = torch.cat([torch.full((sentences, 1), BOS), tgt_out[:, :-1]], dim=1)
    tgt_in[pos >= tgt_n[:, None]] = PAD
    return src, tgt_in, tgt_out


def make_step(
    model: nn.Module,
    src: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    label_smoothing: float,
    lr: float = 5e-4,
    precision: str = "fp32",
) -> Callable[[], float]:
    """A closure doing one full training step; returns the loss (a sync point on CPU anyway). `precision`
    bf16 runs the forward pass under CPU autocast, as `trainer.precision=bf16` does."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-8)
    ntokens = int(tgt_out.ne(PAD).sum())

    def forward() -> Tensor:
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(src, tgt_in).float()  # [B, T, V]
        return model(src, tgt_in)  # [B, T, V]

    def step() -> float:
        logits = forward()  # [B, T, V]
        loss = (
            F.cross_entropy(
                logits.flatten(0, 1),
                tgt_out.flatten(),
                ignore_index=PAD,
                label_smoothing=label_smoothing,
                reduction="sum",
            )
            / ntokens
        )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def _summary(times: list[float], tokens: int, params: int) -> dict[str, Any]:
    ms = sorted(1000 * t for t in times)
    median = statistics.median(ms)
    return {
        "median_ms": median,
        "p10_ms": ms[int(0.1 * (len(ms) - 1))],
        "p90_ms": ms[math.ceil(0.9 * (len(ms) - 1))],
        "tgt_tokens_per_s": tokens / (median / 1000),
        "params": params,
        "step_ms": [1000 * t for t in times],
    }


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Build both models, warm up, time interleaved steps; returns the result dict (also JSON)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = ModelConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        num_heads=args.heads,
        ffn_dim=args.ffn,
        dropout=args.dropout,
        attention_dropout=args.dropout,
        activation_dropout=args.dropout,
        pre_norm=False,
        share_decoder_embeddings=True,
        max_positions=max(args.src_len, args.tgt_len, 1024),
        pad_id=PAD,
        bos_id=BOS,
        eos_id=EOS,
    )
    ours: Transformer = build_model(cfg).train()
    torch.manual_seed(args.seed)
    ref = TorchSeq2Seq(args.vocab, args.d_model, args.layers, args.heads, args.ffn, args.dropout).train()
    src, tgt_in, tgt_out = make_batch(
        args.batch_sentences, args.src_len, args.tgt_len, args.vocab, args.min_len_frac, args.seed
    )
    tokens = int(tgt_out.ne(PAD).sum())
    steps = {
        "ours": make_step(ours, src, tgt_in, tgt_out, args.label_smoothing, precision=args.precision),
        "torch": make_step(ref, src, tgt_in, tgt_out, args.label_smoothing, precision=args.precision),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(args.warmup + args.steps):
        for name, step in steps.items():  # interleaved: ours, torch, ours, torch, …
            start = time.perf_counter()
            step()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - start)
    result = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "profile")},
        "threads": torch.get_num_threads(),
        "openmp_wait": wait_policy(),
        "torch_version": torch.__version__,
        "tgt_tokens_per_batch": tokens,
        "src_pad_fraction": float(src.eq(PAD).float().mean()),
        "ours": _summary(times["ours"], tokens, count_parameters(ours)),
        "torch": _summary(times["torch"], tokens, count_parameters(ref)),
    }
    result["ratio"] = result["ours"]["median_ms"] / result["torch"]["median_ms"]
    result["target_ratio"] = TARGET_RATIO
    result["meets_target"] = result["ratio"] <= TARGET_RATIO
    if args.profile:
        result["profile"] = {name: _profile(step, args.profile) for name, step in steps.items()}
    return result


def _profile(step: Callable[[], float], n: int) -> str:
    """Operator table (self CPU time) over n steps, to see where a slowdown comes from."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)


def format_table(result: dict[str, Any]) -> str:
    """Human-readable side-by-side table of `run_benchmark`'s result."""
    c = result["config"]
    lines = [
        f"train step: d_model {c['d_model']}, {c['layers']}+{c['layers']} layers, {c['heads']} heads, "
        f"ffn {c['ffn']}, vocab {c['vocab']}, batch {c['batch_sentences']} × src {c['src_len']} / tgt "
        f"{c['tgt_len']} ({result['tgt_tokens_per_batch']} tgt tokens, src pad {result['src_pad_fraction']:.0%}), "
        f"dropout {c['dropout']}, label smoothing {c['label_smoothing']}, {c.get('precision', 'fp32')}, "
        f"threads {result['threads']} (OpenMP wait {result['openmp_wait']}), "
        f"torch {result['torch_version']}",
        f"{c['warmup']} warm-up + {c['steps']} timed steps each, interleaved",
        "",
        f"{'model':<22}{'params':>12}{'median ms':>12}{'p10 ms':>10}{'p90 ms':>10}{'tgt tok/s':>12}",
    ]
    for name, label in (("ours", "ours (zoo.model)"), ("torch", "torch.nn.Transformer")):
        r = result[name]
        lines.append(
            f"{label:<22}{r['params']:>12,}{r['median_ms']:>12.1f}{r['p10_ms']:>10.1f}"
            f"{r['p90_ms']:>10.1f}{r['tgt_tokens_per_s']:>12,.0f}"
        )
    verdict = "meets" if result["meets_target"] else "MISSES"
    lines.append(
        f"\nratio ours/torch (median step time): {result['ratio']:.3f}  ({verdict} target ≤ {result['target_ratio']})"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (argparse: a benchmark with plain numeric flags, no config tree)."""
    p = argparse.ArgumentParser(prog="python -m zoo.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="encoder layers = decoder layers")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--batch-sentences", type=int, default=64)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--min-len-frac", type=float, default=0.7, help="shortest sentence as a fraction of the width")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    p.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: forward under CPU autocast (both models)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="also profile N steps of each model")
    p.add_argument("--json", type=Path, default=None, help="write the full result here")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run, print the table (and profiles), write JSON if asked."""
    args = parse_args(argv)
    result = run_benchmark(args)
    print(format_table(result))
    for name, table in result.get("profile", {}).items():
        print(f"\n--- profile: {name} ({args.profile} steps) ---\n{table}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
