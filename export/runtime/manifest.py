"""manifest.json of an export directory: its schema, written down once, and the one reader that checks it.

export/manifest.py builds the file, `read_manifest` below checks what the runtime needs, the repository writers
(serve/) copy what it lists, the Triton models (in-process and BLS) load through it, the tests read it. It lives in
the runtime because the runtime is what every reader can import: a Triton model gets a copy of this package and
nothing else of the project. The key order of the file is the order of these declarations.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, BinaryIO, TypedDict, get_origin, get_type_hints

import numpy as np

from .errors import ExportedModelError
from .manifest_checks import (
    EXPORT_FILES,
    MANIFEST,
    MANIFEST_LIMITS,
    MAX_MANIFEST_BYTES,
    bad,
    bounded,
    check_cache,
    check_numbers,
    export_file,
    field,
    open_regular,
    plain_name,
    read_limited,
    sha256_digest,
)

RUNTIME_FORMAT = 4  # 2: the host stores the growing self caches; the graph gathers rows by `history`
# 3: the decoder graph of an export with a vocabulary shortlist takes `vocab_rows`; exports without one are format 2
# 4: each graph's weights in a file of their own (`graphs.*.data`, ONNX external data)
OLDEST_RUNTIME_FORMAT = 2
NEXT_PREFIX = "next."  # decoder output name prefix of what a step adds to a self-attention state
ALIGNMENT_OUTPUT = "alignment"  # decoder output: one layer's head-averaged cross-attention weights [batch, src_len]


class _GraphKeys(TypedDict):
    file: str  # a plain file name inside the export, listed in `files`
    ir_version: int
    opset: int
    inputs: list[str]  # the graph's actual I/O (the exporter drops inputs a mechanism never reads)
    outputs: list[str]


class GraphInfo(_GraphKeys, total=False):
    data: str  # the file of its weights (ONNX external data: `file` names it), listed; exports before format 4 lack it
    # the decoder's fused self-attention: onnxruntime's kernel for steps of at most this many rows, written out beyond
    # (export/self_attention_by_rows.py); absent where the graph has none (fused_attention none/cross, older exports)
    self_attention_kernel_rows: int


class Graphs(TypedDict):
    encoder: GraphInfo
    decoder: GraphInfo


class Vocab(TypedDict):
    size: int
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int


class CacheEntry(TypedDict):
    """One cached tensor of one decoder layer (export/graph.py CacheSpec.to_dict)."""

    name: str  # graph I/O name, e.g. "L0.self.k"
    layer: int
    kind: str  # "self" | "cross"
    key: str  # the mechanism's own name, e.g. "k"
    shape: list[int | str]  # ints for fixed axes, "batch" / "sources" / "steps" / "src_len" for dynamic ones
    dtype: str


class CheckpointRef(TypedDict):
    path: str
    sha256: str


class _HeadsKeys(TypedDict):
    num_heads: int  # heads in the exported graph
    head_dim: int
    kept: list[int]  # original head indices


class HeadsInfo(_HeadsKeys, total=False):
    pruned: list[int]  # original head indices the plan leaves out (removed, or gated off with remove_heads=false);
    # exports before it lack the key


class SizeInfo(TypedDict):
    before: dict[str, Any]  # zoo.flops.size_summary of the checkpoint's model
    after: dict[str, Any]  # … and of the exported one
    params_ratio: float
    params_excl_emb_ratio: float
    flops_ratio: float


class GenerationDefaults(TypedDict):
    beam_size: int  # the fields of search.Search, then translate()'s batching
    len_penalty: float
    max_len_a: float
    max_len_b: int
    min_len: int
    shortlist: int  # 0: the whole vocabulary (exports before it lack the key: 0)
    no_repeat_ngram_size: int  # the decoding options (processing.py; exports before them lack the keys: off)
    repetition_penalty: float
    sampling: int
    top_k: int
    top_p: float
    temperature: float
    seed: int
    max_tokens: int
    max_sentences: int


class RuntimeDefaults(TypedDict):
    graph_optimization_level: str  # a key of backend.OPTIMIZATION_LEVELS
    threads: int | None


class Int8Quality(TypedDict):
    split: str
    beam_size: int
    bleu_fp32: float
    bleu_int8: float
    chrf_fp32: float
    chrf_int8: float
    p_value: float
    significant: bool
    identical_outputs: int


class ShortlistInfo(TypedDict):
    file: str  # shortlist.npz (shortlist.py), listed and checksummed in `files`
    built_from: str  # the corpus split it was counted on
    pairs: int  # sentence pairs counted
    per_source_token: int  # the most target tokens listed per source token
    frequent: int  # the most frequent target tokens every batch may produce
    min_pairs: int  # a (source, target) token pair seen in fewer sentence pairs is not listed
    entries: int  # (source, target) entries stored


class AlignmentInfo(TypedDict):
    """Where an export's word alignments come from (export/graph.py's `alignment` output; zoo/decoding/alignment.py)."""

    output: str | None  # the decoder output holding them (ALIGNMENT_OUTPUT); None: the mechanism has no weights
    layer: int | None  # the decoder layer (0-based) whose cross-attention they are
    heads: list[int]  # that module's heads they average: original indices, the kept ones
    reason: str | None  # why there is no output (output None), else None


class SharedWeight(TypedDict):
    name: str  # an initializer both graphs hold byte for byte (the tied embedding, the positions table)
    dtype: str  # numpy dtype name
    shape: list[int]
    file: str  # the graph file whose bytes from `offset` on are the weight's raw (little-endian) data
    offset: int


class _ManifestKeys(TypedDict):
    format_version: int
    runtime_format: int  # the oldest runtime format that reads this export
    name: str  # public model name (and Triton model name)
    entry: str
    data: str | None
    task: str
    attention: str
    attention_options: dict[str, Any]
    created: str  # ISO 8601, UTC
    checkpoint: CheckpointRef
    head_plan: dict[str, list[int]]  # module → kept original head indices (modules keeping all are absent)
    head_plan_source: str
    heads_removed: bool
    head_importance: dict[str, dict[str, float]] | None
    heads: dict[str, HeadsInfo]
    model_config: dict[str, Any]  # zoo.model.ModelConfig.to_dict of the exported model
    vocab: Vocab
    max_positions: int
    tokenizer: str  # file names: plain names inside the export, each listed in `files`
    heldout: str
    graphs: Graphs
    caches: list[CacheEntry]
    next_prefix: str
    quantized: bool
    precision: str  # "fp32" | "fp16" (export/fp16.py: float16 weights, activations and caches — `caches` dtypes — with
    # float32 scores); exports before it lack the key: fp32
    size: SizeInfo
    generation: GenerationDefaults
    runtime: RuntimeDefaults
    versions: dict[str, str]
    files: dict[str, str]  # file name → sha256, every file of the export but the manifest


class Manifest(_ManifestKeys, total=False):
    """manifest.json of an export directory. The keys below are added as the export proceeds (a manifest is
    first written without them so the export can be loaded and verified)."""

    verification: dict[str, Any]  # export/verify.py verify_export's report on the fp32 graphs
    verification_int8: dict[str, Any]  # … on the INT8 graphs (quantize=true)
    int8_quality: Int8Quality  # quantize=true
    verification_fp16: dict[str, Any]  # … on the float16 graphs against the fp32 model (precision=fp16)
    timings_s: dict[str, float]
    shared_weights: list[SharedWeight]  # read once and given to both sessions (exports before it: each its own)
    shortlist: ShortlistInfo  # shortlist.build=true
    alignment: AlignmentInfo  # exports before alignments lack the key (and the decoder output)


MANIFEST_KEYS: tuple[str, ...] = tuple(Manifest.__annotations__)  # every key, in file order


def _schema_type(path: str) -> type:
    """The type the schema gives key `path` ("a.b…"), as isinstance takes it (dict for dict[str, str])."""
    node: Any = Manifest
    for part in path.split("."):
        node = get_type_hints(node)[part]
    return get_origin(node) or node


# what read_manifest checks before anything is opened (other keys are informational or have defaults)
_RUNTIME_FIELDS = {
    path: _schema_type(path)
    for path in (
        "files",
        "graphs.encoder.file",
        "graphs.decoder.file",
        "graphs.encoder.data",
        "graphs.decoder.data",
        "tokenizer",
        "heldout",
        "shortlist.file",
        "vocab.pad_id",
        "vocab.unk_id",
        "vocab.bos_id",
        "vocab.eos_id",
        "vocab.size",
        "max_positions",
        "name",
        "caches",
    )
}


def sha256_file(path: Path) -> str:
    """A file's sha256 (`sha256_read`): the one digest helper of the project — exports, checkpoints, downloads."""
    with path.open("rb") as fh:
        return sha256_read(fh)


def sha256_read(fh: BinaryIO, copy_to: BinaryIO | None = None) -> str:
    """The sha256 of what is left to read in `fh`, read in 1 MiB blocks (graph files are large); each block is
    also written to `copy_to` when given, so that a copy is checked as it is made (one read, no window between)."""
    digest = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        digest.update(block)
        if copy_to is not None:
            copy_to.write(block)
    return digest.hexdigest()


def _load_json(directory: Path) -> dict[str, Any]:
    """manifest.json (a regular file of at most MAX_MANIFEST_BYTES) as a JSON object of a runtime format this
    runtime reads."""
    path = directory / MANIFEST
    if not os.path.lexists(path):
        raise ExportedModelError(
            f"{directory} is not an export directory (no {MANIFEST}); create one with "
            "`python -m export checkpoint=<run dir> out=<dir>`"
        )
    try:
        m = json.loads(read_limited(path, MAX_MANIFEST_BYTES).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise ExportedModelError(f"cannot read {path}: {str(exc)[:200]}; re-export the model") from None
    if not isinstance(m, dict):
        raise ExportedModelError(f"{path} is not a JSON object; re-export the model")
    if not isinstance(m.get("runtime_format", 0), int) or m.get("runtime_format", 0) > RUNTIME_FORMAT:
        raise ExportedModelError(f"{directory} needs a newer runtime (format {str(m.get('runtime_format'))[:20]!r})")
    if m.get("runtime_format", 0) < OLDEST_RUNTIME_FORMAT:
        raise ExportedModelError(
            f"{directory} was exported for runtime format {m.get('runtime_format')!r} (its decoder reorders and "
            f"grows the self-attention cache itself); this runtime reads formats {OLDEST_RUNTIME_FORMAT} to "
            f"{RUNTIME_FORMAT}: re-export it with `python -m export checkpoint=<its checkpoint>`"
        )
    return m


def read_manifest(
    directory: str | os.PathLike[str], check_files: bool = True, holds: Collection[str] | None = None
) -> Manifest:
    """An export directory's manifest, checked before anything is opened (manifest_checks): the keys the runtime
    needs with their types and ranges, `files` listing only the export format's files, each referenced file
    under its fixed name and listed (so it is checksummed), and the files the directory holds present as regular
    files (with `check_files`: with their sha256). `holds`: the keys naming the files this directory holds where
    the export has them, e.g. ("tokenizer", "shortlist.file") for the BLS model's copy, whose graphs other models
    serve; None: all."""
    directory = Path(directory)
    m = _load_json(directory)
    files = field(m, "files", _RUNTIME_FIELDS["files"])
    for name, digest in files.items():
        export_file(name, f"files[{name[:60]!r}]")
        if not sha256_digest(digest):
            raise ExportedModelError(f"{MANIFEST}: files[{name!r}] is not a sha256 digest; re-export the model")
    referenced = {
        key: field(m, key, _RUNTIME_FIELDS[key]) for key in ("graphs.encoder.file", "graphs.decoder.file", "tokenizer")
    }
    present = {
        "heldout": "heldout" in m,
        "shortlist.file": "shortlist" in m,
        **{f"graphs.{g}.data": "data" in m["graphs"][g] for g in ("encoder", "decoder")},  # dicts: field() read them
    }
    for optional in (key for key, held in present.items() if held):  # files an export may hold
        referenced[optional] = field(m, optional, _RUNTIME_FIELDS[optional])
    for key, value in referenced.items():
        if plain_name(value, key) != EXPORT_FILES[key]:
            raise ExportedModelError(
                f"{MANIFEST}: {key}={value[:60]!r}; the export format names this file {EXPORT_FILES[key]!r} — "
                "re-export the model"
            )
        if value not in files:
            raise ExportedModelError(
                f"{MANIFEST}: {key}={value!r} is not listed (and checksummed) in 'files'; re-export the model"
            )
    for key in ("vocab.pad_id", "vocab.unk_id", "vocab.bos_id", "vocab.eos_id", "vocab.size", "max_positions", "name"):
        field(m, key, _RUNTIME_FIELDS[key])
    check_numbers(m)
    for i, cache in enumerate(field(m, "caches", _RUNTIME_FIELDS["caches"])):
        check_cache(cache, f"caches[{i}]")
    held = set(files) if holds is None else {referenced[key] for key in holds if key in referenced}
    for name, digest in files.items():
        if name not in held:
            continue
        with open_regular(directory / name) as fh:
            if check_files and sha256_read(fh) != digest:
                raise ExportedModelError(
                    f"{directory / name} does not match its sha256 in {MANIFEST}; the export is corrupt"
                )
    _check_alignment(m.get("alignment"))
    shared = m.get("shared_weights", [])
    if not isinstance(shared, list):
        raise ExportedModelError(f"{MANIFEST}: 'shared_weights' has the wrong type; re-export the model")
    for i, weight in enumerate(shared):
        _check_shared_weight(directory, files, held, weight, f"shared_weights[{i}]")
    return m  # type: ignore[return-value]  # a dict checked as far as the runtime reads it


def _check_alignment(info: Any) -> None:
    """`alignment`, where the export has it: no output, or ALIGNMENT_OUTPUT from a decoder layer."""
    if info is None:
        return
    if not isinstance(info, dict) or info.get("output") not in (None, ALIGNMENT_OUTPUT):
        raise bad("alignment", f"is not an object naming the output {ALIGNMENT_OUTPUT!r} or none")
    if info["output"] is not None:
        bounded(info.get("layer"), "alignment.layer", *MANIFEST_LIMITS["caches[].layer"])
    elif not isinstance(info.get("reason"), str):
        raise bad("alignment.reason", "is not a string (why the export has no alignment output)")


def _check_shared_weight(directory: Path, files: dict[str, str], held: set[str], weight: Any, key: str) -> None:
    """A shared weight names a listed file and a byte range inside it (where the directory holds the file), of a
    plain numeric dtype."""
    fields = {"name": str, "dtype": str, "shape": list, "file": str, "offset": int}
    if not isinstance(weight, dict) or any(not isinstance(weight.get(k), t) for k, t in fields.items()):
        raise ExportedModelError(f"{MANIFEST}: {key} needs name, dtype, shape, file and offset; re-export the model")
    if plain_name(weight["file"], f"{key}.file") not in files:
        raise ExportedModelError(
            f"{MANIFEST}: {key}.file is not listed (and checksummed) in 'files'; re-export the model"
        )
    try:
        dtype = np.dtype(weight["dtype"])
    except TypeError:
        dtype = np.dtype(object)
    shape = weight["shape"]
    if dtype.kind not in "fiub" or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ExportedModelError(
            f"{MANIFEST}: {key} has dtype {weight['dtype']!r} / shape {shape!r}; re-export the model"
        )
    for j, d in enumerate(shape):
        bounded(d, f"{key}.shape[{j}]", *MANIFEST_LIMITS["shared_weights[].shape[]"])
    bounded(weight["offset"], f"{key}.offset", *MANIFEST_LIMITS["shared_weights[].offset"])
    end = weight["offset"] + dtype.itemsize * math.prod(shape)
    if weight["file"] in held and end > (directory / weight["file"]).stat().st_size:
        raise ExportedModelError(f"{MANIFEST}: {key} reaches past the end of {weight['file']}; re-export the model")
