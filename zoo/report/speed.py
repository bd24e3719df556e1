"""Sentences/s and peak memory of one engine (PyTorch generator or the ONNX Runtime export) in its own process.

`python -m zoo.report.speed --engine torch|ort --model <checkpoint .pt | export dir> --texts <file> ...`
prints and writes one JSON record. One process per engine, so `peak_rss_mb` (the process's maximum resident
set) belongs to that engine alone; the ORT engine never imports torch. Both engines decode the same
sentences, sorted by length and cut into batches of `--batch`, with the same search settings and threads;
one batch is decoded untimed first (allocator and session warm-up).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Generator = Callable[[list[list[int]]], list[list[int]]]  # token ids per sentence → output ids per sentence


def _torch_engine(model_path: str, threads: int | None, search: dict[str, Any]) -> tuple[Generator, Callable]:
    # imported here: one process per engine, so the ORT engine's peak RSS must not include torch
    import torch

    from zoo.checkpoint import load_checkpoint, model_from_checkpoint
    from zoo.data import Tokenizer
    from zoo.evaluation import encode_sources
    from zoo.generate import Search, generate

    if threads:
        torch.set_num_threads(threads)
    payload = load_checkpoint(model_path)
    model = model_from_checkpoint(payload).eval()
    tokenizer = Tokenizer.from_bytes(payload["tokenizer"])
    cfg = Search(**search)

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return encode_sources(tokenizer, texts, model.cfg.max_positions)

    def run(batch: list[list[int]]) -> list[list[int]]:
        src = torch.full((len(batch), max(len(b) for b in batch)), model.cfg.pad_id, dtype=torch.long)
        for row, ids in enumerate(batch):
            src[row, : len(ids)] = torch.tensor(ids)
        return generate(model, src, cfg)

    return run, encode


def _ort_engine(export_dir: str, threads: int | None, search: dict[str, Any]) -> tuple[Generator, Callable]:
    import export  # imported here: the torch engine's process must not load onnxruntime (peak RSS per engine)

    exported = export.load(export_dir, threads=threads)
    settings = export.Search(**search)

    def run(batch: list[list[int]]) -> list[list[int]]:
        return exported.generate(exported.pad(batch), settings)

    return run, exported.encode_texts


def measure(run: Generator, encoded: list[list[int]], batch: int) -> dict[str, Any]:
    """Decode every sentence once (length-sorted batches) after one untimed warm-up batch."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    batches = [[encoded[i] for i in order[j : j + batch]] for j in range(0, len(order), batch)]
    run(batches[0])
    start = time.perf_counter()
    out_tokens = 0
    for b in batches:
        out_tokens += sum(len(h) + 1 for h in run(b))  # + eos
    seconds = time.perf_counter() - start
    return {
        "sentences": len(encoded),
        "seconds": round(seconds, 3),
        "sentences_per_s": round(len(encoded) / seconds, 2),
        "output_tokens": out_tokens,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.report.speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("torch", "ort"), required=True)
    parser.add_argument("--model", required=True, help="checkpoint .pt (torch) or export directory (ort)")
    parser.add_argument("--texts", required=True, help="source sentences, one per line")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--max-len-a", type=float, default=1.2)
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: the library's)")
    parser.add_argument("--out", help="also write the JSON record here")
    args = parser.parse_args(argv)
    texts = [line.rstrip("\n") for line in Path(args.texts).read_text(encoding="utf-8").splitlines()]
    if not texts:
        parser.error(f"--texts {args.texts} has no lines")
    search = {"beam_size": args.beam_size, "max_len_a": args.max_len_a, "max_len_b": args.max_len_b}
    make = _torch_engine if args.engine == "torch" else _ort_engine
    run, encode = make(args.model, args.threads, search)
    record = {
        "engine": args.engine,
        "batch": args.batch,
        "threads": args.threads,
        **search,
        **measure(run, encode(texts), args.batch),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    line = json.dumps(record)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
