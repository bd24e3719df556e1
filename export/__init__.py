"""ONNX export of attention-zoo checkpoints and their torch-free runtime.

`export.load(dir).translate([...])` needs only numpy, onnxruntime and sentencepiece: this package imports nothing
but its runtime (`export.runtime`, the ground floor that zoo, the exporter and serve build on), so importing it
never runs zoo or the exporter. The exporter, which loads torch and zoo, is imported by its own name:
`from export.exporter import export_checkpoint`, or `python -m export`.
"""

from __future__ import annotations

from export import runtime
from export.runtime import SEARCH_LIMITS, ExportedModel, ExportedModelError, Search, SearchError, load

__all__ = ["SEARCH_LIMITS", "ExportedModel", "ExportedModelError", "Search", "SearchError", "load", "runtime"]
