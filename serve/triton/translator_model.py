"""Triton Python-backend model serving one exported attention-zoo model (copied as `<name>/1/model.py`).

Why this file is so small: the model directory must be self-contained — it imports only numpy, onnxruntime,
sentencepiece and its own code: `model_common.py` (request parsing, per-request errors, one generation per execute
call) and the export runtime, from the copy of the `export` package in `packages/` that model_common puts on
sys.path — so it can be copied to any Triton server whose Python environment has those three packages; no torch,
no project checkout.
"""

from __future__ import annotations

import json
from typing import Any

from model_common import TextModel  # first: it puts this model's packages/ (export, export.runtime) on sys.path

from export import runtime as export_runtime


class TritonPythonModel(TextModel):
    """The export runtime's ORT sessions (CPU, or CUDA with provider=cuda) in this model instance. A KIND_GPU
    instance (serve.repository with provider=cuda) runs on the GPU Triton placed it on: Triton passes that device
    id as `model_instance_device_id` (0 for CPU instances), and the runtime's CUDA provider is opened on it."""

    def load(self, directory: str, params: dict[str, str], args: dict[str, str]) -> Any:
        threads = int(params.get("threads", "0")) or None
        # "auto" counts every instance of this model (each its own process): their threads together must fit the
        # cores for theirs to spin (export/runtime/backend.py resolve_spinning)
        groups = json.loads(args["model_config"]).get("instance_group", [])
        instances = sum(int(g.get("count", 1)) for g in groups) or 1
        spinning = export_runtime.spinning_from_text(params.get("spinning", "auto"))
        return export_runtime.load(
            directory,
            threads=threads,
            optimization=params.get("optimization") or None,
            spinning=export_runtime.resolve_spinning(spinning, threads or 0, instances),
            check_files=params.get("check_files", "true") == "true",
            provider=params.get("provider", "cpu"),
            device_id=int(args.get("model_instance_device_id", "0")),
        )
