"""What a Triton model directory of this project consists of, shared by both repository variants
(`serve.repository`: python; `serve.ngc`: the NGC container's onnxruntime + BLS models).

The per-model settings, config.pbtxt text for the Python-backend text model and its parts, the parser that reads
every written config back with Triton's ModelConfig protobuf (shipped in tritonclient) so a malformed config fails
here with the field named instead of at server start, the export's validated manifest, the export's files copied
(only those its format defines, checked as they are copied), model names, the code copied next to every model.py
(the runtime package among them), and staging a model directory that is swapped in when complete.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from export import runtime as export_runtime
from export.runtime.manifest import sha256_read
from export.runtime.search import DEFAULT_EXPRESS_COST, DEFAULT_MAX_EXECUTE_COST, DEFAULT_MAX_REQUEST_COST
from export.staging import StagedDirectory, staged_directory
from serve.errors import ServeError
from serve.triton.model_prices import PRICES_FILE, PriceRule

HERE = Path(__file__).resolve().parent
TRITON_MODELS = HERE / "triton"
# the copy of the package `export` (its __init__ and runtime/) in every model version dir; model_common.py puts this
# folder first on sys.path, so the served models import `export.runtime` like any other caller
PACKAGES_DIR = "packages"
COMMON_FILE = "model_common.py"  # request handling shared by both variants' model.py
METRICS_FILE = "model_metrics.py"  # the zoo_* Prometheus metrics model_common reports
LANES_FILE = "model_lanes.py"  # the express and bulk lanes model_common runs requests in
REQUESTS_FILE = "model_requests.py"  # reading a request: parameters, texts, target prefix
OUTPUTS_FILE = "model_outputs.py"  # writing a translation's response: OUTPUT and the optional outputs
PRICE_RULE_FILE = "model_prices.py"  # what a request costs an instance: the unit the lanes count
# python -m serve.bench.prices on the test suite's smoke transformer: the price rule a repository gets unless
# `prices=` names a calibration of the model it serves
DEFAULT_PRICES = TRITON_MODELS / "default_prices.json"
# copied next to every model.py, from serve/triton/
SHARED_MODEL_FILES = (COMMON_FILE, METRICS_FILE, LANES_FILE, REQUESTS_FILE, OUTPUTS_FILE, PRICE_RULE_FILE)
INPUT, OUTPUT, TRUNCATED = "TEXT", "OUTPUT", "TRUNCATED"
TARGET, SCORES, TOKEN_SCORES = "TARGET", "SCORES", "TOKEN_SCORES"  # forced decoding in, scores out
PREFIX = "PREFIX"  # per source the target text a translation starts with
ALIGNMENT = "ALIGNMENT"  # per hypothesis and target token its source token (return_alignments=true)
KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO")


class RepositoryError(ServeError):
    """A repository that cannot be written (bad export dir, name clash, invalid settings)."""


@dataclass
class ModelSettings:
    """Per-model Triton settings (conf/serve.yaml `triton:`)."""

    version: int = 1
    version_policy: Any = "latest"
    max_batch_size: int = 64
    dynamic_batching: bool = True
    preferred_batch_size: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    max_queue_delay_microseconds: int = 2000
    instance_count: int = 1  # instances in all (KIND_CPU), or on each GPU of `gpus` (KIND_GPU: Triton's count)
    instance_kind: str | None = None  # None: follows provider (`model_kind`); given, it must agree with it
    onnx_instance_kind: str = "KIND_GPU"  # ngc variant: its onnxruntime-backend encoder and decoder models
    provider: str = "cpu"  # where the python variant's runtime runs: cpu | cuda (onnxruntime-gpu)
    gpus: list[int] | None = None  # device ids of the GPU instances; None: [0] with provider=cuda (`device_ids`)
    threads: int = 0
    optimization: str | None = None
    spinning: bool | str = "auto"  # whose ORT threads spin-wait: "auto" | False | True | "decoder" | "shared"
    check_files: bool = True
    max_request_cost: int = DEFAULT_MAX_REQUEST_COST  # rows × beam × max output tokens one request may ask for
    max_execute_cost: int = DEFAULT_MAX_EXECUTE_COST  # the most one lane batch runs at once (the rest waits)
    express_cost: int = DEFAULT_EXPRESS_COST  # requests up to this run in the express lane, beside the heavy ones
    max_queued_cost: int | None = None  # work one lane of one instance may hold (None: 4 × max_execute_cost);
    # beyond it a request is answered UNAVAILABLE (retry)
    warmup: bool = True  # model_warmup: each instance translates a held-out sentence before the model is ready
    prices: str | None = None  # a `python -m serve.bench.prices` report for the served model (None: DEFAULT_PRICES)

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> ModelSettings:
        """Settings from a config node; a null value is the setting's default (conf/serve.yaml's costs)."""
        values = {key: value for key, value in (values or {}).items() if value is not None}
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise RepositoryError(f"unknown model setting(s) {unknown}; known: {sorted(f.name for f in fields(cls))}")
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        for key in ("instance_kind", "onnx_instance_kind"):
            value = getattr(self, key)
            if value not in KINDS and not (key == "instance_kind" and value is None):
                raise RepositoryError(f"{key}={value!r}; use one of {KINDS}")
        try:
            self.spinning = export_runtime.check_spinning(self.spinning)  # "decoder" from a CLI: the runtime's own
        except export_runtime.ExportRuntimeError:
            raise RepositoryError(
                f"spinning={self.spinning!r}; use auto, false, true, decoder or shared (auto: both sessions' idle "
                "threads spin within a run where instance_count × threads fit the cores, else none; decoder: only "
                "the decoder session's; shared: one spinning pool of the instance's process runs both sessions)"
            ) from None
        if self.provider not in export_runtime.PROVIDERS:
            raise RepositoryError(f"provider={self.provider!r}; use cpu or cuda")
        if int(self.instance_count) < 1:
            raise RepositoryError(f"instance_count={self.instance_count}; use ≥ 1 (with KIND_GPU: instances per GPU)")
        self.check_placement()
        if self.max_batch_size < 1:
            raise RepositoryError("max_batch_size must be ≥ 1 (requests carry a batch dimension)")
        if self.max_request_cost < 1 or self.max_execute_cost < self.max_request_cost:
            raise RepositoryError("max_request_cost must be ≥ 1 and max_execute_cost ≥ max_request_cost")
        if not 0 <= self.express_cost <= self.max_request_cost:
            raise RepositoryError("express_cost must be in [0, max_request_cost]")
        if self.max_queued_cost is not None and self.max_queued_cost < self.max_execute_cost:
            raise RepositoryError("max_queued_cost must be ≥ max_execute_cost (a lane must hold one batch)")
        if self.version < 1:
            raise RepositoryError("version must be ≥ 1 (Triton version directories are positive integers)")
        self.preferred_batch_size = sorted({int(b) for b in self.preferred_batch_size if int(b) <= self.max_batch_size})

    def check_placement(self) -> None:
        """Where the instances run, one rule per contradiction: `provider` decides (cuda: KIND_GPU instances on
        `gpus`, default [0]; cpu: KIND_CPU and no gpus); `instance_kind` may restate it, never contradict it;
        `gpus` lists distinct device ids ≥ 0. The ngc variant's ONNX models (`onnx_instance_kind`, its own
        default KIND_GPU) must be on GPUs too when provider=cuda asks for them."""
        cuda = self.provider == "cuda"
        if self.instance_kind == "KIND_AUTO":
            raise RepositoryError(
                f"instance_kind=KIND_AUTO lets Triton pick CPU or GPU, but provider={self.provider} decides where "
                "the model runs: drop instance_kind (it follows provider)"
            )
        if self.instance_kind == "KIND_CPU" and cuda:
            raise RepositoryError(
                "provider=cuda runs the model on a GPU, but instance_kind=KIND_CPU asks Triton for CPU instances: "
                "drop instance_kind (provider=cuda makes them KIND_GPU), or use provider=cpu"
            )
        if self.instance_kind == "KIND_GPU" and not cuda:
            raise RepositoryError(
                "instance_kind=KIND_GPU asks Triton for GPU instances, but provider=cpu runs the model on the CPU: "
                "add provider=cuda (it makes them KIND_GPU), or drop instance_kind"
            )
        if cuda and self.onnx_instance_kind != "KIND_GPU":
            raise RepositoryError(
                f"provider=cuda serves on GPUs, but onnx_instance_kind={self.onnx_instance_kind} puts the ngc "
                "variant's ONNX models elsewhere: drop onnx_instance_kind (its default is KIND_GPU)"
            )
        if self.gpus is None:
            return
        gpus = self.gpus
        if (
            isinstance(gpus, str | bytes)
            or not isinstance(gpus, Sequence)
            or any(isinstance(g, bool) or not isinstance(g, int) for g in gpus)
        ):
            raise RepositoryError(f"gpus={gpus!r}; write a list of GPU device ids, e.g. gpus=[0] or gpus=[0,1]")
        if not gpus:
            raise RepositoryError("gpus=[] lists no GPU; drop gpus (provider=cuda uses [0]) or list ids, e.g. [0,1]")
        if any(g < 0 for g in gpus):
            raise RepositoryError(f"gpus={list(gpus)}: device ids are ≥ 0 (as nvidia-smi numbers them), e.g. [0,1]")
        twice = sorted({g for g in gpus if list(gpus).count(g) > 1})
        if twice:
            raise RepositoryError(
                f"gpus={list(gpus)} lists GPU {twice[0]} more than once; list each GPU once "
                "(instance_count is the number of instances on each)"
            )
        if not cuda:
            raise RepositoryError(
                f"gpus={list(gpus)} places GPU instances, but provider=cpu runs the model on the CPU: "
                "add provider=cuda, or drop gpus"
            )
        self.gpus = [int(g) for g in gpus]

    @property
    def model_kind(self) -> str:
        """The Triton instance kind of the model that runs the export runtime (python variant): provider's."""
        return "KIND_GPU" if self.provider == "cuda" else "KIND_CPU"

    def device_ids(self) -> list[int]:
        """The GPUs a KIND_GPU group is placed on: `gpus`, or [0] with provider=cuda; [] with provider=cpu (the
        ngc variant's default KIND_GPU ONNX models then get Triton's default: `instance_count` on every GPU)."""
        if self.gpus is not None:
            return list(self.gpus)
        return [0] if self.provider == "cuda" else []

    def instance_group_text(self, kind: str) -> str:
        """`instance_group` of a model with instances of `kind`: count per GPU, on `device_ids()`, for KIND_GPU."""
        ids = self.device_ids() if kind == "KIND_GPU" else []
        gpus = f" gpus: [ {', '.join(str(i) for i in ids)} ]" if ids else ""
        return f"instance_group [ {{ count: {int(self.instance_count)} kind: {kind}{gpus} }} ]"

    def version_policy_text(self) -> str:
        policy = self.version_policy
        if policy == "latest":
            return "version_policy: { latest: { num_versions: 1 } }"
        if policy == "all":
            return "version_policy: { all: {} }"
        if isinstance(policy, Sequence) and not isinstance(policy, str) and policy:
            return f"version_policy: {{ specific: {{ versions: [{', '.join(str(int(v)) for v in policy)}] }} }}"
        raise RepositoryError(f"version_policy={policy!r}; use latest, all or a list of versions")


def pbtxt_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid protobuf text-format string literal


def parameters_text(params: dict[str, Any]) -> str:
    return "\n".join(
        f"parameters: {{ key: {pbtxt_string(k)} value: {{ string_value: {pbtxt_string(str(v))} }} }}"
        for k, v in params.items()
    )


def batching_text(settings: ModelSettings) -> str:
    if not settings.dynamic_batching:
        return ""
    preferred = ", ".join(str(b) for b in settings.preferred_batch_size)
    return (
        "dynamic_batching {\n"
        + (f"  preferred_batch_size: [ {preferred} ]\n" if preferred else "")
        + f"  max_queue_delay_microseconds: {int(settings.max_queue_delay_microseconds)}\n}}"
    )


def text_io_text() -> str:
    """The public interface of both variants (serve/triton/model_common.py): a batch of strings in, a batch of
    strings (+ flags) out; n-best lists widen OUTPUT/SCORES to [batch, n], the optional PREFIX input gives each
    source's output its first words, and the optional TARGET input turns a request into forced decoding (SCORES,
    TOKEN_SCORES). An optional output of serve/triton/model_outputs.py is declared here too."""
    return (
        f'input [ {{ name: "{INPUT}" data_type: TYPE_STRING dims: [ 1 ] }},\n'
        f'        {{ name: "{TARGET}" data_type: TYPE_STRING dims: [ 1 ] optional: true }},\n'
        f'        {{ name: "{PREFIX}" data_type: TYPE_STRING dims: [ 1 ] optional: true }} ]\n'
        f'output [ {{ name: "{OUTPUT}" data_type: TYPE_STRING dims: [ -1 ] }},\n'
        f'         {{ name: "{TRUNCATED}" data_type: TYPE_BOOL dims: [ 1 ] }},\n'
        f'         {{ name: "{SCORES}" data_type: TYPE_FP32 dims: [ -1 ] }},\n'
        f'         {{ name: "{TOKEN_SCORES}" data_type: TYPE_FP32 dims: [ -1 ] }},\n'
        f'         {{ name: "{ALIGNMENT}" data_type: TYPE_INT32 dims: [ -1, -1 ] }} ]'
    )


def parse_config(text: str, where: str = "config.pbtxt") -> model_config_pb2.ModelConfig:
    """Parse config.pbtxt text with Triton's ModelConfig protobuf; a clear error on any unknown/malformed field."""
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise RepositoryError(f"{where} is not a valid Triton model config: {exc}") from exc


def python_config(
    name: str,
    settings: ModelSettings,
    extra: dict[str, Any] | None = None,
    kind: str | None = None,
    warmup: str = "",
) -> str:
    """config.pbtxt of a Python-backend text model (the `python` variant, and the BLS model of `ngc`);
    `warmup` is a `model_warmup` block (serve/warmup.py)."""
    params = {
        "provider": settings.provider,
        "threads": settings.threads,
        "optimization": settings.optimization or "",
        "spinning": export_runtime.spinning_text(settings.spinning),
        "check_files": str(settings.check_files).lower(),
        "max_request_cost": int(settings.max_request_cost),
        "max_execute_cost": int(settings.max_execute_cost),
        "express_cost": int(settings.express_cost),
        **({"max_queued_cost": int(settings.max_queued_cost)} if settings.max_queued_cost is not None else {}),
        **(extra or {}),
    }
    parts = [
        f"name: {pbtxt_string(name)}",
        'backend: "python"',
        f"max_batch_size: {int(settings.max_batch_size)}",
        settings.version_policy_text(),
        text_io_text(),
        batching_text(settings),
        settings.instance_group_text(kind or settings.model_kind),
        parameters_text(params),
        warmup,
    ]
    text = "\n".join(p for p in parts if p) + "\n"
    parse_config(text, f"{name}/config.pbtxt")
    return text


def read_manifest(export_dir: Path) -> export_runtime.Manifest:
    """The export's manifest (schema: export.runtime.Manifest), validated by the runtime's own reader before
    anything is copied: every file name plain and inside the export, every referenced file listed, every listed
    file's sha256 checked. An export is untrusted input — a manifest key like `../../x` must never write outside
    the repository."""
    try:
        return export_runtime.read_manifest(export_dir, check_files=True)
    except export_runtime.ExportedModelError as exc:
        raise RepositoryError(f"{export_dir}: {exc}") from exc


def copy_export_files(export_dir: Path, manifest: export_runtime.Manifest, target: Path, names: dict[str, str]) -> None:
    """The export's files `names` (name in the export → name in `target`) copied into a model directory, each
    read as a regular file (`open_regular`: no symlink, device or FIFO) and checked against its sha256 as it is
    copied, so what lands in a model directory is exactly what the manifest lists even if the export changed
    since it was read. `manifest.json` is written from the manifest as validated, not copied. Only names of
    the export format reach here (read_manifest refuses any other listed file): nothing importable."""
    for name, dest in names.items():
        if name == export_runtime.MANIFEST:
            text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
            (target / dest).write_text(text, encoding="utf-8")
            continue
        try:
            with export_runtime.open_regular(export_dir / name) as source, (target / dest).open("xb") as out:
                digest = sha256_read(source, copy_to=out)
        except export_runtime.ExportedModelError as exc:
            raise RepositoryError(f"{export_dir}: {exc}") from None
        if digest != manifest["files"][name]:
            raise RepositoryError(
                f"{export_dir / name} changed while it was copied (its sha256 no longer matches the manifest); "
                "write the repository again from an export nothing else is writing to"
            )


def copy_model_code(version_dir: Path, model_file: str, prices: str | None = None) -> None:
    """A text model's code into its version directory: serve/triton/`model_file` as model.py, the files every
    model.py imports, its price rule's calibration (`prices`, else DEFAULT_PRICES, checked) as prices.json, and
    the package `export` as `packages/export/` — its `__init__.py` (which imports only the runtime) and the
    runtime package, whole, under their own import path, so the model imports `export.runtime` as every other
    caller does (caches of compiled files are left behind)."""
    calibration = Path(prices) if prices else DEFAULT_PRICES
    try:
        PriceRule.read(calibration)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RepositoryError(
            f"prices={calibration}: not a price calibration ({exc}); write one with python -m serve.bench.prices "
            "<export> --out <file>"
        ) from None
    shutil.copy2(calibration, version_dir / PRICES_FILE)
    shutil.copy2(TRITON_MODELS / model_file, version_dir / "model.py")
    for shared in SHARED_MODEL_FILES:
        shutil.copy2(TRITON_MODELS / shared, version_dir / shared)
    runtime = Path(export_runtime.__file__).parent
    package = version_dir / PACKAGES_DIR / runtime.parent.name
    package.mkdir(parents=True)
    shutil.copy2(runtime.parent / "__init__.py", package / "__init__.py")
    shutil.copytree(runtime, package / runtime.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def check_name(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or any(c.isspace() for c in name):
        raise RepositoryError(f"model name {name!r} is not usable as a Triton model directory name")
    return name


def _exists_error(target: Path) -> RepositoryError:
    return RepositoryError(f"{target} exists; pass overwrite=true to replace it")


def staged_model_dir(repo: Path, name: str, overwrite: bool) -> contextlib.AbstractContextManager[StagedDirectory]:
    """A model directory `<repo>/<name>` built under a temporary name and swapped in by `publish()`
    (export/staging.py: the old model is deleted only after the new one is in place; an existing one is
    replaced only with `overwrite`). Staged in the repository's parent, so a server polling the repository never
    sees the temporary or the replaced directory as a model."""
    return staged_directory(
        repo / name, overwrite=overwrite, exists_error=_exists_error, staging_dir=repo.parent, mode=0o755
    )
