"""Write a Triton model repository for exported attention-zoo models.

    python -m serve.repository export_dir=exports/transformer-deen repo=triton_repo
    python -m serve.repository 'export_dir=[exports/transformer-deen,exports/transformer-summ]' repo=triton_repo
    python -m serve.repository export_dir=exports/transformer-deen repo=ngc_repo variant=ngc

Why: users should get a working repository without writing Triton configs or backend code. Two variants:
- `python` (default, runs on this machine's pytriton wheel): `<name>/config.pbtxt` + `<name>/<v>/model.py`, a
  Python-backend model running the export runtime; the runtime package, ONNX graphs, tokenizer and manifest are
  copied next to it, so the model directory is self-contained (numpy + onnxruntime + sentencepiece only;
  sacremoses too for a converted FSMT model's tokenizer).
  An export is data: only the files its format defines are copied, under their fixed names, so nothing an
  export holds can be imported by the model's code (serve/model_config.copy_export_files).
- `ngc` (a full NGC Triton container with the onnxruntime backend, for GPUs): `<name>-encoder` and
  `<name>-decoder` served by the `onnxruntime` backend (KIND_GPU) and `<name>`, a Python BLS model that
  tokenizes, runs the export runtime's beam search and calls the two ONNX models per step (serve/ngc.py).

Every config.pbtxt written is parsed back with Triton's model-config protobuf (shipped in tritonclient), so a
malformed config fails here with the field named instead of at server start. What a model directory consists of
(settings, config text, manifest, names, staging a model dir) is serve.model_config, which serve.ngc shares.
Each export's manifest is read (and its files hashed) once, then handed to the writer of its variant.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from export import runtime as export_runtime
from export.runtime import ExportRuntimeError
from serve.errors import ServeError
from serve.model_config import (
    ModelSettings,
    RepositoryError,
    check_name,
    copy_export_files,
    copy_model_code,
    python_config,
    read_manifest,
    staged_model_dir,
)
from serve.ngc import write_ngc_model
from serve.warmup import plan_warmup, warmup_text, write_warmup_data
from zoo.errors import one_line_errors


def write_python_model(
    export_dir: Path,
    repo: Path,
    settings: ModelSettings,
    overwrite: bool = False,
    name: str | None = None,
    manifest: export_runtime.Manifest | None = None,
) -> str:
    """One export → `<repo>/<name>/` (python variant); returns the model name. `manifest`: the export's, as
    `read_manifest` returned it (read and checked here when not given)."""
    manifest = manifest if manifest is not None else read_manifest(export_dir)
    name = check_name(name or manifest["name"])
    repo.mkdir(parents=True, exist_ok=True)
    with staged_model_dir(repo, name, overwrite) as stage:
        version_dir = stage.path / str(settings.version)
        version_dir.mkdir()
        data = [*manifest["files"], export_runtime.MANIFEST]  # the format's fixed names (read_manifest)
        copy_export_files(export_dir, manifest, version_dir, {name: name for name in data})
        copy_model_code(version_dir, "translator_model.py", settings.prices)
        plan = (
            plan_warmup(export_dir, manifest, settings.max_batch_size, settings.max_request_cost)
            if settings.warmup
            else None
        )
        write_warmup_data(stage.path, plan)
        config = python_config(name, settings, warmup=warmup_text(plan))
        (stage.path / "config.pbtxt").write_text(config, encoding="utf-8")
        stage.publish()
    return name


def write_repository(
    export_dirs: Iterable[str | Path],
    repo: str | Path,
    settings: ModelSettings | None = None,
    variant: str = "python",
    overwrite: bool = False,
) -> list[str]:
    """Write one model (python) or three (ngc: BLS + encoder + decoder) per export; returns the public names."""
    settings = settings or ModelSettings()
    settings.check()
    dirs = [Path(d) for d in export_dirs]
    if not dirs:
        raise RepositoryError("no export_dir given")
    manifests = [read_manifest(d) for d in dirs]  # every file hashed here, once
    names = [check_name(m["name"]) for m in manifests]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise RepositoryError(f"several exports are named {clash}; export them with distinct name=… (§3b)")
    repo = Path(repo)
    read = list(zip(dirs, manifests, strict=True))
    if variant == "python":
        return [write_python_model(d, repo, settings, overwrite, manifest=m) for d, m in read]
    if variant == "ngc":
        return [write_ngc_model(d, repo, settings, overwrite, manifest=m) for d, m in read]
    raise RepositoryError(f"variant={variant!r}; use python or ngc")


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def main() -> None:
    @hydra.main(config_path="../conf", config_name="serve", version_base="1.3")
    def run(cfg: DictConfig) -> None:
        with one_line_errors(ServeError, ExportRuntimeError):
            settings = ModelSettings.from_mapping(OmegaConf.to_container(cfg.triton, resolve=True))  # type: ignore[arg-type]
            names = write_repository(
                _as_list(cfg.export_dir), cfg.repo, settings, str(cfg.variant), bool(cfg.overwrite)
            )
        print(f"wrote {', '.join(names)} ({cfg.variant} variant) to {cfg.repo}")
        print(f"start it with: python -m serve.start repo={cfg.repo}")

    run()


if __name__ == "__main__":
    main()
