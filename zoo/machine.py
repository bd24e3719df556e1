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

import torch


def _cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform.processor()."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _version(package: str) -> str | None:
    for name in (package, f"{package}-gpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def accelerator(device: str | None = None) -> str | None:
    """The accelerator's name when `device` (or, with None, the default device) is a GPU, else None."""
    wants_gpu = device is None or str(device).startswith("cuda") or device == "auto"
    if wants_gpu and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return None


def machine_class(info: dict[str, Any]) -> str:
    """The comparability key of a machine: `gpu:<name>` when an accelerator trained it, else `cpu:<model>`."""
    return f"gpu:{info['accelerator']}" if info.get("accelerator") else f"cpu:{info['cpu_model']}"


def quality_class(machine_class_name: str) -> str:
    """What records must share to be compared on quality: any CPU trains the same model (float results differ
    by ~1e-5 between CPU models, far below seed-to-seed variance), so a suite can grow over sessions on
    whichever CPU a session gets; an accelerator (its own numerics, bf16 recipes) keeps its own class.
    Timings never cross CPU models: speed results are stored per machine."""
    return "cpu" if machine_class_name.startswith("cpu:") else machine_class_name


def describe_machine(device: str | None = None) -> dict[str, Any]:
    """A JSON-able description of this machine as a training or timing process sees it."""
    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
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


__all__ = ["accelerator", "describe_machine", "machine_class", "quality_class"]
