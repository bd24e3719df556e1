"""The NGC-container variant of a served model: ONNX graphs under Triton's `onnxruntime` backend, driven by a
Python BLS model that owns tokenization and beam search.

Why a second variant: on a GPU server the encoder/decoder should run in Triton's own ONNX Runtime backend
(CUDA/TensorRT execution providers, GPU instance groups) rather than inside a Python stub. The wheel we run
here has no onnxruntime backend, so this variant cannot load on this machine; it is tested as far as possible:
every config is parsed with Triton's ModelConfig protobuf, and `python_standins` swaps the two ONNX models for
Python-backend models with the same name and I/O so the BLS model.py runs end to end against a real server.

Layout for an export named N:
    N-encoder/config.pbtxt, N-encoder/1/model.onnx   backend onnxruntime, max_batch_size 0 (the BLS batches)
    N-decoder/config.pbtxt, N-decoder/1/model.onnx   one decoding step; state in and out as tensors
    (each beside its weights under the name the graph refers to, encoder.onnx.data / decoder.onnx.data)
    N/config.pbtxt, N/1/{model.py, packages/export/, manifest.json, tokenizer.model}   the public model
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import onnxruntime as ort
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from export import runtime as export_runtime
from serve.model_config import (
    TRITON_MODELS,
    ModelSettings,
    RepositoryError,
    check_name,
    copy_export_files,
    copy_model_code,
    parse_config,
    pbtxt_string,
    python_config,
    read_manifest,
    staged_model_dir,
)

ONNX_TYPES = {
    "tensor(int64)": "TYPE_INT64",
    "tensor(int32)": "TYPE_INT32",
    "tensor(float)": "TYPE_FP32",
    "tensor(float16)": "TYPE_FP16",
    "tensor(bool)": "TYPE_BOOL",
    "tensor(double)": "TYPE_FP64",
}
ONNX_FILE = "model.onnx"


def _tensors(items: list[Any]) -> str:
    rows = []
    for item in items:
        if item.type not in ONNX_TYPES:
            raise RepositoryError(f"ONNX tensor {item.name!r} has type {item.type}, which this writer does not map")
        dims = ", ".join(str(d) if isinstance(d, int) and d >= 0 else "-1" for d in item.shape)
        rows.append(f"  {{ name: {pbtxt_string(item.name)} data_type: {ONNX_TYPES[item.type]} dims: [ {dims} ] }}")
    return ",\n".join(rows)


def onnx_config(name: str, onnx_path: Path, settings: ModelSettings) -> str:
    """config.pbtxt for one ONNX graph under the onnxruntime backend; I/O read from the graph itself. Its
    instances are `onnx_instance_kind` (default KIND_GPU), placed as the python variant's are
    (`ModelSettings.instance_group_text`): `instance_count` on each GPU of `gpus` (provider=cuda: default [0]);
    with provider=cpu and no gpus the group names no GPU, so Triton puts `instance_count` on every visible one."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    text = (
        f"name: {pbtxt_string(name)}\n"
        'backend: "onnxruntime"\n'
        f"default_model_filename: {pbtxt_string(ONNX_FILE)}\n"
        "max_batch_size: 0\n"
        f"{settings.version_policy_text()}\n"
        f"input [\n{_tensors(session.get_inputs())}\n]\n"
        f"output [\n{_tensors(session.get_outputs())}\n]\n"
        f"{settings.instance_group_text(settings.onnx_instance_kind)}\n"
    )
    parse_config(text, f"{name}/config.pbtxt")
    return text


def write_ngc_model(
    export_dir: Path,
    repo: Path,
    settings: ModelSettings,
    overwrite: bool = False,
    manifest: export_runtime.Manifest | None = None,
) -> str:
    """One export → the three model dirs of the NGC variant; returns the public (BLS) model name. `manifest`:
    the export's, as `read_manifest` returned it (read and checked here when not given)."""
    manifest = manifest if manifest is not None else read_manifest(export_dir)
    name = check_name(manifest["name"])
    graphs = manifest["graphs"]
    repo.mkdir(parents=True, exist_ok=True)
    parts = {f"{name}-encoder": graphs["encoder"], f"{name}-decoder": graphs["decoder"]}
    v = str(settings.version)
    with contextlib.ExitStack() as stack:  # every staged dir not yet published is removed on leaving
        staged = []
        for model, graph in parts.items():  # the graphs are read from their checked copies from here on
            stage = stack.enter_context(staged_model_dir(repo, model, overwrite))
            staged.append(stage)
            (stage.path / v).mkdir()
            weights = {graph["data"]: graph["data"]} if "data" in graph else {}  # the name the graph refers to
            copy_export_files(export_dir, manifest, stage.path / v, {graph["file"]: ONNX_FILE, **weights})
            (stage.path / "config.pbtxt").write_text(onnx_config(model, stage.path / v / ONNX_FILE, settings))
        decoder = ort.InferenceSession(str(staged[1].path / v / ONNX_FILE), providers=["CPUExecutionProvider"])
        decoder_inputs = sorted(i.name for i in decoder.get_inputs())
        stage = stack.enter_context(staged_model_dir(repo, name, overwrite))
        staged.append(stage)
        (stage.path / v).mkdir()
        held = (
            export_runtime.MANIFEST,
            manifest["tokenizer"],
            *([manifest["shortlist"]["file"]] if "shortlist" in manifest else []),
        )
        copy_export_files(export_dir, manifest, stage.path / v, {f: f for f in held})
        copy_model_code(stage.path / v, "bls_model.py", settings.prices)
        extra = {
            "encoder_model": f"{name}-encoder",
            "decoder_model": f"{name}-decoder",
            "decoder_inputs": json.dumps(decoder_inputs),
        }
        # the BLS model runs no graph (tokenization and search only): CPU instances whatever the provider
        (stage.path / "config.pbtxt").write_text(python_config(name, settings, extra, kind="KIND_CPU"))
        for stage in staged:  # encoder, decoder, then the BLS model that calls them
            stage.publish()
    return name


def python_standins(repo: Path) -> list[str]:
    """Turn every onnxruntime-backend model of an NGC repository into a Python-backend model with the same
    name, inputs and outputs (running the same model.onnx with onnxruntime in the stub). Only for testing the
    BLS model on a server without the onnxruntime backend; returns the models converted."""
    done = []
    for config_path in sorted(Path(repo).glob("*/config.pbtxt")):
        config = parse_config(config_path.read_text(), str(config_path))
        if config.backend != "onnxruntime":
            continue
        config.backend = "python"
        config.ClearField("default_model_filename")
        del config.instance_group[:]
        config.instance_group.add(count=1, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
        config.parameters["onnx_file"].string_value = ONNX_FILE
        text = text_format.MessageToString(config)
        parse_config(text, str(config_path))
        config_path.write_text(text)
        for version in config_path.parent.iterdir():
            if version.is_dir() and (version / ONNX_FILE).is_file():
                shutil.copy2(TRITON_MODELS / "onnx_standin_model.py", version / "model.py")
        done.append(config.name)
    return done
