"""Triton Python-backend model serving one exported attention-zoo model (copied as `<name>/1/model.py`).

Why this file is so small: the model directory must be self-contained — it imports only numpy, onnxruntime,
sentencepiece and its neighbours `export_runtime/` (a verbatim copy of the package export/runtime/) and
`model_common.py` (request parsing, per-request errors, one generation per execute call), so it can be copied
to any Triton server whose Python environment has those three packages; no torch, no project checkout.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_runtime
from model_common import TextModel


class TritonPythonModel(TextModel):
    """The export runtime's ORT sessions (CPU, or CUDA with provider=cuda) in this model instance."""

    def load(self, directory: str, params: dict[str, str], args: dict[str, str]) -> Any:
        return export_runtime.load(
            directory,
            threads=int(params.get("threads", "0")) or None,
            optimization=params.get("optimization") or None,
            check_files=params.get("check_files", "true") == "true",
            provider=params.get("provider", "cpu"),
            device_id=int(args.get("model_instance_device_id", "0")),
        )
