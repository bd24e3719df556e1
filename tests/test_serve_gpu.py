"""Triton GPU instance groups (issue 66): what `serve.repository` writes when asked for GPUs (`provider=cuda`,
`gpus`, `instance_count` per GPU), read back with Triton's own ModelConfig protobuf (tritonclient's
model_config_pb2), in both variants, and the contradictions it refuses with one line naming the fix. CPU only:
the configs are written and parsed, and the bundled tritonserver 2.51 is shown such a model on this machine
without a GPU, where it must refuse it and `serve.start` must say why and what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tritonclient.grpc import model_config_pb2

from serve.launch import GPU_FIX
from serve.model_config import ModelSettings, RepositoryError, parse_config, python_config
from serve.repository import write_repository
from serve.server import Server, ServerError
from zoo.entries import CONF_DIR

GPU, CPU = model_config_pb2.ModelInstanceGroup.KIND_GPU, model_config_pb2.ModelInstanceGroup.KIND_CPU


def _groups(text: str) -> list[tuple[int, int, list[int]]]:
    """(kind, count, gpus) of each instance group of a config, as Triton's protobuf reads them."""
    return [(g.kind, g.count, list(g.gpus)) for g in parse_config(text).instance_group]


def _cli_settings(*overrides: str) -> ModelSettings:
    """The settings `python -m serve.repository … <overrides>` builds: conf/serve.yaml composed by Hydra."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="serve", overrides=["export_dir=x", "repo=y", *overrides])
    return ModelSettings.from_mapping(OmegaConf.to_container(cfg.triton, resolve=True))  # type: ignore[arg-type]


def test_provider_cuda_writes_gpu_instance_groups_triton_parses() -> None:
    """provider=cuda: one KIND_GPU group, `instance_count` on each GPU of `gpus` (default [0]); provider=cpu
    (conf/serve.yaml's default): KIND_CPU and no gpus, as before."""
    assert _groups(python_config("m", _cli_settings())) == [(CPU, 2, [])]
    cuda = _cli_settings("triton.provider=cuda")
    assert _groups(python_config("m", cuda)) == [(GPU, 2, [0])]
    assert parse_config(python_config("m", cuda)).parameters["provider"].string_value == "cuda"
    pinned = _cli_settings("triton.provider=cuda", "triton.gpus=[1,3]", "triton.instance_count=3")
    assert _groups(python_config("m", pinned)) == [(GPU, 3, [1, 3])]
    restated = ModelSettings.from_mapping({"provider": "cuda", "instance_kind": "KIND_GPU", "gpus": [2]})
    assert _groups(python_config("m", restated)) == [(GPU, 1, [2])]


@pytest.mark.parametrize(
    ("values", "fix"),
    [
        ({"provider": "cuda", "instance_kind": "KIND_CPU"}, "drop instance_kind"),
        ({"instance_kind": "KIND_GPU"}, "add provider=cuda"),
        ({"provider": "cuda", "instance_kind": "KIND_AUTO"}, "drop instance_kind"),
        ({"gpus": [0]}, r"gpus=\[0\] places GPU instances, but provider=cpu .*add provider=cuda, or drop gpus"),
        ({"provider": "cuda", "gpus": [0, -1]}, "device ids are ≥ 0"),
        ({"provider": "cuda", "gpus": [1, 1]}, "lists GPU 1 more than once; list each GPU once"),
        ({"provider": "cuda", "gpus": []}, "lists no GPU"),
        ({"provider": "cuda", "gpus": 0}, r"write a list of GPU device ids, e.g. gpus=\[0\]"),
        ({"provider": "cuda", "gpus": ["0"]}, "write a list of GPU device ids"),
        ({"provider": "cuda", "onnx_instance_kind": "KIND_CPU"}, "drop onnx_instance_kind"),
        ({"provider": "cuda", "instance_count": 0}, "instance_count=0; use ≥ 1"),
    ],
)
def test_contradictory_placements_are_refused_with_the_fix(values: dict, fix: str) -> None:
    with pytest.raises(RepositoryError, match=fix) as caught:
        ModelSettings.from_mapping(values)
    assert "\n" not in str(caught.value)


def test_both_variants_place_gpu_instances_on_the_same_gpus(exported, tmp_path: Path) -> None:
    """A whole repository written with provider=cuda gpus=[0,2]: the python model and the ngc variant's ONNX
    encoder and decoder are KIND_GPU on GPUs 0 and 2, 2 instances each; the ngc BLS model, which runs no graph,
    stays KIND_CPU. Without provider=cuda the ngc ONNX models keep their KIND_GPU group with no gpus (Triton:
    every visible GPU)."""
    export_dir, manifest = exported("transformer")
    name = manifest["name"]
    settings = ModelSettings(provider="cuda", gpus=[0, 2], instance_count=2, threads=1)
    write_repository([export_dir], tmp_path / "py", settings)
    assert _groups((tmp_path / "py" / name / "config.pbtxt").read_text()) == [(GPU, 2, [0, 2])]
    write_repository([export_dir], tmp_path / "ngc", settings, variant="ngc")
    for part in ("encoder", "decoder"):
        assert _groups((tmp_path / "ngc" / f"{name}-{part}" / "config.pbtxt").read_text()) == [(GPU, 2, [0, 2])]
    assert _groups((tmp_path / "ngc" / name / "config.pbtxt").read_text()) == [(CPU, 2, [])]
    write_repository([export_dir], tmp_path / "ngc-cpu", ModelSettings(warmup=False), variant="ngc")
    assert _groups((tmp_path / "ngc-cpu" / f"{name}-decoder" / "config.pbtxt").read_text()) == [(GPU, 1, [])]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU may be visible to Triton here")
def test_the_bundled_tritonserver_refuses_gpu_instances_without_a_gpu_and_says_the_fix(exported, tmp_path) -> None:
    """The real tritonserver (2.51, pytriton wheel) reads the KIND_GPU group and, with no GPU, refuses the model
    at start; the error names the model, Triton's reason (gpu id 0) and the fix, on one line."""
    export_dir, manifest = exported("transformer")
    repo = tmp_path / "repo"
    write_repository([export_dir], repo, ModelSettings(provider="cuda", threads=1, warmup=False))
    with pytest.raises(ServerError) as caught:
        Server.start(repo, http_port=0, grpc_port=0, metrics_port=0, timeout=120)
    (line,) = [ln for ln in str(caught.value).splitlines() if "gpu id 0" in ln]
    print(f"\n{line}")
    assert line.startswith(f"model {manifest['name']} (version 1) failed to load") and line.endswith(GPU_FIX)
