"""Peak memory and weight bytes for `python -m export.bench`: the in-process peak-RSS rise of one point, what an
export's graphs weigh, and a fresh torch-free process per runtime and export (export/bench/rss_probe.py).

Why apart from the timing: memory is measured on its own terms (VmHWM reset through /proc/self/clear_refs, a new
interpreter for what a server pays), and the speed run only asks for its numbers.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from export.bench import rss_probe
from export.graph import ExportError
from export.runtime import ExportedModel


# ---------------------------------------------------------------------------------------------- memory
def _status(field: str) -> int:
    """A /proc/self/status value in bytes (0 where /proc is unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_rise(fn: Callable[[], Any]) -> int | None:
    """Bytes the peak RSS rose above the current RSS while `fn` ran (None if it cannot be reset)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return None
    base = _status("VmRSS")
    fn()
    return max(0, _status("VmHWM") - base)


def graph_weight_bytes(path: str | Path) -> int:
    """Bytes of every initializer of an ONNX graph, from dims × element size: tensors kept in external data
    files count without being read, and nothing is deduplicated (a tied embedding in both graphs counts twice)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(
        math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in graph.initializer
    )


def export_weights(runtime: ExportedModel) -> dict[str, Any]:
    """What the export weighs: initializer bytes per graph (what ORT holds), and the exported model's unique
    parameters from the manifest (shared tensors once) at 4 bytes each — the fp32 model the graphs encode."""
    graphs = runtime.manifest["graphs"]
    per_graph = {k: graph_weight_bytes(runtime.directory / graphs[k]["file"]) for k in ("encoder", "decoder")}
    params = runtime.manifest.get("size", {}).get("after", {}).get("params")
    return {
        "encoder_bytes": per_graph["encoder"],
        "decoder_bytes": per_graph["decoder"],
        "graph_bytes": sum(per_graph.values()),
        "unique_params": params,
        "unique_param_bytes_fp32": 4 * params if params is not None else None,
    }


def fresh_process_rss(
    runtime_file: Path,
    export_dir: Path,
    batches: list[np.ndarray],
    threads: int,
    spinning: bool,
    fixed_len: int,
    beam: int,
) -> dict[str, Any]:
    """Peak RSS (MB) of a new interpreter that imports only `runtime_file` (a runtime package or file), loads
    the export and decodes `batches` once with `beam` to exactly `fixed_len` tokens (export/bench/rss_probe.py): what
    a torch-free server pays, which this process — torch, the checkpoint, every engine — cannot show."""
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as tmp:
        work = Path(tmp) / "batches.npz"
        np.savez(work, *batches)
        command = [sys.executable, str(Path(rss_probe.__file__).resolve()), "--runtime", str(runtime_file)]
        command += ["--export", str(export_dir), "--batches", str(work), "--threads", str(threads)]
        command += ["--beam", str(beam), "--fixed-len", str(fixed_len)]
        command += ["--spinning"] if spinning else []
        proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExportError(f"the memory probe failed ({' '.join(command)}): {proc.stderr.strip()[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "after_load_mb": out["after_load_bytes"] / 1e6,
        "peak_mb": out["peak_bytes"] / 1e6,
        "seconds": out["seconds"],
        "sentences": out["sentences"],
        "torch_imported": out["torch_imported"],
    }
