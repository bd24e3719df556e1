"""ORT's CUDA execution provider against its CPU one on one export: encoder parity, hypotheses, sentences/s.

Why: the export runtime's `provider=cuda` (and Triton's) had to be shown to give the CPU's hypotheses before it was
offered; this measured ORT's default TF32 changing 12 of 1420 test hypotheses and TF32 off changing none
(`results/h200/ort_cuda_tf32_*.json`). The CUDA sessions are built as the Triton translator model built them for
provider=cuda at the time.

usage: python -m zoo.devtools.ort_cuda_vs_cpu EXPORT_DIR TEXTS OUT_JSON [CPU_THREADS]
environment: TF32=0 turns TF32 off (and runs only greedy and beam 5 at batch 32); DRYRUN=1 allows a machine
without CUDA (the "cuda" sessions then fall back to the CPU).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import onnxruntime as ort

from export import runtime
from export.bench.rss_probe import decode_batch
from export.runtime.generation import padded


def load(export_dir: str, provider: str, threads: int | None) -> Any:
    """The export runtime's model, with both sessions rebuilt on the CUDA provider when `provider` is cuda."""
    model = runtime.load(export_dir, threads=threads)
    if provider == "cuda":
        providers = [
            ("CUDAExecutionProvider", {"device_id": 0, "use_tf32": os.environ.get("TF32", "1")}),
            "CPUExecutionProvider",
        ]
        graphs = model.manifest["graphs"]
        for attr in ("encoder", "decoder"):
            setattr(model, attr, ort.InferenceSession(str(model.directory / graphs[attr]["file"]), providers=providers))
        assert os.environ.get("DRYRUN") or model.decoder.get_providers()[0] == "CUDAExecutionProvider", (
            model.decoder.get_providers()
        )
    return model


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    export_dir, texts_path, out_path = args[:3]
    with open(texts_path, encoding="utf-8") as fh:
        texts = [t for t in fh.read().splitlines() if t]
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # the CUDA/cuDNN libraries of the nvidia-* wheels, where the image has them
    print("ort", ort.__version__, ort.get_available_providers(), flush=True)

    models = {
        "cpu16": load(export_dir, "cpu", int(args[3]) if len(args) > 3 else 16),
        "cuda": load(export_dir, "cuda", None),
    }
    enc = models["cpu16"].encode_texts(texts)
    order = sorted(range(len(enc)), key=lambda i: -len(enc[i]))
    result: dict[str, Any] = {"ort": ort.__version__, "export": export_dir, "sentences": len(texts), "points": []}
    # encoder parity on the first 32 sentences
    src = padded([enc[i] for i in order[:32]], models["cpu16"].pad_id)
    a, b = models["cpu16"].encode(src, with_memory=True), models["cuda"].encode(src, with_memory=True)
    result["encoder_max_abs_diff"] = {k: float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a}
    print("encoder max |cpu - cuda|", result["encoder_max_abs_diff"], flush=True)
    hyps = {}
    points = ((5, 32), (1, 32)) if os.environ.get("TF32") == "0" else ((1, 32), (5, 32), (5, 128), (1, 1), (5, 1))
    for beam, batch in points:
        n = len(order) if batch > 1 else min(64, len(order))
        batches = [[enc[i] for i in order[:n][j : j + batch]] for j in range(0, n, batch)]
        search = runtime.Search(beam_size=beam)
        for name, model in models.items():
            decode_batch(model, padded(batches[0], model.pad_id), search)  # warm-up
            start = time.perf_counter()
            out = [h for bt in batches for h in decode_batch(model, padded(bt, model.pad_id), search)]
            sec = time.perf_counter() - start
            hyps[(beam, batch, name)] = out
            point = {
                "beam": beam,
                "batch": batch,
                "engine": name,
                "sentences": n,
                "seconds": round(sec, 3),
                "sentences_per_s": round(n / sec, 1),
            }
            result["points"].append(point)
            print(json.dumps(point), flush=True)
        same = sum(x == y for x, y in zip(hyps[(beam, batch, "cpu16")], hyps[(beam, batch, "cuda")], strict=True))
        result["points"][-1]["identical_to_cpu"] = f"{same}/{n}"
        print(f"beam {beam} batch {batch}: {same}/{n} hypotheses identical cpu vs cuda", flush=True)
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
