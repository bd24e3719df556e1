"""Python-backend stand-in for an onnxruntime-backend model (testing the NGC variant's BLS model here).

Why: the pytriton wheel has no onnxruntime backend, but the BLS model should still run end to end against a
real server. This model has the same name, inputs and outputs as the ONNX model it replaces and runs the same
model.onnx with onnxruntime: every request is one independent `session.run` (max_batch_size 0, like the
config the onnxruntime backend gets).
"""

from __future__ import annotations

import json
import os
from typing import Any

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        onnx_file = config.get("parameters", {}).get("onnx_file", {}).get("string_value", "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        here = os.path.dirname(os.path.abspath(__file__))
        self.session = ort.InferenceSession(os.path.join(here, onnx_file), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                feeds = {}
                for name in self.inputs:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is None:
                        raise ValueError(f"input {name} is missing")
                    feeds[name] = tensor.as_numpy()
                names = list(request.requested_output_names()) or self.outputs
                values = self.session.run(names, feeds)
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor(n, v) for n, v in zip(names, values, strict=True)]
                    )
                )
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
