"""What the gate serves: each text model of a repository, its versions, inputs, outputs and batch limit, and the
request parameters the models read — the allow-list every request is checked against before the gate builds what
Triton receives (serve/infer_request.py).

Why read from the repository: the gate must answer "not served" for anything outside it (deny by default, issue 84),
and the limits follow the models — a request may name only the tensors a model declares, with at most its
`max_batch_size` rows. A model whose inputs are not all `TYPE_STRING` `[1]` (an NGC variant's internal ONNX models)
is not a text model and is not served through the gate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from export.runtime import Search

# the request parameters the text models read (serve/triton/model_requests.py: every option of a `Search`), plus
# HTTP's binary-output switch
MODEL_PARAMETERS = frozenset(f.name for f in fields(Search))
HTTP_PARAMETERS = frozenset({"binary_data_output"})
# Triton's own flag that clients such as perf_analyzer send with every request (it asks a decoupled model for an
# empty final response): read, and left out of what Triton receives — the gate's calls to Triton are unary
DROPPED_PARAMETERS = frozenset({"triton_enable_empty_final_response"})
# the client the gate names to the models, which share their lanes by it (the models' own name for it:
# serve/triton/model_requests.py CLIENT_PARAMETER; tests/test_gate_requests.py checks they agree)
CLIENT_PARAMETER = "zoo_client"
# Triton 2.51 advertises these in GET /v2 (and gRPC ServerMetadata) but the gate does not serve them:
# classification crashes it, no served model is a sequence model, shared memory is never forwarded.
NOT_SERVED_EXTENSIONS = frozenset({"classification", "sequence", "system_shared_memory", "cuda_shared_memory"})
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # model names serve.repository writes (never "." / "..")


class ServedModelsError(ValueError):
    """A repository the gate cannot serve from (no text model in it); the message names the fix."""


@dataclass(frozen=True)
class ServedModel:
    """One text model as the gate sees it: every request to it is checked against these."""

    name: str
    versions: tuple[str, ...]  # the version directories present ("1", …)
    inputs: tuple[str, ...]  # TYPE_STRING [1] each: a request's tensor is [rows, 1]
    outputs: tuple[str, ...]
    max_batch_size: int

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ServedModel:
        return cls(
            name=str(raw["name"]),
            versions=tuple(raw["versions"]),
            inputs=tuple(raw["inputs"]),
            outputs=tuple(raw["outputs"]),
            max_batch_size=int(raw["max_batch_size"]),
        )


def _text_model(directory: Path) -> ServedModel | None:
    config = text_format.Parse((directory / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    name = config.name or directory.name
    text_inputs = all(
        i.data_type == model_config_pb2.TYPE_STRING and list(i.dims) == [1] and not i.reshape.shape
        for i in config.input
    )
    if not NAME.match(name) or not config.input or not text_inputs or config.max_batch_size < 1:
        return None
    versions = tuple(sorted((p.name for p in directory.iterdir() if p.is_dir() and p.name.isdigit()), key=int))
    return ServedModel(
        name=name,
        versions=versions,
        inputs=tuple(i.name for i in config.input),
        outputs=tuple(o.name for o in config.output),
        max_batch_size=int(config.max_batch_size),
    )


def served_models(repo: Path) -> dict[str, ServedModel]:
    """The repository's text models by name; ServedModelsError when it has none."""
    found = {}
    for config in sorted(repo.glob("*/config.pbtxt")):
        model = _text_model(config.parent)
        if model is not None:
            found[model.name] = model
    if not found:
        raise ServedModelsError(
            f"{repo} has no text model (TYPE_STRING [1] inputs, max_batch_size ≥ 1) for the gate to serve; "
            "write one with python -m serve.repository export_dir=… repo=…"
        )
    return found


def served_extensions(extensions: list[str]) -> list[str]:
    """Triton's advertised extensions without those the gate does not serve (NOT_SERVED_EXTENSIONS)."""
    return [e for e in extensions if e not in NOT_SERVED_EXTENSIONS]
