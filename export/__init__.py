"""ONNX export of attention-zoo checkpoints and their torch-free runtime.

`export.load(dir).translate([...])` needs only numpy, onnxruntime and sentencepiece (the runtime
package imports nothing else, so serving never pulls torch in); `export.export_checkpoint(cfg)`
(torch) is imported lazily on first use for the same reason, and so are the runtime's names that load
onnxruntime (zoo takes its search types from `export.runtime` and must not load onnxruntime with them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from export import runtime
from export.runtime import SEARCH_LIMITS, ExportedModelError, Search, SearchError

if TYPE_CHECKING:
    from export.exporter import export_checkpoint
    from export.runtime import ExportedModel, load

__all__ = ["SEARCH_LIMITS", "ExportedModel", "ExportedModelError", "Search", "SearchError", "export_checkpoint", "load"]


def __getattr__(name: str) -> Any:
    if name in ("ExportedModel", "load"):
        return getattr(runtime, name)  # onnxruntime loads here, on first use
    if name == "export_checkpoint":
        from export.exporter import export_checkpoint  # imported here: the exporter loads torch (see above)

        return export_checkpoint
    raise AttributeError(f"module 'export' has no attribute {name!r}")
