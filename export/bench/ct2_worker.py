"""One measurement of `python -m export.bench.ct2_anchor`: one engine, one point, in a process of its own.

    python export/bench/ct2_worker.py work.json      # the anchor writes work.json and starts this; prints one JSON line

work.json: {"engine": "ours" | "ct2", "model": export or CTranslate2 directory, "threads", "beam", "steps": N,
"sentences": [[token id, …], …] (our runtime's ids), "batches": [[sentence index, …], …] (length-sorted, the first
also the warm-up batch)}. The process loads the engine, decodes the warm-up batch untimed while counting its decoder
runs (each sentence must take exactly N), then times the whole workload, checking that every sentence got exactly N
tokens, and prints sentences/s and its peak RSS (VmHWM).

Why a file of its own, started by its path: the peak RSS must be one engine's alone, so a CTranslate2 process must
not load the project's runtime (nor either process torch). This file imports the standard library at the top and
each engine inside its own function; the VmHWM reader is export/bench/rss_probe.py's, loaded by its path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Decode = Callable[[list[int]], list[int]]  # sentence indices → per sentence its tokens (or its counted decoder runs)


class MeasurementError(Exception):
    """The engine did other work than asked (one line)."""


def vm_hwm() -> int:
    """Peak RSS so far in bytes (export/bench/rss_probe.py `vm_hwm`, loaded by path: it imports nothing of the
    project)."""
    spec = importlib.util.spec_from_file_location("ct2_worker_rss_probe", Path(__file__).with_name("rss_probe.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.vm_hwm()


def ours(work: dict[str, Any]) -> tuple[Decode, Decode, dict[str, Any]]:
    """Our runtime: each sentence forced to N tokens and eos (`forced_limits`; a step where every row can only emit
    eos runs no decoder), so N decoder runs."""
    import export
    from export.runtime.generation import best_tokens, padded, search_batch

    options = {} if work.get("spinning") is None else {"spinning": work["spinning"]}  # a SPINNING text, as given
    model = export.load(work["model"], threads=work["threads"], **options)
    search, sentences = export.Search(beam_size=work["beam"], shortlist=0), work["sentences"]

    def decode(idx: list[int]) -> list[int]:
        limits = export.runtime.forced_limits([work["steps"]] * len(idx), model.max_positions)
        out = best_tokens(search_batch(model, padded([sentences[i] for i in idx], model.pad_id), search, limits))
        return [len(h) for h in out]

    def counted(idx: list[int]) -> list[int]:  # decoder graph runs: one per step for the whole batch
        runs, real = [0], model.backend.decode

        def run(*args: Any) -> Any:
            runs[0] += 1
            return real(*args)

        model.backend.decode = run  # type: ignore[method-assign]  # the instance's own, removed below
        try:
            decode(idx)
        finally:
            del model.backend.decode
        return [runs[0]] * len(idx)

    return decode, counted, {"runtime": f"export.runtime, onnxruntime {_version('onnxruntime')}",
                             "steps_counted_by": "decoder graph runs"}  # fmt: skip


def ct2(work: dict[str, Any]) -> tuple[Decode, Decode, dict[str, Any]]:
    """CTranslate2: eos banned before step N and decoding cut after step N (min = max decoding length = N), so N
    tokens from N decoder runs; the sentences as the pieces of our ids in the converted vocabulary."""
    import ctranslate2

    vocab = json.loads(Path(work["model"], "shared_vocabulary.json").read_text(encoding="utf-8"))
    translator = ctranslate2.Translator(work["model"], device="cpu", intra_threads=work["threads"], inter_threads=1)
    tokens = [[vocab[i] for i in s] for s in work["sentences"]]
    n, beam = work["steps"], work["beam"]

    def decode(idx: list[int], callback: Any = None) -> list[int]:
        batch = [tokens[i] for i in idx]
        results = translator.translate_batch(
            batch, beam_size=beam, min_decoding_length=n, max_decoding_length=n, max_batch_size=len(batch),
            callback=callback,
        )  # fmt: skip
        return [len(r.hypotheses[0]) for r in results]

    def counted(idx: list[int]) -> list[int]:  # greedy: the per-step callback; beam (no callback): one token a step
        if beam > 1:
            return decode(idx)
        steps = [0] * len(idx)
        decode(idx, lambda step: steps.__setitem__(step.batch_id, steps[step.batch_id] + 1))
        return steps

    by = "per-step callback" if beam == 1 else "hypothesis length (one token per step)"
    return decode, counted, {"runtime": f"ctranslate2 {ctranslate2.__version__}", "threads": work["threads"],
                             "ct2_use_mkl": os.environ.get("CT2_USE_MKL"),  # the backend the anchor set, if any
                             "compute_type": translator.compute_type, "steps_counted_by": by}  # fmt: skip


def _version(package: str) -> str:
    from importlib import metadata

    return metadata.version(package)


def measure(work: dict[str, Any]) -> dict[str, Any]:
    """Load one engine, check its decoder runs on the untimed warm-up batch, then time the whole workload."""
    start = time.perf_counter()
    decode, counted, info = (ours if work["engine"] == "ours" else ct2)(work)
    load_s, after_load = time.perf_counter() - start, vm_hwm()
    n, batches = work["steps"], work["batches"]
    if set(counted(batches[0])) != {n}:
        raise MeasurementError(f"{work['engine']}: the warm-up batch did not run the decoder {n} times a sentence")
    start = time.perf_counter()
    for idx in batches:
        if set(decode(idx)) != {n}:
            raise MeasurementError(f"{work['engine']}: a sentence did not get exactly {n} new tokens")
    seconds = time.perf_counter() - start
    sentences = sum(len(b) for b in batches)
    return {
        **info, "load_s": round(load_s, 3), "sentences": sentences, "new_tokens": n, "decoder_runs_checked": True,
        "seconds": round(seconds, 4), "sentences_per_s": round(sentences / seconds, 3),
        "after_load_mb": round(after_load / 2**20, 1), "peak_rss_mb": round(vm_hwm() / 2**20, 1),
        "os_threads": len(os.listdir("/proc/self/task")) if Path("/proc/self/task").is_dir() else None,
        "torch_imported": "torch" in sys.modules,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        usage = f"usage: python {Path(__file__).name} WORK.json"
        print(f"{usage} — one measurement of `python -m export.bench.ct2_anchor`, which writes WORK.json and starts "
              "this; run the anchor instead", file=sys.stderr)  # fmt: skip
        return 2
    try:
        print(json.dumps(measure(json.loads(Path(args[0]).read_text(encoding="utf-8")))), flush=True)
    except MeasurementError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
