"""`load`: an export directory opened for decoding in this process — its manifest read (and checksummed), one
`ExportedModel` over onnxruntime sessions per concurrent batch (`inter_threads`), the thread settings checked first.

Apart from model.py because building from a directory is a job of its own: a Triton model builds its
`ExportedModel` over another backend (serve/triton/bls_model.py) and never calls this.
"""

from __future__ import annotations

import os
from pathlib import Path

from .backend import OrtBackend, resolve_spinning, session_threads
from .errors import ExportRuntimeError
from .manifest import read_manifest
from .model import ExportedModel
from .replicas import Replicas


def load(
    directory: str | os.PathLike[str],
    threads: int | None = None,
    optimization: str | None = None,
    check_files: bool = True,
    spinning: bool | str = "auto",
    provider: str = "cpu",
    device_id: int = 0,
    inter_threads: int = 1,
    intra_threads: int | None = None,
    state: str = "auto",
) -> ExportedModel:
    """Load an export directory (`python -m export …` output) for translation: `threads` (or `intra_threads`)
    ORT intra-op threads per search (default: the manifest's, else all cores), `optimization` ORT graph
    optimisation level (disabled|basic|extended|all, default: the manifest's), `check_files` verifies sha256
    checksums, `spinning` lets ORT's idle threads spin (lower latency on dedicated cores: True both sessions',
    "decoder" the decoder's only, "shared" one spinning pool of the process for both, False none; the default
    "auto" is True where the threads of every copy fit this process's cores, else False; a pool spins only while
    a run lasts — backend.py `SPINNING`),
    `provider` cpu | cuda runs the graphs on ORT's CPU or CUDA execution provider (GPU `device_id`; needs
    onnxruntime-gpu).
    `inter_threads` > 1 is throughput mode (replicas.py): that many copies decode different batches of one
    `translate` call at once, each with `intra_threads` threads — more sentences/s for many batches, at the memory
    of another set of sessions and a slower single batch. `state`: where a search keeps its decoding state, host |
    device (I/O binding: device_state.py) | auto (the faster on the provider: backend.py `DEFAULT_STATE`)."""
    if intra_threads is not None and threads is not None and intra_threads != threads:
        raise ExportRuntimeError(f"threads={threads} and intra_threads={intra_threads}: give one (the same setting)")
    if isinstance(inter_threads, bool) or not isinstance(inter_threads, int) or not 1 <= inter_threads <= 64:
        raise ExportRuntimeError(
            f"inter_threads={inter_threads!r}: give an integer 1 … 64 (batches decoded at once, each by its own "
            "copy of the sessions; 1 = one search at a time)"
        )
    threads = intra_threads if intra_threads is not None else threads
    directory = Path(directory)
    manifest = read_manifest(directory, check_files=check_files)
    spinning = resolve_spinning(spinning, session_threads(manifest, threads), inter_threads)
    if inter_threads > 1 and spinning == "shared":  # the copies would take turns on the one pool of the process
        raise ExportRuntimeError(
            f'inter_threads={inter_threads} with spinning="shared": every copy would run on the one thread pool of '
            "the process, so batches would not decode at once; give inter_threads=1, or another spinning setting"
        )
    models = [
        ExportedModel(
            directory,
            manifest,
            OrtBackend(directory, manifest, threads, optimization, spinning, provider, device_id, state),
        )
        for _ in range(inter_threads)
    ]
    models[0].replicas = Replicas(models)
    return models[0]
