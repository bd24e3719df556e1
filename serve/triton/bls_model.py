"""Triton Python BLS model of the NGC variant (copied as `<name>/1/model.py` by `serve.repository variant=ngc`).

Why: on a GPU server the ONNX encoder/decoder run in Triton's onnxruntime backend (`<name>-encoder`,
`<name>-decoder`), and this model does what does not fit a graph: tokenization, beam search, batching of the
dynamic batch. The search is the export runtime's own `ExportedModel` (`export.runtime`, from the copy of the
`export` package in `packages/` that model_common.py puts on sys.path), its manifest read by the runtime's own
reader; only where the two graphs run differs — a `BlsBackend` that sends them to the composing models — so
hypotheses are those of `export.load(dir).translate` for the same batch.

Interface, defined results and per-request errors are those of the python variant (`translator_model.py`).
The self-attention state is the runtime's own host-owned `SelfCache`: each step sends its stores and `history`
to the decoder model and writes back the new positions the step returns (beam reordering reorders `history`).
Outputs are requested in CPU memory, so on a GPU the state crosses PCIe each step; keeping it on device would
need a DLPack array library in the stub (not assumed here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from model_common import TextModel  # first: it puts this model's packages/ (export, export.runtime) on sys.path

from export import runtime as export_runtime

# what this model's directory holds of the export (the shortlist where it has one): the graphs live in the composing
# models
HELD = ("tokenizer", "shortlist.file")


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


class BlsBackend:
    """The runtime's backend (export.runtime.backend.Backend) with both graphs run by BLS calls to the models
    serving them."""

    # one cross-cache row per hypothesis, as before per-source caches: the composing decoder model's Triton
    # config was written for one batch axis (the graph accepts both; per-source rows here are untested)
    per_source_cross = False

    def __init__(self, encoder_model: str, decoder_model: str, decoder_inputs: list[str]) -> None:
        self.encoder_model, self.decoder_model = encoder_model, decoder_model
        self.decoder_inputs = frozenset(decoder_inputs)

    def encode(self, outputs: list[str], src: np.ndarray) -> list[np.ndarray]:
        out = _call(self.encoder_model, {"src_tokens": src}, outputs)
        # copies: the stepper keeps the encoder's arrays as its cross inputs, and these belong to the response
        return [out[n].as_numpy().copy() for n in outputs]

    def decode(self, outputs: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = _call(self.decoder_model, inputs, outputs)
        return [out[name].as_numpy().copy() for name in outputs]


class TritonPythonModel(TextModel):
    """The public text model of the NGC variant."""

    def load(self, directory: str, params: dict[str, str], args: dict[str, str]) -> Any:
        check_files = params.get("check_files", "true") == "true"
        manifest = export_runtime.read_manifest(directory, check_files=check_files, holds=HELD)
        backend = BlsBackend(params["encoder_model"], params["decoder_model"], json.loads(params["decoder_inputs"]))
        return export_runtime.ExportedModel(Path(directory), manifest, backend)
