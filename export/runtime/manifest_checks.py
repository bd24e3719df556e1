"""The checks `read_manifest` applies to an export directory, each failing with one line that names the key.

Why they are this strict: an export is untrusted input (downloaded, shared), and the server that loads it runs it.
- Files: an export holds exactly the files its format defines, under fixed names (`EXPORT_FILES`): nothing
  else it lists can reach a model directory, so no `*.py`, `*.so` or `.pth` of an export is ever importable
  beside the model's code. Each is a plain name inside the directory and a regular file — not a symlink (its
  target may lie anywhere), a device or a FIFO (a read that never ends); `open_regular` refuses the others
  without a window between the check and the read.
- Weights apart (format 4): a graph names its weights' file inside itself (ONNX external data), where the runtime,
  which parses no ONNX, does not look. onnxruntime (the pinned 1.31) opens only files under the graph's own
  directory: no absolute path, no '..', no symbolic link out of it (tests/test_export_runtime.py); a served
  model directory holds exactly the format's files (serve.repository copies them, checked), so there a graph can
  name none but those.
- Numbers: a value of the right type can still take a server down or make every request fail
  (`runtime.threads=300` starts 601 OS threads; `max_positions=2^62`, `vocab.size=2^40`, negative ids or a NaN
  search default load and then fail each request). Every number the runtime reads has a stated range
  (`MANIFEST_LIMITS`, ids below `vocab.size`, search defaults within `SEARCH_LIMITS`), generous for this
  project's models (the paper size: a 32k vocabulary, 1024 positions) and tight enough that none can exhaust
  a machine. Informational keys (sizes, timings, verification reports) are not read by the runtime and not
  checked here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ExportedModelError
from .search import SEARCH_LIMITS, SearchError, search_setting

MANIFEST = "manifest.json"
REEXPORT = "re-export the model with `python -m export`"
# the files of an export besides its manifest: the key naming each, and the one name it may have
EXPORT_FILES = {
    "graphs.encoder.file": "encoder.onnx",
    "graphs.decoder.file": "decoder.onnx",
    "graphs.encoder.data": "encoder.onnx.data",
    "graphs.decoder.data": "decoder.onnx.data",
    "tokenizer": "tokenizer.model",
    "heldout": "heldout.json",
    "shortlist.file": "shortlist.npz",
}
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few kB (head importances included); more is not a manifest
MAX_NAME = 128  # a model name: ASCII letters, digits, '_', '.', '-', a letter or digit first (a directory name)
# integer keys → [lowest, highest]; `runtime.threads` may also be null (ORT's default: all cores)
MANIFEST_LIMITS: dict[str, tuple[int, int]] = {
    "vocab.size": (4, 1 << 20),
    "max_positions": (4, 1 << 16),
    "runtime.threads": (0, 64),  # ORT intra-op threads per session; 0 = ORT's default
    "generation.max_tokens": (1, 1 << 20),
    "generation.max_sentences": (1, 1 << 16),
    "caches[].layer": (0, 1023),
    "caches[].shape[]": (1, 1 << 16),  # a fixed axis (dynamic ones are named, CACHE_AXES)
    "shared_weights[].offset": (0, 1 << 40),
    "shared_weights[].shape[]": (0, 1 << 24),
}
VOCAB_IDS = ("vocab.pad_id", "vocab.unk_id", "vocab.bos_id", "vocab.eos_id")  # each in [0, vocab.size)
OPTIMIZATION_LEVEL_NAMES = ("disabled", "basic", "extended", "all")  # backend.OPTIMIZATION_LEVELS' keys (ORT-free)
CACHE_KINDS = ("self", "cross")
CACHE_AXES = ("batch", "sources", "steps", "src_len")
CACHE_DTYPES = ("float32", "float16", "float64")
MAX_CACHE_CELL = 1 << 24  # the product of a cache's fixed axes: one row's state at one position


def bad(key: str, problem: str) -> ExportedModelError:
    return ExportedModelError(f"{MANIFEST}: {key} {problem}; {REEXPORT}")


def lookup(m: dict[str, Any], path: str) -> Any:
    """`m[a][b]…` for path "a.b…", or a one-line error naming the key."""
    node: Any = m
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ExportedModelError(f"{MANIFEST}: missing key {path!r}; {REEXPORT}")
        node = node[part]
    return node


def field(m: dict[str, Any], path: str, kind: type | tuple[type, ...]) -> Any:
    """`m[a][b]…` for path "a.b…", of the given type, or a one-line error naming the key."""
    node = lookup(m, path)
    if not isinstance(node, kind) or (isinstance(node, bool) and kind is int):
        raise ExportedModelError(f"{MANIFEST}: {path!r} has the wrong type ({type(node).__name__}); {REEXPORT}")
    return node


def bounded(value: Any, key: str, low: int, high: int) -> int:
    """An integer manifest value within [low, high], else a one-line error naming the key and its range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
        raise bad(f"{key}={shown}", f"is out of range (allowed: an integer in [{low}, {high}])")
    return value


def plain_name(value: Any, key: str) -> str:
    """A file name the manifest may refer to: a plain name inside the export directory. `../x`, `/etc/x` or
    `sub/x` would make loading or serving it read or write outside the directory."""
    if (
        not isinstance(value, str)
        or not value
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or "\x00" in value
        or Path(value).is_absolute()
    ):
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "…"
        raise ExportedModelError(
            f"{MANIFEST}: {key}={shown} is not a plain file name inside the export "
            "directory (no separators, no '..', not absolute); the export is malformed or "
            "tampered with — re-export it with `python -m export`"
        )
    return value


def export_file(name: str, key: str) -> str:
    """A name listed in `files`: one the export format defines (EXPORT_FILES), nothing else."""
    plain_name(name, key)
    if name not in EXPORT_FILES.values():
        shown = repr(name) if len(name) <= 60 else repr(name[:60]) + "…"
        raise ExportedModelError(
            f"{MANIFEST}: files lists {shown}, which is not a file of the export format (allowed: "
            f"{', '.join(sorted(EXPORT_FILES.values()))}); an export is data — {REEXPORT}"
        )
    return name


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file itself, else ExportedModelError naming it: a symlink
    (its target may lie outside the export), a device, a FIFO or a directory is refused without being opened
    (opening a device may act on it). O_NOFOLLOW, and the opened descriptor being the very file that was checked
    (same device and inode), close the window in which the name could be swapped; O_NONBLOCK: a FIFO swapped
    in does not block the open."""
    try:
        if path.is_symlink():
            raise ExportedModelError(
                f"{path} is a symbolic link; an export holds regular files only — copy the file itself into it"
            )
        checked = os.lstat(path)
        if not path.is_file():  # not a symlink: this is the file itself
            raise ExportedModelError(
                f"{path} is not a regular file (a directory, device or FIFO); an export holds regular files only"
            )
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ExportedModelError(f"{path} is missing from the export") from None
    except (OSError, ValueError) as exc:
        raise ExportedModelError(f"cannot read {path}: {exc}") from None
    if not os.path.samestat(os.fstat(fd), checked):
        os.close(fd)
        raise ExportedModelError(f"{path} was replaced while it was read; read the export again")
    return os.fdopen(fd, "rb")


def read_limited(path: Path, limit: int) -> bytes:
    """A regular file's bytes (open_regular), refused when longer than `limit`."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ExportedModelError(f"{path} is over {limit >> 20} MiB; it is not a file of an export")
    return data


def check_numbers(m: dict[str, Any]) -> None:
    """Every number the runtime reads, against its range (module docstring)."""
    size = bounded(lookup(m, "vocab.size"), "vocab.size", *MANIFEST_LIMITS["vocab.size"])
    for key in VOCAB_IDS:
        bounded(lookup(m, key), key, 0, size - 1)
    positions = bounded(lookup(m, "max_positions"), "max_positions", *MANIFEST_LIMITS["max_positions"])
    table = m["model_config"].get("max_positions") if isinstance(m.get("model_config"), dict) else None
    if isinstance(table, int) and not isinstance(table, bool) and positions > table:
        # sources are cut to max_positions/2 tokens: beyond the graphs' table every longer one would fail in ORT
        raise bad(
            f"max_positions={positions}",
            f"is over the exported position table (model_config.max_positions={table}); set it to at most {table}",
        )
    if not _model_name(m["name"]):
        shown = repr(m["name"])[:60]
        raise bad(
            f"name={shown}", "is not a model name (1–128 ASCII letters, digits, '_', '.', '-'; a letter or digit first)"
        )
    _check_runtime(m.get("runtime", {}))
    _check_generation(m.get("generation", {}))


def _model_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME
        and name.isascii()
        and name[0].isalnum()
        and all(c.isalnum() or c in "_.-" for c in name)
    )


def sha256_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _check_runtime(runtime: Any) -> None:
    if not isinstance(runtime, dict):
        raise bad("runtime", "is not an object")
    if runtime.get("threads") is not None:
        bounded(runtime["threads"], "runtime.threads", *MANIFEST_LIMITS["runtime.threads"])
    level = runtime.get("graph_optimization_level", "all")
    if level not in OPTIMIZATION_LEVEL_NAMES:
        raise bad(f"runtime.graph_optimization_level={str(level)[:40]!r}", f"is not one of {OPTIMIZATION_LEVEL_NAMES}")


def _check_generation(gen: Any) -> None:
    if not isinstance(gen, dict):
        raise bad("generation", "is not an object")
    for name in SEARCH_LIMITS:
        if name not in gen:
            continue
        if isinstance(gen[name], bool) or not isinstance(gen[name], (int, float)):
            raise bad(f"generation.{name}", f"is not a number ({type(gen[name]).__name__})")
        try:
            search_setting(name, gen[name])
        except SearchError as exc:  # "<name>=<value> is out of range; allowed: …"
            raise ExportedModelError(f"{MANIFEST}: generation.{exc}; {REEXPORT}") from None
    for key in ("max_tokens", "max_sentences"):
        if key in gen:
            bounded(gen[key], f"generation.{key}", *MANIFEST_LIMITS[f"generation.{key}"])


def check_cache(cache: Any, key: str) -> None:
    """One `caches` entry: a name, a kind, a layer, fixed axes within range and named dynamic ones, a numeric
    dtype — what the runtime sizes its stores from."""
    if not isinstance(cache, dict) or not {"name", "kind", "shape", "dtype"} <= cache.keys():
        raise ExportedModelError(f"{MANIFEST}: {key} needs name, kind, shape and dtype; {REEXPORT}")
    if not isinstance(cache["name"], str) or cache["kind"] not in CACHE_KINDS:
        raise bad(f"{key}.kind", f"is not one of {CACHE_KINDS} (or its name is not a string)")
    if "layer" in cache:
        bounded(cache["layer"], f"{key}.layer", *MANIFEST_LIMITS["caches[].layer"])
    shape = cache["shape"]
    if not isinstance(shape, list) or not shape or len(shape) > 8:
        raise bad(f"{key}.shape", "is not a list of 1–8 axes")
    fixed = []
    for j, axis in enumerate(shape):
        if isinstance(axis, str):
            if axis not in CACHE_AXES:
                raise bad(f"{key}.shape[{j}]={axis[:20]!r}", f"is not one of {CACHE_AXES}")
        else:
            fixed.append(bounded(axis, f"{key}.shape[{j}]", *MANIFEST_LIMITS["caches[].shape[]"]))
    if math.prod(fixed) > MAX_CACHE_CELL:
        raise bad(f"{key}.shape", f"has {math.prod(fixed)} elements per row and position (allowed: {MAX_CACHE_CELL})")
    if cache["dtype"] not in CACHE_DTYPES:
        raise bad(f"{key}.dtype={str(cache['dtype'])[:20]!r}", "is not a numeric dtype this runtime stores")
