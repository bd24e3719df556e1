"""What machine a measurement was made on: CPU model, cores, threads, accelerator, library versions.

Quality is deterministic across machines for a fixed seed only up to floating-point kernels, and train
minutes and sentences/s are not comparable at all between a 2-core CPU and a GPU. Every run directory and
every results record therefore names its machine, and a table refuses to mix machine classes
(`machine_class`): one CPU model, or one accelerator model.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform.processor()."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


ISA_LEVELS = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))  # widest first


def cpu_signature() -> str | None:
    """Family, model and widest vector ISA of the CPU, from /proc/cpuinfo (None elsewhere): its marketing name is
    not enough — "AMD EPYC" names a Zen 3 with AVX2 and a Zen 5 with AVX-512, whose matmul kernels differ by 2×."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return None
    fields: dict[str, str] = {}
    for line in cpuinfo.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if not key and fields:  # the first processor's block is enough
            break
        fields.setdefault(key, value.strip())
    if "cpu family" not in fields:
        return None
    flags = set(fields.get("flags", "").split())
    isa = next((name for flag, name in ISA_LEVELS if flag in flags), "no AVX2")
    return f"family {fields['cpu family']} model {fields.get('model', '?')}, {isa}"


def _version(package: str) -> str | None:
    for name in (package, f"{package}-gpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def accelerator(device: str | None = None) -> str | None:
    """The accelerator's name when `device` (or, with None, the default device) is a GPU, else None."""
    import torch  # here, not at the top: the CLIs that only read this module's CPU names load no torch

    wants_gpu = device is None or str(device).startswith("cuda") or device == "auto"
    if wants_gpu and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return None


def machine_class(info: dict[str, Any]) -> str:
    """The comparability key of a machine: `gpu:<name>` when an accelerator trained it, else `cpu:<model>` with the
    CPU's family, model and ISA where the record has them (records made before they were recorded lack them)."""
    if info.get("accelerator"):
        return f"gpu:{info['accelerator']}"
    signature = info.get("cpu_signature")
    return f"cpu:{info['cpu_model']}" + (f" ({signature})" if signature else "")


def quality_class(machine_class_name: str) -> str:
    """What records must share to be compared on quality: any CPU trains the same model (float results differ
    by ~1e-5 between CPU models, far below seed-to-seed variance), so a suite can grow over sessions on
    whichever CPU a session gets; an accelerator (its own numerics, bf16 recipes) keeps its own class.
    Timings never cross CPU models: speed results are stored per machine."""
    return "cpu" if machine_class_name.startswith("cpu:") else machine_class_name


def describe_machine(device: str | None = None) -> dict[str, Any]:
    """A JSON-able description of this machine as a training or timing process sees it."""
    import torch

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_signature": cpu_signature(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "accelerator": accelerator(device),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": _version("onnxruntime"),
    }
    info["class"] = machine_class(info)
    return info


__all__ = ["accelerator", "cpu_model", "cpu_signature", "describe_machine", "machine_class", "quality_class"]
