"""Triton Python BLS model of the NGC variant (copied as `<name>/1/model.py` by `serve.repository variant=ngc`).

Why: on a GPU server the ONNX encoder/decoder run in Triton's onnxruntime backend (`<name>-encoder`,
`<name>-decoder`), and this model does what does not fit a graph: tokenization, beam search, batching of the
dynamic batch. The search is the export runtime's own code (`export_runtime.py`, a verbatim copy of
export/runtime.py): `BlsModel` subclasses its `ExportedModel` and only replaces where the two graphs run —
`encode` and the per-step `stepper` send BLS requests instead of calling local ORT sessions — so hypotheses are
those of `export.load(dir).translate` for the same batch.

Interface, defined results and per-request errors are those of the python variant (`translator_model.py`).
The self-attention state is the runtime's own host-owned `SelfCache`: each step sends its stores and `history`
to the decoder model and writes back the new positions the step returns (beam reordering reorders `history`).
Outputs are requested in CPU memory, so on a GPU the state crosses PCIe each step; keeping it on device would
need a DLPack array library in the stub (not assumed here).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_runtime
from model_common import TextModel


def _cpu() -> Any:
    """BLS outputs in CPU memory (np arrays), where the python backend supports asking for it."""
    memory = getattr(pb_utils, "PreferredMemory", None)
    return memory(pb_utils.TRITONSERVER_MEMORY_CPU, 0) if memory else None


def _call(model: str, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
    """One BLS request → {output name: pb_utils.Tensor}; a failed composing model is raised with its message."""
    tensors = [v if isinstance(v, pb_utils.Tensor) else pb_utils.Tensor(k, v) for k, v in inputs.items()]
    kwargs = {"preferred_memory": _cpu()} if _cpu() is not None else {}
    response = pb_utils.InferenceRequest(
        model_name=model, requested_output_names=outputs, inputs=tensors, **kwargs
    ).exec()
    if response.has_error():
        raise RuntimeError(f"{model}: {response.error().message()}")
    return {t.name(): t for t in response.output_tensors()}


class BlsStepper(export_runtime._Stepper):
    """`export_runtime._Stepper` with the decoder graph run by a BLS call to the decoder model (feeds, the
    self-attention store, `select(rows)` are all inherited)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.full:
            raise NotImplementedError("full logits are a verification feature of the local runtime")

    def _decode(self, outputs: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = _call(self.m.decoder_model, inputs, outputs)
        return [out[name].as_numpy().copy() for name in outputs]


class BlsModel(export_runtime.ExportedModel):
    """The export runtime's search with the graphs running in other Triton models (no local ORT sessions)."""

    stepper_class = BlsStepper

    def __init__(self, directory: str, encoder_model: str, decoder_model: str, decoder_inputs: list[str]) -> None:
        manifest = json.loads((Path(directory) / export_runtime.MANIFEST).read_text(encoding="utf-8"))
        self._read_export(Path(directory), manifest)
        # one cross-cache row per hypothesis, as before per-source caches: the composing decoder model's Triton
        # config was written for one batch axis (the graph accepts both; per-source rows here are untested)
        self.cross_per_source = False
        self.encoder_model, self.decoder_model = encoder_model, decoder_model
        self.decoder_inputs = frozenset(decoder_inputs)

    def encode(self, src: np.ndarray, with_memory: bool = False) -> dict[str, np.ndarray]:
        names = (["memory"] if with_memory else []) + ["memory_pad_mask", *self.cross_names]
        out = _call(self.encoder_model, {"src_tokens": np.ascontiguousarray(src, dtype=np.int64)}, names)
        # copies: the stepper keeps the encoder's arrays as its cross inputs, and these belong to the response
        return {n: out[n].as_numpy().copy() for n in names}


class TritonPythonModel(TextModel):
    """The public text model of the NGC variant."""

    def load(self, directory: str, params: dict[str, str], args: dict[str, str]) -> Any:
        return BlsModel(
            directory, params["encoder_model"], params["decoder_model"], json.loads(params["decoder_inputs"])
        )
