"""ONNX export of attention-zoo checkpoints and their torch-free runtime.

`export.load(dir).translate([...])` needs only numpy, onnxruntime and sentencepiece (the runtime
module imports nothing else, so serving never pulls torch in); `export.export_checkpoint(cfg)`
(torch) is imported lazily on first use for the same reason.
"""

from __future__ import annotations

from typing import Any

from export.runtime import SEARCH_LIMITS, ExportedModel, ExportedModelError, Search, SearchError, load

__all__ = ["SEARCH_LIMITS", "ExportedModel", "ExportedModelError", "Search", "SearchError", "export_checkpoint", "load"]


def __getattr__(name: str) -> Any:
    if name == "export_checkpoint":
        from export.exporter import export_checkpoint  # imported here: the exporter loads torch (see above)

        return export_checkpoint
    raise AttributeError(f"module 'export' has no attribute {name!r}")
