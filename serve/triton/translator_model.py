"""Triton Python-backend model serving one exported attention-zoo model (copied as `<name>/1/model.py`).

Why this file is so small: the model directory must be self-contained — it imports only numpy, onnxruntime,
sentencepiece and its neighbours `export_runtime/` (a verbatim copy of the package export/runtime/) and
`model_common.py` (request parsing, per-request errors, one generation per execute call), so it can be copied
to any Triton server whose Python environment has those three packages; no torch, no project checkout. The
neighbours are imported from their paths (`_own`, the same in bls_model.py: a model.py can import nothing of
its own before it), never through sys.path.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _own(name: str) -> ModuleType:
    """This model's own module or package `name` (beside this file), imported from its path under that name.
    Why not through sys.path: a directory on sys.path lends every file in it to every `import` of the process,
    so a file beside model.py named like a library (sentencepiece.py) would be imported in its place. Loaded
    in order (export_runtime, model_metrics, model_lanes, model_common), each finds the ones before it in
    sys.modules."""
    path = os.path.join(HERE, name)
    package = os.path.isdir(path)
    spec = importlib.util.spec_from_file_location(
        name,
        os.path.join(path, "__init__.py") if package else path + ".py",
        submodule_search_locations=[path] if package else None,
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is missing from the model directory; write it again with serve.repository")
    # (this loader is written in each model file on purpose: it is what loads the shared modules, so it cannot
    # be imported from one of them)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


export_runtime = _own("export_runtime")  # the verbatim copy of the package export/runtime/
_own("model_metrics")
_own("model_lanes")
TextModel = _own("model_common").TextModel


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
