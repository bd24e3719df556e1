"""Sentences/s and peak memory of one export decoding one workload, in its own process.

`python -m zoo.report.speed --model <export dir> --texts <file> --lengths <file.json> --batch 32 --beam-size 5`
prints (and with --out writes) one JSON line. One process per measurement, so `peak_rss_mb` (the process's
peak resident set, VmHWM) belongs to that model alone; it never imports torch (nor zoo). Every sentence is decoded
to exactly its forced length (`--lengths`: output tokens per sentence — the speed stage gives every entry the suite
baseline's hypothesis lengths) capped by the search's own length limit (`--max-len-a/--max-len-b`), in
length-sorted batches of `--batch`, after one untimed warm-up batch (allocator and session warm-up). The record
names the decoded lengths by their digest (`lengths_sha256`), so the stage can check that every entry it compares
did the same work.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import export
from export.bench.rss_probe import vm_hwm
from export.runtime.generation import best_tokens, padded, search_batch
from export.runtime.search import Search


def workload_lengths(max_positions: int, encoded: list[list[int]], lengths: Sequence[int], search: Search) -> list[int]:
    """Each sentence's forced output tokens: its given length, at most what the search's limit lets it emit
    (a model's position limit enters only through `max_positions`, so equal limits give equal work)."""
    limits = export.runtime.max_lengths(np.array([len(e) for e in encoded]), search, max_positions)
    return [min(int(n), int(limit) - 1) for n, limit in zip(lengths, limits, strict=True)]


def lengths_digest(lengths: Sequence[int]) -> str:
    """Names a list of forced lengths: two measurements with the same digest decoded the same work."""
    return hashlib.sha256(json.dumps([int(n) for n in lengths]).encode()).hexdigest()[:16]


def cache_bytes(caches: Sequence[dict[str, Any]], steps: int, src_len: int) -> int:
    """Bytes of one hypothesis's decoder caches (the manifest's `caches`) after `steps` decoder positions over a source
    of `src_len` tokens: each tensor's fixed axes times its position axis, at its dtype — what GQA / MQA shrink."""
    sizes = {"batch": 1, "sources": 1, "steps": steps, "src_len": src_len}
    return sum(math.prod(sizes.get(d, d) for d in c["shape"]) * np.dtype(c["dtype"]).itemsize for c in caches)


def measure(
    model: export.ExportedModel, encoded: list[list[int]], lengths: list[int], search: Search, batch: int
) -> dict[str, Any]:
    """Decode every sentence once to its forced length (length-sorted batches) after one untimed warm-up batch;
    checks that every output has its forced length."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    batches = [order[j : j + batch] for j in range(0, len(order), batch)]

    def run(idx: list[int]) -> list[list[int]]:
        limits = export.runtime.forced_limits([lengths[i] for i in idx], model.max_positions)
        return best_tokens(search_batch(model, padded([encoded[i] for i in idx], model.pad_id), search, limits))

    run(batches[0])
    start = time.perf_counter()
    produced = 0
    for idx in batches:
        out = run(idx)
        if [len(h) for h in out] != [lengths[i] for i in idx]:
            raise RuntimeError("an output does not have its forced length")  # the benchmark would time other work
        produced += sum(len(h) + 1 for h in out)  # + eos
    seconds = time.perf_counter() - start
    return {
        "sentences": len(encoded),
        "seconds": round(seconds, 3),
        "sentences_per_s": round(len(encoded) / seconds, 2),
        "output_tokens": produced,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.report.speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="export directory (python -m export … out=)")
    parser.add_argument("--texts", required=True, help="source sentences, one per line")
    parser.add_argument("--lengths", required=True, help="JSON list: output tokens per sentence (without eos)")
    parser.add_argument("--batch", type=int, default=32)
    default = Search()  # the settings' one home
    parser.add_argument("--beam-size", type=int, default=default.beam_size)
    parser.add_argument("--max-len-a", type=float, default=default.max_len_a)
    parser.add_argument("--max-len-b", type=int, default=default.max_len_b)
    parser.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: the export's)")
    parser.add_argument("--out", help="also write the JSON record here")
    args = parser.parse_args(argv)
    texts = Path(args.texts).read_text(encoding="utf-8").splitlines()
    lengths = json.loads(Path(args.lengths).read_text())
    if not texts or len(lengths) != len(texts):
        parser.error(f"--texts has {len(texts)} lines and --lengths {len(lengths)} values: give one per sentence")
    if args.batch < 1:
        parser.error(f"--batch={args.batch}: give a positive batch size")
    try:
        model = export.load(args.model, threads=args.threads)
        search = Search(beam_size=args.beam_size, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    except export.runtime.ExportRuntimeError as exc:
        parser.error(str(exc))
    encoded = model.encode_texts(texts)
    forced = workload_lengths(model.max_positions, encoded, lengths, search)
    # one hypothesis's caches at the end of its sentence (bos + its tokens): their mean over the workload is reported
    held = [cache_bytes(model.manifest["caches"], n + 1, len(e)) for n, e in zip(forced, encoded, strict=True)]
    record = {
        "batch": args.batch,
        "threads": args.threads,
        "beam_size": search.beam_size,
        "max_len_a": search.max_len_a,
        "max_len_b": search.max_len_b,
        **measure(model, encoded, forced, search, args.batch),
        "lengths_sha256": lengths_digest(forced),
        "cache_kb": round(float(np.mean(held)) / 1024, 1),
        "peak_rss_mb": round(vm_hwm() / 2**20, 1),  # VmHWM: ru_maxrss would keep the forking parent's peak
    }
    line = json.dumps(record)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
