"""Peak memory of a fresh process that loads an export with one given runtime and decodes given batches.

    python export/bench/rss_probe.py --runtime export/runtime --export exports/transformer-deen \
        --batches work.npz [--threads 1] [--spinning] [--beam 5] [--fixed-len 30]

Prints one JSON object on stdout: VmHWM (peak RSS, bytes) right after the export is loaded and after
every batch was decoded once, the decoding seconds, sentences, and whether torch got imported (it
must not). `export.bench` runs this once per engine and export.

Why a separate process, started on this file's path: the in-process numbers of `export.bench` sit on
top of torch, the checkpoint and every other engine, and VmHWM only ever grows. A process that
imports the standard library, numpy and then nothing but the runtime (a package, or an older commit's
single runtime.py; it brings onnxruntime and sentencepiece) measures what a torch-free server pays.
Running the file by path, not `python -m export.bench.rss_probe`, keeps the `export` package — and through it
the working tree's own runtime — out of a probe of another runtime. So this module imports nothing from
the project.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np


def decode_batch(model: Any, src: np.ndarray, search: Any, limits: Any = None) -> list[list[int]]:
    """Best token ids per sentence of src [B, S] with any version of the runtime: through its decoding driver
    (`generation.search_batch`, since issue 87), or an older model's own `generate`."""
    if hasattr(model, "generate"):
        return model.generate(src, search, limits)
    driver = sys.modules[type(model).__module__.rpartition(".")[0] + ".generation"]
    return driver.best_tokens(driver.search_batch(model, src, search, limits))


def load_runtime_file(path: str | Path, module_name: str) -> ModuleType:
    """Import a self-contained runtime — a package directory (its modules import each other relatively) or a
    single runtime.py — under `module_name`, so two versions can live in one process.

    Registered in sys.modules before it runs: dataclasses and typing.get_type_hints (used by the
    runtime's Search and manifest schema) look the defining module up there."""
    path = Path(path)
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            module_name, path / "__init__.py", submodule_search_locations=[str(path)]
        )
    else:
        spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def vm_hwm() -> int:
    """Peak resident set size of this process so far (VmHWM) in bytes; 0 where /proc is unavailable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def probe(
    runtime_file: str | Path,
    export_dir: str | Path,
    batches: list[np.ndarray],
    threads: int,
    spinning: bool,
    beam: int,
    fixed_len: int,
) -> dict[str, Any]:
    """Load `export_dir` with `runtime_file` and decode every batch once with `beam` to exactly `fixed_len`
    tokens (eos banned until then, forced there: the same work whatever the weights say)."""
    rt = load_runtime_file(runtime_file, "rss_probe_runtime")
    model = rt.load(export_dir, threads=threads, spinning=spinning)
    after_load = vm_hwm()
    search = rt.Search(beam_size=beam, max_len_a=0.0, max_len_b=fixed_len, min_len=fixed_len)
    start = time.perf_counter()
    hyps = [h for src in batches for h in decode_batch(model, src, search)]
    seconds = time.perf_counter() - start
    return {
        "after_load_bytes": after_load,
        "peak_bytes": vm_hwm(),
        "seconds": seconds,
        "sentences": len(hyps),
        "torch_imported": "torch" in sys.modules,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", required=True, help="a self-contained runtime: export/runtime/ or an older runtime.py")
    ap.add_argument("--export", required=True, help="export dir")
    ap.add_argument("--batches", required=True, help=".npz of padded int64 token batches (arr_0, arr_1, …)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--spinning", action="store_true")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--fixed-len", type=int, default=30)
    args = ap.parse_args(argv)
    with np.load(args.batches) as work:
        batches = [work[f"arr_{i}"] for i in range(len(work.files))]
    result = probe(args.runtime, args.export, batches, args.threads, args.spinning, args.beam, args.fixed_len)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
