"""Run an exported attention-zoo model with numpy + onnxruntime + sentencepiece only.

    import export
    model = export.load("exports/transformer-deen")
    model.translate(["Guten Morgen."])            # → ["Good morning."]

Why a separate runtime: serving (the Triton Python backend, which gets a copy of this very file)
must not need torch. So this module is self-contained — standard library, numpy, onnxruntime and
sentencepiece, no project imports — and everything model-specific comes from the export
directory's manifest.json (special ids, position limit, the per-layer cache layout, defaults).

Search semantics are those of `zoo.generate` exactly (the export verifies identical hypotheses):
pad and bos are banned, eos is banned before `min_len`, and forced at each sentence's length limit
`int(max_len_a·src_len + max_len_b)` (float32 arithmetic, as torch does it) clamped to
[1, max_positions-1]; beam search keeps fairseq's 2·K candidates, counts only eos among the top K
as finished, normalises by length**len_penalty (length counting eos), stops a sentence after K
finished hypotheses and drops it from the batch; greedy search runs until every row has emitted eos.
`translate` batches texts exactly as `zoo.evaluation.translate_texts` does.

Per step the host touches only small arrays. The self-attention caches live in a store the host owns
(`SelfCache`): the graph returns only each step's new position, which the host writes once into its cell and
never moves; beam reordering reorders each hypothesis' list of cells (`history`, [rows, steps] ints), and the
graph gathers every row's past from the store itself — so the cache is held once and copied once per step
(the gather), where returning it grown and reordering it would hold it twice and copy it twice. The graph also
returns each row's k = 2·beam + 3 best log-probs and tokens (in-graph TopK) instead of a [rows, vocab] array.
Whatever the search bans (pad, bos, eos) removes at most 3 of a row's best tokens, so each row's 2·beam best
allowed candidates are always among them, and the sentence's 2·beam best candidates over all its beams (what
`torch.topk` over [beams·vocab] finds) too. Cross-attention caches are re-sliced on the host only when a
finished sentence leaves the batch.

Scores, as `zoo.generate` defines them (equal to 1e-4): a hypothesis' score is its tokens' summed log-probs, eos
included, / length ** len_penalty (length counting eos) — what beam search ranks by. `generate_nbest` and
`translate(..., num_hypotheses=n, return_scores=True)` return the n best with their scores (the first is always
the plain call's output); `score(sources, targets)` runs the decoder teacher-forced over given targets and
returns each token's log-prob (from the graph's full `log_probs` output, the one verification reads) and the
sentence score, so scoring the beam's best hypothesis gives back its beam score — unless the search forced eos
at the length limit (log-prob 0 there, the model's real log-prob in `score`).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import mmap
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, get_origin, get_type_hints

import numpy as np
import onnxruntime as ort
import sentencepiece as spm

MANIFEST = "manifest.json"
RUNTIME_FORMAT = 2  # 2: the host stores the growing self caches; the graph gathers rows by `history`
OPTIMIZATION_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_NEXT = "next."  # decoder output name prefix of what a step adds to a self-attention state
_BANNED = 3  # tokens the search may ban from a row (pad, bos, eos): fetch this many extra best tokens


class ExportRuntimeError(Exception):
    """The torch-free runtime's own error base (it imports nothing of zoo): a bad export dir or a bad request."""


class ExportedModelError(ExportRuntimeError):
    """An export directory that cannot be loaded (missing, corrupt or from a newer exporter)."""


# ---------------------------------------------------------------------------------------------- manifest schema
# manifest.json, written down once: export/manifest.py builds it, read_manifest below checks what the runtime
# needs, the repository writers (serve/) copy what it lists, the tests read it. The key order of the file is the
# order of these declarations. It lives here because this module is the one every reader can import: the
# Triton models get a verbatim copy of this file and nothing else of the project.
class GraphInfo(TypedDict):
    file: str  # a plain file name inside the export, listed in `files`
    ir_version: int
    opset: int
    inputs: list[str]  # the graph's actual I/O (the exporter drops inputs a mechanism never reads)
    outputs: list[str]


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


class HeadsInfo(TypedDict):
    num_heads: int  # heads in the exported graph
    head_dim: int
    kept: list[int]  # original head indices


class SizeInfo(TypedDict):
    before: dict[str, Any]  # zoo.flops.size_summary of the checkpoint's model
    after: dict[str, Any]  # … and of the exported one
    params_ratio: float
    params_excl_emb_ratio: float
    flops_ratio: float


class GenerationDefaults(TypedDict):
    beam_size: int  # the fields of Search, then translate()'s batching
    len_penalty: float
    max_len_a: float
    max_len_b: int
    min_len: int
    max_tokens: int
    max_sentences: int


class RuntimeDefaults(TypedDict):
    graph_optimization_level: str  # a key of OPTIMIZATION_LEVELS
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
    timings_s: dict[str, float]
    shared_weights: list[SharedWeight]  # read once and given to both sessions (exports before it: each its own)


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
        "tokenizer",
        "heldout",
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


@dataclass(frozen=True)
class Search:
    """The search settings of `zoo.generate.SearchConfig` (same names, same defaults)."""

    beam_size: int = 5
    len_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1

    @classmethod
    def from_generation(cls, gen: Mapping[str, Any]) -> Search:
        """The search of a manifest's `generation` defaults (its batching keys are not search settings)."""
        return cls(**{f.name: gen[f.name] for f in fields(cls) if f.name in gen})


# Allowed search settings: [lowest, highest]. Bounded so that no setting can overflow the length arithmetic or
# return a silently wrong answer (NaN/inf penalties, 2^63 lengths); lengths are capped by the model's positions
# anyway, and a request's total cost is bounded separately by whoever serves it.
SEARCH_LIMITS: dict[str, tuple[int | float, int | float]] = {
    "beam_size": (1, 64),
    "len_penalty": (0.0, 10.0),
    "max_len_a": (0.0, 10.0),
    "max_len_b": (0, 4096),
    "min_len": (0, 4096),
}
_INTEGER_SETTINGS = frozenset({"beam_size", "max_len_b", "min_len"})


class SearchError(ExportRuntimeError, ValueError):
    """A search setting (or num_hypotheses) that is not a finite number within its limits; the message names the
    allowed range."""


class ScoreError(ExportRuntimeError, ValueError):
    """Targets that cannot be scored (not one per source, too long for the model, ids outside the vocabulary);
    the message says which and what is allowed."""


class Hypothesis(NamedTuple):
    """A finished search hypothesis: token ids (no bos/eos) and its length-normalised score (module docstring)."""

    tokens: list[int]
    score: float


class Translation(NamedTuple):
    """One output hypothesis of a source text: its text, its score and its token ids (no bos/eos) — the ids are
    what `score_encoded` scores exactly; re-tokenising the text usually, not always, gives them back."""

    text: str
    score: float
    tokens: list[int]


class Scored(NamedTuple):
    """A teacher-forced target: the scored ids (the target's tokens, then eos), each one's log-probability given
    the source and the tokens before it, and the sentence score normalised as the search ranks hypotheses."""

    tokens: list[int]
    token_logprobs: list[float]
    score: float


def _bounded(name: str, value: Any, low: float, high: float, integer: bool, allowed: str) -> int | float:
    """`value` as a finite number in [low, high] (an integer when `integer`: whole floats and numeric strings
    pass, as JSON and Triton parameters send them), else SearchError naming `name` and `allowed`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating, str)):
        raise SearchError(f"{name}={value!r} is not a number; {allowed}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SearchError(f"{name}={value!r} is not a number; {allowed}") from None
    if not np.isfinite(number) or not low <= number <= high:
        raise SearchError(f"{name}={value!r} is out of range; {allowed}")
    if integer:
        if number != int(number):
            raise SearchError(f"{name}={value!r} is not an integer; {allowed}")
        return int(number)
    return number


def search_setting(name: str, value: Any) -> int | float:
    """One search setting checked and converted: an integer where the search counts, a finite float else."""
    if name not in SEARCH_LIMITS:
        raise SearchError(f"unknown search setting {name!r}; allowed: {sorted(SEARCH_LIMITS)}")
    low, high = SEARCH_LIMITS[name]
    integer = name in _INTEGER_SETTINGS
    return _bounded(
        name, value, low, high, integer, f"allowed: {'an integer' if integer else 'a finite number'} in [{low}, {high}]"
    )


def check_num_hypotheses(value: Any, beam_size: int) -> int:
    """How many hypotheses to return per source from a search of `beam_size` (validated): an integer
    1 … beam_size (greedy search, beam_size 1, has one), else SearchError naming the allowed values."""
    beam = max(1, int(beam_size))
    allowed = f"allowed: an integer in [1, {beam}] (at most beam_size={beam})"
    return int(_bounded("num_hypotheses", value, 1, beam, True, allowed))


def check_search(search: Search) -> Search:
    """`search` with every setting validated (SearchError names the setting and its allowed range)."""
    return Search(**{f.name: search_setting(f.name, getattr(search, f.name)) for f in fields(Search)})


def max_lengths(src_lengths: np.ndarray, search: Search, max_positions: int) -> np.ndarray:
    """Per-sentence output limit (tokens incl. eos), computed in float32 like torch's
    `(a * src_len + b).long().clamp(1, max_positions - 1)` so limits agree to the token. The float value is
    capped at the position limit before the integer cast, so no setting can overflow int64."""
    raw = np.float32(search.max_len_a) * src_lengths.astype(np.float32) + np.float32(search.max_len_b)
    raw = np.minimum(raw, np.float32(max_positions))
    return np.clip(raw.astype(np.int64), 1, max_positions - 1)


def _normalised(total: float, length: int, len_penalty: float) -> float:
    """A hypothesis' score from its summed log-probs and its length counting eos (zoo.generate.normalised)."""
    return total / float(length) ** len_penalty


def _batches(lengths: Sequence[int], max_tokens: int, max_sentences: int) -> list[list[int]]:
    """`zoo.evaluation._batches`: indices by decreasing length, ≤ max_tokens padded tokens and
    ≤ max_sentences per batch (kept identical so batch composition matches the torch path)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i])
        if current and (width * (len(current) + 1) > max_tokens or len(current) >= max_sentences):
            batches.append(current)
            current, width = [], lengths[i]
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _release_free_heap() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim). Loading a session parses the whole graph file
    into memory and frees it; glibc keeps those pages, about a third of the weights, in the process for good,
    and every later peak sits on top of them. A no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_SHARED_ARENA_TRIED = False  # whether _use_shared_cpu_arena registered the arena in this process


def _use_shared_cpu_arena(options: ort.SessionOptions) -> None:
    """Let a session allocate from the CPU arena this process' onnxruntime environment shares between sessions
    (registered by the first session this runtime makes).

    Why an arena: the state that grows during a search (the self-attention store, the cross caches) is the host's,
    so what onnxruntime allocates per step are the step's transients — a few MB each (gathered past, logits). From
    glibc's heap they left holes that later, larger ones grew around: at the end of a beam-5 × batch-32 search of
    the 36.7M model 45–85 MB of freed heap stayed resident, a peak RSS of 437–479 MB that changed from run to
    run. The arena reuses its blocks: 440 MB in every run with a session's own arena, 432 MB with one arena for
    the encoder and the decoder (the encoder's transients are the decoder's later). Why not earlier: while the
    graphs returned the grown caches, each step's differently sized caches stayed in the arena (700 vs 601 MB)."""
    global _SHARED_ARENA_TRIED
    if not _SHARED_ARENA_TRIED:
        _SHARED_ARENA_TRIED = True
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        try:  # arguments: no memory limit, grow by powers of two (default), default first chunk and dead bytes
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 0, -1, -1))
        except RuntimeError:  # an onnxruntime that refuses it: each session keeps an arena of its own
            pass
    options.add_session_config_entry("session.use_env_allocators", "1")


def mapped_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero array in an anonymous memory mapping of its own, with transparent huge pages asked for.

    For the self-attention store, the largest buffer of a beam search (118 MB at beam 5 × batch 32 × 30 tokens of
    a 6-layer d512 model), which every step extends by a new position and gathers from at random cells:
    - its pages are touched a step at a time; with 4 KiB pages each step faulted in ~1000 of them
      (`SelfCache.update` 3.7–4.3 ms a step of that search on 2 AVX2 cores), with 2 MiB pages a few (2.0 ms);
    - freed, a mapping goes back to the system at once; a malloc'ed store stayed in the heap after its search.
    Where huge pages are not available (madvise unsupported, THP off) the mapping has ordinary pages."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    # private and anonymous: zero-filled, resident only once touched (a shared mapping would be shmem, no THP)
    buffer = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buffer.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def _plain_name(value: Any, key: str) -> str:
    """A file name the manifest may refer to: a plain name inside the export directory. An export is
    untrusted input (downloaded, shared): `../x`, `/etc/x` or `sub/x` would make loading or serving it read
    or write outside the directory."""
    if (
        not isinstance(value, str)
        or not value
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or "\x00" in value
        or Path(value).is_absolute()
    ):
        raise ExportedModelError(
            f"{MANIFEST}: {key}={value!r} is not a plain file name inside the export "
            "directory (no separators, no '..', not absolute); the export is malformed or "
            "tampered with — re-export it with `python -m export`"
        )
    return value


def _field(m: dict[str, Any], path: str, kind: type | tuple[type, ...]) -> Any:
    """`m[a][b]…` for path "a.b…", of the given type, or a one-line error naming the key."""
    node: Any = m
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ExportedModelError(f"{MANIFEST}: missing key {path!r}; re-export the model with `python -m export`")
        node = node[part]
    if not isinstance(node, kind) or (isinstance(node, bool) and kind is int):
        raise ExportedModelError(
            f"{MANIFEST}: {path!r} has the wrong type ({type(node).__name__}); re-export the "
            "model with `python -m export`"
        )
    return node


def read_manifest(directory: str | os.PathLike[str], check_files: bool = True) -> Manifest:
    """An export directory's manifest, checked before anything is opened: the keys the runtime needs with
    their types, every referenced file a plain name listed in `files` (so it is checksummed), and with
    `check_files` every listed file present with its sha256."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ExportedModelError(
            f"{directory} is not an export directory (no {MANIFEST}); create one with "
            "`python -m export checkpoint=<run dir> out=<dir>`"
        )
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportedModelError(f"cannot read {path}: {exc}; re-export the model") from exc
    if not isinstance(m, dict):
        raise ExportedModelError(f"{path} is not a JSON object; re-export the model")
    if not isinstance(m.get("runtime_format", 0), int) or m.get("runtime_format", 0) > RUNTIME_FORMAT:
        raise ExportedModelError(f"{directory} needs a newer runtime (format {m.get('runtime_format')!r})")
    if m.get("runtime_format", 0) < RUNTIME_FORMAT:
        raise ExportedModelError(
            f"{directory} was exported for runtime format {m.get('runtime_format')!r} (its decoder reorders and "
            f"grows the self-attention cache itself); this runtime reads format {RUNTIME_FORMAT}: re-export it "
            "with `python -m export checkpoint=<its checkpoint>`"
        )
    files = _field(m, "files", _RUNTIME_FIELDS["files"])
    for name, digest in files.items():
        _plain_name(name, f"files[{name!r}]")
        if not isinstance(digest, str) or len(digest) != 64:
            raise ExportedModelError(f"{MANIFEST}: files[{name!r}] is not a sha256 digest; re-export the model")
    referenced = {
        key: _field(m, key, _RUNTIME_FIELDS[key]) for key in ("graphs.encoder.file", "graphs.decoder.file", "tokenizer")
    }
    if "heldout" in m:  # optional for the runtime
        referenced["heldout"] = _field(m, "heldout", _RUNTIME_FIELDS["heldout"])
    for key, value in referenced.items():
        if _plain_name(value, key) not in files:
            raise ExportedModelError(
                f"{MANIFEST}: {key}={value!r} is not listed (and checksummed) in 'files'; re-export the model"
            )
    for key in ("vocab.pad_id", "vocab.unk_id", "vocab.bos_id", "vocab.eos_id", "vocab.size", "max_positions", "name"):
        _field(m, key, _RUNTIME_FIELDS[key])
    for i, cache in enumerate(_field(m, "caches", _RUNTIME_FIELDS["caches"])):
        if not isinstance(cache, dict) or not {"name", "kind", "shape", "dtype"} <= cache.keys():
            raise ExportedModelError(f"{MANIFEST}: caches[{i}] needs name, kind, shape and dtype; re-export the model")
    for name, digest in files.items():
        file = directory / name
        if not file.is_file():
            raise ExportedModelError(f"{file} is missing from the export")
        if check_files and _sha256(file) != digest:
            raise ExportedModelError(f"{file} does not match its sha256 in {MANIFEST}; the export is corrupt")
    for i, weight in enumerate(m.get("shared_weights", [])):
        _check_shared_weight(directory, files, weight, f"shared_weights[{i}]")
    return m


def _check_shared_weight(directory: Path, files: dict[str, str], weight: Any, key: str) -> None:
    """A shared weight names a listed file and a byte range inside it, of a plain numeric dtype."""
    fields = {"name": str, "dtype": str, "shape": list, "file": str, "offset": int}
    if not isinstance(weight, dict) or any(not isinstance(weight.get(k), t) for k, t in fields.items()):
        raise ExportedModelError(f"{MANIFEST}: {key} needs name, dtype, shape, file and offset; re-export the model")
    if _plain_name(weight["file"], f"{key}.file") not in files:
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
    end = weight["offset"] + dtype.itemsize * math.prod(shape)
    if weight["offset"] < 0 or end > (directory / weight["file"]).stat().st_size:
        raise ExportedModelError(f"{MANIFEST}: {key} reaches past the end of {weight['file']}; re-export the model")


def shared_initializers(directory: Path, weights: Sequence[SharedWeight]) -> dict[str, tuple[np.ndarray, Any]]:
    """One in-memory copy of each weight both graphs hold, for both sessions (`SessionOptions.add_initializer`):
    read from the bytes the manifest points at, so the runtime needs no ONNX parser. Each session would otherwise
    keep its own copy — the tied embedding and the positions table, 22.6 MB of the 36.7M-parameter model: peak RSS
    at beam 5 × batch 32 460 → 432 MB. The arrays are returned beside their OrtValues, which do not own them."""
    shared = {}
    for w in weights:
        dtype, count = np.dtype(w["dtype"]), math.prod(w["shape"])
        array = np.fromfile(directory / w["file"], dtype=dtype, count=count, offset=w["offset"]).reshape(w["shape"])
        shared[w["name"]] = (array, ort.OrtValue.ortvalue_from_numpy(array))
    return shared


def cross_rows(sentence: np.ndarray, per_source: bool) -> np.ndarray:
    """The source of every cross-cache row the decoder needs for decoder rows whose sources are `sentence` [N]:
    one row per source when the graph shares a source's cache across its rows (`per_source`) and the rows come
    in equal consecutive groups of one source each (a sentence's beams; G = 1 for greedy), else one per row."""
    n = len(sentence)
    if not per_source or n == 0:
        return sentence
    changes = np.flatnonzero(sentence[1:] != sentence[:-1])
    group = int(changes[0]) + 1 if changes.size else n
    if n % group == 0 and (sentence.reshape(-1, group) == sentence[::group, None]).all():
        return sentence[::group]
    return sentence


class StorePool:
    """Memory for self-attention stores, kept by a model between its searches and handed out again.

    A beam search's store is its largest buffer (118 MB at beam 5 × batch 32 × 30 tokens of the 36.7M model), and
    fresh memory is paid for page by page as a search first writes it; on the 2-core VM that is about 50 ms per
    64 MB, so a new store per search cost 3–6% of a beam-5 × 32 search. A finished search's buffers come back here
    (`SelfCache` gives them back when it is freed) and the next search takes the smallest that is big enough. A
    search that needs more than any free buffer drops the smallest free one for each new buffer it makes, so the
    pool holds about what the latest searches used; like onnxruntime's arena, it keeps that between requests.
    Buffers are not cleared: a store cell is always written before any history refers to it."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []  # flat uint8 buffers (mapped_zeros), each owned by nobody
        self._lock = threading.Lock()  # searches of one model may run in several threads

    def take(self, nbytes: int) -> np.ndarray:
        """A flat uint8 buffer of at least `nbytes` bytes, no longer in the pool."""
        with self._lock:
            by_size = sorted(range(len(self._free)), key=lambda i: self._free[i].nbytes)
            fit = next((i for i in by_size if self._free[i].nbytes >= nbytes), None)
            if fit is not None:
                return self._free.pop(fit)
            if by_size:
                del self._free[by_size[0]]  # superseded: a search needs more than it holds
        return mapped_zeros((max(nbytes, 1),), np.uint8)

    def give(self, buffers: Sequence[np.ndarray | None]) -> None:
        """Buffers back into the pool (their arrays must no longer be used)."""
        with self._lock:
            self._free.extend(b for b in buffers if b is not None)

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._free)


class SelfCache:
    """The decoder's self-attention state between steps, owned by the host (export/graph.py has the why).

    A growing cache (one with a position axis, [rows, a..., steps, b...]) is a store [cells·a, b]: position j
    of the hypothesis in row s at step j is cell j·W + s (its a store rows from a·(j·W + s) on), written once by
    `update` and never moved (W slots per position: the most rows a step has had). `history` [rows, steps]
    lists each row's cells; `select(rows)` — beam reordering, finished sentences leaving — picks rows of it,
    not of the store. Running sums (no position axis, MLK) are replaced by every step's output and reordered on
    the host. `feeds()` is what the next step reads: contiguous arrays (the stores' filled prefixes are views),
    so onnxruntime takes them without a copy.
    """

    def __init__(
        self,
        specs: Sequence[dict[str, Any]],
        rows: int,
        steps: int = 0,
        slots: int = 0,
        pool: StorePool | None = None,
    ) -> None:
        self.pool = pool if pool is not None else StorePool()
        self.buffers: list[np.ndarray | None] = [None] * len(specs)  # the pool's buffer under each store
        weakref.finalize(self, self.pool.give, self.buffers)  # back to the pool when this cache is freed
        self.names = [spec["name"] for spec in specs]
        self.dtypes = [np.dtype(spec["dtype"]) for spec in specs]
        # per tensor: the position axis, and a store cell's split (a, b) or a running sum's row shape
        self.axes: list[int | None] = []
        self.cells: list[tuple[int, ...]] = []
        for spec in specs:
            shape = spec["shape"]
            axis = shape.index("steps") if "steps" in shape else None
            self.axes.append(axis)
            if axis is None:
                self.cells.append(tuple(int(s) for s in shape[1:]))
            else:  # [batch, a..., steps, b...]: a cell is a rows of b values
                self.cells.append(
                    (math.prod(int(s) for s in shape[1:axis]), math.prod(int(s) for s in shape[axis + 1 :]))
                )
        self.width = max(rows, slots, 1)  # W: slots per position (`slots`: the most rows a step will have)
        self.capacity = max(steps, 1)  # positions the stores hold before they grow
        self.stores: list[np.ndarray | None] = [
            self._store(i, (self.capacity * self.width * cell[0], cell[1])) if axis is not None else None
            for i, (axis, cell) in enumerate(zip(self.axes, self.cells, strict=True))
        ]
        self.sums = [
            np.zeros((rows, *cell), dtype) if axis is None else None
            for axis, cell, dtype in zip(self.axes, self.cells, self.dtypes, strict=True)
        ]
        self.history = np.zeros((rows, 0), dtype=np.int64)  # [rows, steps] each row's cell per position
        self.order = np.arange(rows, dtype=np.int64)  # running sums: rows of the last step to continue, in order

    @property
    def steps(self) -> int:
        return self.history.shape[1]

    def feeds(self) -> dict[str, np.ndarray]:
        """The state the next step reads, by graph input name (plus `history`)."""
        for i, value in enumerate(self.sums):
            if value is None or (len(value) == len(self.order) and (self.order == np.arange(len(value))).all()):
                continue  # no running sums, or the same rows in the same order
            self.sums[i] = np.take(value, self.order, axis=0)
        self.order = np.arange(len(self.order), dtype=np.int64)
        filled = self.steps * self.width
        out = {"history": self.history}
        for name, store, value, cell in zip(self.names, self.stores, self.sums, self.cells, strict=True):
            out[name] = store[: filled * cell[0]] if store is not None else value
        return out

    def update(self, added: Sequence[np.ndarray]) -> None:
        """Take a step's `next.*` outputs (in `names` order) for the rows the step ran on: growing caches' new
        position [rows, a..., 1, b...] into their cells, running sums [rows, ...] as they are."""
        rows, t = len(self.history), self.steps
        if rows > self.width:
            self._widen(rows)
        if t >= self.capacity:
            self._grow(max(2 * self.capacity, t + 1))
        first = t * self.width
        for i, value in enumerate(added):
            store = self.stores[i]
            if store is None:
                self.sums[i] = value
            else:
                a, b = self.cells[i]
                store[first * a : (first + rows) * a] = value.reshape(rows * a, b)
        cells = np.arange(first, first + rows, dtype=np.int64)[:, None]
        self.history = np.concatenate([self.history, cells], axis=1)
        self.order = np.arange(rows, dtype=np.int64)

    def select(self, rows: np.ndarray) -> None:
        """Continue from rows `rows` (of the last step's rows) at the next step."""
        self.history = self.history[rows]  # a fresh contiguous array
        self.order = self.order[rows]

    def _grow(self, capacity: int) -> None:
        """Room for `capacity` positions (the stores keep their filled cells)."""
        for i, store in enumerate(self.stores):
            if store is not None:
                old = self.buffers[i]
                grown = self._store(i, (capacity * self.width * self.cells[i][0], store.shape[1]))
                grown[: len(store)] = store
                self.stores[i] = grown
                self.pool.give([old])
        self.capacity = capacity

    def _widen(self, width: int) -> None:
        """`width` slots per position: a step has more rows than any before it (cells renumbered)."""
        for i, store in enumerate(self.stores):
            if store is not None:
                a, b = self.cells[i]
                old = self.buffers[i]
                wide = self._store(i, (self.capacity, width, a * b))
                wide[:, : self.width] = store.reshape(self.capacity, self.width, a * b)
                self.stores[i] = wide.reshape(self.capacity * width * a, b)
                self.pool.give([old])
        self.history = self.history // self.width * width + self.history % self.width
        self.width = width

    def _store(self, i: int, shape: tuple[int, ...]) -> np.ndarray:
        """An uncleared array of `shape` for store i, on a buffer from the pool (recorded to give back)."""
        dtype = self.dtypes[i]
        nbytes = math.prod(shape) * dtype.itemsize
        self.buffers[i] = buffer = self.pool.take(nbytes)
        return buffer[:nbytes].view(dtype).reshape(shape)


class _Stepper:
    """Per-row best tokens for the live rows; the self-attention state is a host-owned `SelfCache`.

    `select(rows)` keeps rows of the logical batch (beam reordering / finished sentences leaving): the
    self-attention state by reordering each row's list of cells (`SelfCache`), the cross-attention caches on
    the host, and only when the set of sentences actually changes. Exports whose cross caches are per source
    (manifest shape "sources") get one cache row per sentence, shared by its beams.
    """

    def __init__(
        self,
        model: ExportedModel,
        encoded: dict[str, np.ndarray],
        rows: np.ndarray,
        full: bool = False,
        steps: int = 0,
        slots: int = 0,
    ) -> None:
        self.m = model
        self._take_cross(encoded, rows)
        self.cache = SelfCache(model.self_specs, len(rows), steps, slots, model.store_pool)
        self.full = full
        self.logits: np.ndarray | None = None  # [N, V] of the last step when `full`
        self.log_probs: np.ndarray | None = None

    def __call__(self, last: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """last [N] int64 tokens at position t → the k best (log-prob [N, k] f32, token [N, k] int64)
        of every row, descending (writable arrays)."""
        names = (["logits", "log_probs"] if self.full else []) + ["top_log_probs", "top_tokens"]
        out = self._run(last, t, k, names)
        if self.full:
            self.logits, self.log_probs = out[0], out[1]
            out = out[2:]
        return out[0], out[1]

    def distribution(self, last: np.ndarray, t: int) -> np.ndarray:
        """last [N] int64 tokens at position t → every row's full next-token log-probs [N, V] f32 (scoring:
        the graph's `log_probs` output; its top-k outputs are not fetched)."""
        return self._run(last, t, 1, ["log_probs"])[0]

    def _run(self, last: np.ndarray, t: int, k: int, names: list[str]) -> list[np.ndarray]:
        """One decoder step fetching outputs `names`; what it adds to the self-attention state goes to the store.

        numpy in, numpy out (`InferenceSession.run`): onnxruntime reads contiguous arrays in place and hands its
        outputs over as arrays, which costs less per tensor than wrapping each input in an OrtValue from Python
        (measured: 30 inputs, 14 outputs, 217 vs 503 µs per call) — the state no longer stays in onnxruntime
        between steps, so there is nothing to keep as OrtValues."""
        feeds = {
            "tokens": np.ascontiguousarray(last, dtype=np.int64).reshape(-1, 1),
            "step": np.array([t], dtype=np.int64),
            "topk": np.array([min(k, self.m.vocab_size)], dtype=np.int64),
            **self.cross,
            **self.cache.feeds(),
        }
        used = self.m.decoder_inputs
        out = self._decode([*names, *self.m.next_names], {n: v for n, v in feeds.items() if n in used})
        self.cache.update(out[len(names) :])
        return out[: len(names)]

    def _decode(self, outputs: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the decoder graph once: `outputs` as arrays, in order (the BLS variant calls another model)."""
        return self.m.decoder.run(outputs, inputs)

    def _take_cross(self, encoded: dict[str, np.ndarray], rows: np.ndarray) -> None:
        """The cross-attention inputs (caches, memory_pad_mask) for decoder rows whose sources are `rows` [N]."""
        self.sentence = rows  # [N] source row of every decoder row
        self.cross_sources = cross_rows(rows, self.m.cross_per_source)  # [sources or N] source of every cross row
        # every source once, in order (beam search and greedy over a fresh batch): the encoder's own arrays. A copy
        # would hold the cross caches twice while it is made (33 MB of the 36.7M model's 42-token batch of 32) and
        # leave that much freed but resident heap behind for the rest of the search
        whole = np.array_equal(self.cross_sources, np.arange(len(encoded["memory_pad_mask"])))
        self.cross = {
            name: np.ascontiguousarray(encoded[name] if whole else encoded[name][self.cross_sources])
            for name in [*self.m.cross_names, "memory_pad_mask"]
        }

    def select(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        self.sentence = self.sentence[rows]
        sources = cross_rows(self.sentence, self.m.cross_per_source)
        if sources.shape != self.cross_sources.shape or not np.array_equal(sources, self.cross_sources):
            position = {int(s): i for i, s in enumerate(self.cross_sources)}  # every kept source has a row now
            keep = np.array([position[int(s)] for s in sources], dtype=np.int64)
            self.cross = {k: np.ascontiguousarray(v[keep]) for k, v in self.cross.items()}
            self.cross_sources = sources
        self.cache.select(rows)


PROVIDERS = ("cpu", "cuda")
CPU_DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]  # see ExportedModel.__init__


def execution_providers(provider: str, device_id: int = 0) -> list[Any]:
    """onnxruntime's provider list for `provider` (cpu | cuda).

    CUDA runs with TF32 off: on an H200 (onnxruntime-gpu 1.31.1), TF32 matrix products moved the encoder's
    outputs by up to 1.6e-3 from the CPU's and changed 12 of 1420 greedy test hypotheses; with TF32 off they
    moved by at most 3.8e-6 and all 1420 greedy and beam-5 hypotheses were the CPU's — the parity the export
    verified (≤ 1e-4) is what a served model should keep."""
    if provider not in PROVIDERS:
        raise ExportRuntimeError(f"provider={provider!r}: choose one of {list(PROVIDERS)}")
    if provider == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ExportRuntimeError(
            f"provider=cuda, but this onnxruntime ({ort.__version__}) has no CUDAExecutionProvider "
            f"(it has {ort.get_available_providers()}): install onnxruntime-gpu instead of onnxruntime, "
            "or use provider=cpu"
        )
    return [("CUDAExecutionProvider", {"device_id": int(device_id), "use_tf32": "0"}), "CPUExecutionProvider"]


class ExportedModel:
    """An export directory loaded into two onnxruntime sessions plus its sentencepiece model."""

    stepper_class: type[_Stepper] = _Stepper  # what `stepper` makes (the BLS model's runs its graphs elsewhere)

    def __init__(
        self,
        directory: str | os.PathLike[str],
        threads: int | None = None,
        optimization: str | None = None,
        check_files: bool = True,
        spinning: bool = False,
        provider: str = "cpu",
        device_id: int = 0,
    ) -> None:
        self._read_export(Path(directory), read_manifest(directory, check_files=check_files))
        m = self.manifest

        defaults = m.get("runtime", {})
        options = ort.SessionOptions()
        threads = threads if threads is not None else defaults.get("threads")
        if threads:
            options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        level = optimization or defaults.get("graph_optimization_level", "all")
        if level not in OPTIMIZATION_LEVELS:
            raise ExportedModelError(f"unknown graph optimization level {level!r}; use {sorted(OPTIMIZATION_LEVELS)}")
        options.graph_optimization_level = OPTIMIZATION_LEVELS[level]
        options.log_severity_level = 3
        # by default no spin-waiting after a run: the host does real work between steps and the cores may be
        # shared (other processes, torch in the same process); spinning trades that CPU for wake-up latency
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        # No memory pattern: every decoder step has new shapes (the past grows by one position, beams finish),
        # so patterns never repeat. On the CPU, both sessions allocate from the one arena of the process
        # (`_use_shared_cpu_arena`): see there why an arena, and why one.
        options.enable_mem_pattern = False
        if provider == "cpu":
            _use_shared_cpu_arena(options)
        else:
            options.enable_cpu_mem_arena = False
        providers = execution_providers(provider, device_id)
        self.shared = shared_initializers(self.directory, m.get("shared_weights", []))
        for name, (_, value) in self.shared.items():
            options.add_initializer(name, value)
        graphs = m["graphs"]
        # On the CPU, residual Add + LayerNormalization stay two nodes: onnxruntime's fused SkipLayerNormalization
        # took 4.3 of a 49.8 ms decoder step (18 nodes, beam 5 × batch 32 rows of d_model 512, 2 threads), the
        # two unfused ops 2.4 of 45.6 ms; batch 1 unchanged (6.1–6.5 ms a step either way)
        disabled = CPU_DISABLED_OPTIMIZERS if provider == "cpu" else []
        self.encoder = ort.InferenceSession(
            str(self.directory / graphs["encoder"]["file"]), options, providers=providers, disabled_optimizers=disabled
        )
        self.decoder = ort.InferenceSession(
            str(self.directory / graphs["decoder"]["file"]), options, providers=providers, disabled_optimizers=disabled
        )
        _release_free_heap()  # the parsed graph files are gone now; glibc keeps their pages unless asked
        self.decoder_inputs = frozenset(i.name for i in self.decoder.get_inputs())
        missing = sorted({*self.self_names, "tokens", "step", "topk"} - self.decoder_inputs)
        if missing:
            raise ExportedModelError(f"{graphs['decoder']['file']} lacks inputs {missing}; re-export the model")

    def _read_export(self, directory: Path, manifest: Manifest) -> None:
        """What the search needs of an export besides its graphs: ids, limits, cache names, search defaults and
        the tokenizer (also the whole setup of serve/triton/bls_model.py, whose graphs run elsewhere)."""
        self.directory = directory
        self.manifest = m = manifest
        vocab = m["vocab"]
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            vocab[k] for k in ("pad_id", "unk_id", "bos_id", "eos_id")
        )
        self.vocab_size: int = vocab["size"]
        self.max_positions: int = m["max_positions"]
        self.name: str = m["name"]
        self.self_specs = [c for c in m["caches"] if c["kind"] == "self"]
        self.self_names = [c["name"] for c in self.self_specs]
        self.next_names = [_NEXT + n for n in self.self_names]
        self.cross_names = [c["name"] for c in m["caches"] if c["kind"] == "cross"]
        # exports since the per-source cross caches name their batch axis "sources"; older ones get a row per hypothesis
        self.cross_per_source = bool(self.cross_names) and all(
            c["shape"][0] == "sources" for c in m["caches"] if c["kind"] == "cross"
        )
        gen = m.get("generation", {})
        self.search = Search.from_generation(gen)
        self.max_tokens: int = gen.get("max_tokens", 6000)
        self.max_sentences: int = gen.get("max_sentences", 128)
        self.sp = spm.SentencePieceProcessor()
        self.sp.LoadFromSerializedProto((self.directory / m["tokenizer"]).read_bytes())
        self._special = frozenset((self.pad_id, self.bos_id, self.eos_id))
        self.store_pool = StorePool()  # self-attention store memory reused from search to search

    # ------------------------------------------------------------------ building blocks
    def encode(self, src: np.ndarray, with_memory: bool = False) -> dict[str, np.ndarray]:
        """src [B, S] int64 (pad-right) → memory_pad_mask [B, S] and every cross cache (+ memory)."""
        names = (["memory"] if with_memory else []) + ["memory_pad_mask", *self.cross_names]
        out = self.encoder.run(names, {"src_tokens": np.ascontiguousarray(src, dtype=np.int64)})
        return dict(zip(names, out, strict=True))

    def stepper(
        self,
        encoded: dict[str, np.ndarray],
        rows: np.ndarray | None = None,
        full: bool = False,
        steps: int = 0,
        slots: int = 0,
    ) -> _Stepper:
        """A decoding state over source rows `rows` (default: every row once); `full` also fetches
        the [N, V] logits and log-probs of every step (verification); `steps`: the most steps expected and
        `slots` the most rows a step will have (the self-attention store is sized for them and grows if a caller
        goes beyond)."""
        if rows is None:
            rows = np.arange(len(encoded["memory_pad_mask"]), dtype=np.int64)
        return self.stepper_class(self, encoded, np.asarray(rows, dtype=np.int64), full, steps, slots)

    def _best_tokens(
        self,
        step: _Stepper,
        last: np.ndarray,
        t: int,
        k: int,
        at_limit: np.ndarray,
        search: Search,
        ended: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k best (log-prob [N, k], token [N, k]) of every row at position t after zoo.generate's bans
        (`_mask`); `ended` [N]: rows that have finished already (greedy search keeps them as padding).

        A row at its length limit may only end, with eos at log-prob 0 whatever the model says (zoo.generate), so
        a step where every row is at its limit or finished does not run the decoder: its output would be thrown
        away. That is the last step of every batch whose remaining sentences reach their maximum length — 1 of
        the 30 steps of a fixed-length 30-token search, none where every sentence ends before its limit."""
        must_end = at_limit if ended is None else at_limit | ended
        if must_end.all():  # `_mask` writes what every row gets: eos at log-prob 0, nothing else
            shape = (len(must_end), min(k, self.vocab_size))  # what the decoder's top-k would have returned
            lp, tok = np.zeros(shape, dtype=np.float32), np.full(shape, self.eos_id, dtype=np.int64)
            self._mask(lp, tok, t, must_end, search)
            return lp, tok
        lp, tok = step(last, t, k)
        self._mask(lp, tok, t, at_limit, search)
        return lp, tok

    def _mask(self, lp: np.ndarray, tok: np.ndarray, t: int, at_limit: np.ndarray, search: Search) -> None:
        """zoo.generate's bans on a row's best-token list: pad and bos always, eos before min_len;
        a row at its length limit gets only eos (log-prob 0). In place on lp/tok [N, k]."""
        banned = (tok == self.pad_id) | (tok == self.bos_id)
        if t < search.min_len:
            banned |= tok == self.eos_id
        lp[banned] = -np.inf
        if at_limit.any():
            lp[at_limit] = -np.inf
            lp[at_limit, 0] = 0.0
            tok[at_limit, 0] = self.eos_id

    def _strip(self, ids: Sequence[int]) -> list[int]:
        out = []
        for i in ids:
            if i in (self.eos_id, self.pad_id):
                break
            out.append(int(i))
        return out

    # ------------------------------------------------------------------ search
    def greedy_search(self, src: np.ndarray, search: Search | None = None) -> list[list[int]]:
        """Argmax decoding of src [B, S]; token ids per sentence (no bos/eos)."""
        return [h.tokens for h in self._greedy(src, search or self.search)]

    def _greedy(self, src: np.ndarray, search: Search) -> list[Hypothesis]:
        """Argmax decoding of src [B, S]: one hypothesis per sentence, scored as beam search scores."""
        b = src.shape[0]
        max_len = max_lengths((src != self.pad_id).sum(1), search, self.max_positions)  # [B]
        step = self.stepper(self.encode(src), steps=int(max_len.max()))
        tokens = np.full((b, 1), self.bos_id, dtype=np.int64)
        finished = np.zeros(b, dtype=bool)
        total = np.zeros(b, dtype=np.float32)  # [B] summed log-probs of the emitted tokens, eos included
        rows = np.arange(b)
        for t in range(int(max_len.max())):
            lp, tok = self._best_tokens(step, tokens[:, -1], t, _BANNED + 1, max_len <= t + 1, search, finished)
            best = lp.argmax(-1)  # [B] first maximum = lowest id among ties, as argmax
            total += np.where(finished, np.float32(0), lp[rows, best])
            nxt = tok[rows, best]
            nxt[finished] = self.pad_id
            tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
            finished |= nxt == self.eos_id
            if finished.all():
                break
        out = []
        for row, score in zip(tokens, total.tolist(), strict=True):
            ids = self._strip(row[1:].tolist())
            out.append(Hypothesis(ids, _normalised(score, len(ids) + 1, search.len_penalty)))
        return out

    def beam_search(self, src: np.ndarray, search: Search | None = None) -> list[list[int]]:
        """Batched beam search of src [B, S] (see the module docstring); best hypothesis per sentence."""
        return [hyps[0].tokens if hyps else [] for hyps in self._beam(src, search or self.search)]

    def _beam(self, src: np.ndarray, search: Search) -> list[list[Hypothesis]]:
        """Beam search of src [B, S]: every finished hypothesis per sentence (beam_size of them; fewer only
        when the length limit is 1 token), best first — the first finished wins ties, as in zoo.generate."""
        k = search.beam_size
        b = src.shape[0]
        max_len = max_lengths((src != self.pad_id).sum(1), search, self.max_positions)  # [B]
        # The first step runs one row per sentence, not K: all K beams start as the same bos hypothesis, and
        # zoo.generate's first step takes its 2K candidates from beam 0 alone (the others score -inf) — so a row
        # per sentence gives the same candidates for 1/K of the step (on the 36.7M model at beam 5 × batch 32,
        # 4/5 of one step of 30, of the paper's 10). It needs 2K allowed tokens in a row's list: a vocabulary
        # smaller than that (test models) starts with K rows as zoo.generate does.
        g = 1 if min(2 * k + _BANNED, self.vocab_size) - _BANNED >= 2 * k else k  # rows per sentence this step
        step = self.stepper(
            self.encode(src), np.repeat(np.arange(b, dtype=np.int64), g), steps=int(max_len.max()), slots=b * k
        )
        active = np.arange(b)  # original sentence ids still searching
        tokens = np.full((b * g, 1), self.bos_id, dtype=np.int64)
        scores = np.full((b, g), -np.inf, dtype=np.float32)
        scores[:, 0] = 0.0  # all beams start identical: keep one so the first step yields distinct ones
        finals: list[list[Hypothesis]] = [[] for _ in range(b)]
        arange2k = np.arange(2 * k)
        for t in range(int(max_len.max())):
            n = active.size
            at_limit = np.repeat(max_len[active] <= t + 1, g)
            lp, tok = self._best_tokens(step, tokens[:, -1], t, 2 * k + _BANNED, at_limit, search)  # [n*g, c]
            c = lp.shape[1]
            # torch.topk(2K) over [n, K*V] finds the same finite candidates among each row's c best
            cand = (scores.reshape(-1, 1) + lp).reshape(n, g * c)
            flat_tok = tok.reshape(n, g * c)
            flat_id = (np.arange(g * c) // c)[None, :] * self.vocab_size + flat_tok  # beam*V + token: tie order
            top = np.lexsort((flat_id, -cand), axis=1)[:, : 2 * k]  # [n, 2K] sorted by score desc
            top_scores = np.take_along_axis(cand, top, 1)
            beam_idx, token_idx = top // c, np.take_along_axis(flat_tok, top, 1)
            is_eos = (token_idx == self.eos_id) & (top_scores > -np.inf)
            done = np.zeros(n, dtype=bool)
            if is_eos.any():
                norm = float(t + 1) ** search.len_penalty
                prefix = tokens.reshape(n, g, -1)
                for r, j in zip(*np.nonzero(is_eos), strict=True):
                    bucket = finals[int(active[r])]
                    if len(bucket) < k and j < k:  # only eos among the top K counts, as fairseq
                        hyp = self._strip(prefix[r, beam_idx[r, j], 1:].tolist())
                        bucket.append(Hypothesis(hyp, float(top_scores[r, j]) / norm))
                done = np.array([len(finals[int(s)]) >= k for s in active])
            # continue with the best K non-eos candidates of every live sentence
            keep = np.argsort(arange2k[None, :] + is_eos * (2 * k), axis=1, kind="stable")[:, :k]  # [n, K]
            new_scores = np.take_along_axis(top_scores, keep, 1)
            new_beams = np.take_along_axis(beam_idx, keep, 1)
            new_tokens = np.take_along_axis(token_idx, keep, 1)
            live = np.nonzero(~done)[0]
            if live.size == 0:
                break
            rows = (live[:, None] * g + new_beams[live]).reshape(-1)  # rows of tokens/cache to continue
            tokens = np.concatenate([tokens[rows], new_tokens[live].reshape(-1, 1)], axis=1)
            scores = new_scores[live]
            active = active[live]
            step.select(rows)
            g = k
        return [sorted(bucket, key=lambda h: -h.score) for bucket in finals]  # stable: first finished wins ties

    def generate(self, src: np.ndarray, search: Search | None = None) -> list[list[int]]:
        """Greedy when beam_size <= 1, else beam search (as zoo.generate.generate)."""
        search = check_search(search or self.search)
        if search.beam_size <= 1:
            return self.greedy_search(src, search)
        return self.beam_search(src, search)

    def generate_nbest(
        self, src: np.ndarray, search: Search | None = None, num_hypotheses: int = 1
    ) -> list[list[Hypothesis]]:
        """The `num_hypotheses` best hypotheses per source of src [B, S] with their scores, best first (greedy
        when beam_size <= 1: its one hypothesis), as zoo.generate.generate_nbest. The first is always
        `generate`'s output; fewer than asked only when the search finished fewer (a length limit of 1 token
        leaves the empty hypothesis alone). SearchError for bad settings or num_hypotheses outside 1 … beam_size."""
        search = check_search(search or self.search)
        n = check_num_hypotheses(num_hypotheses, search.beam_size)
        if search.beam_size <= 1:
            return [[h] for h in self._greedy(src, search)]
        return [hyps[:n] for hyps in self._beam(src, search)]

    # ------------------------------------------------------------------ text in, text out
    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, truncated to half the position limit (as zoo's translate_texts)."""
        limit = max(1, self.max_positions // 2)
        return [ids[:limit] or [self.unk_id] for ids in self.sp.encode(list(texts), out_type=int)]

    def decode_ids(self, ids: Sequence[int]) -> str:
        return self.sp.decode([int(i) for i in ids if int(i) not in self._special])

    def pad(self, encoded: Sequence[Sequence[int]]) -> np.ndarray:
        """Right-padded [B, S] int64 batch."""
        src = np.full((len(encoded), max(len(e) for e in encoded)), self.pad_id, dtype=np.int64)
        for row, ids in enumerate(encoded):
            src[row, : len(ids)] = ids
        return src

    def search_settings(self, **given: Any) -> Search:
        """The manifest's search defaults with the given (non-None) settings, validated (SearchError)."""
        return check_search(Search(**{**self.search.__dict__, **{k: v for k, v in given.items() if v is not None}}))

    def request_cost(self, lengths: Sequence[int], search: Search) -> int:
        """rows × beam × maximum output tokens of a batch of sources with these token lengths: the bound on
        decoder row-steps a server charges a request against its budget, before running anything."""
        if not lengths:
            return 0
        limits = max_lengths(np.asarray(lengths, dtype=np.int64), search, self.max_positions)
        return int(limits.sum()) * int(search.beam_size)

    def translate_encoded(
        self,
        encoded: Sequence[Sequence[int]],
        search: Search,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[str]:
        """Token ids per source (as `encode_texts` gives them) → output strings in input order (the search
        settings are validated first: SearchError)."""
        nbest = self.translate_encoded_nbest(encoded, search, 1, max_tokens, max_sentences)
        return [hyps[0].text if hyps else "" for hyps in nbest]

    def translate_encoded_nbest(
        self,
        encoded: Sequence[Sequence[int]],
        search: Search,
        num_hypotheses: int = 1,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[list[Translation]]:
        """Token ids per source → per source its `num_hypotheses` best `Translation(text, score, tokens)`, best
        first, in input order (the first text is `translate_encoded`'s output). SearchError for bad settings or
        num_hypotheses outside 1 … beam_size, raised before anything runs."""
        search = check_search(search)
        num_hypotheses = check_num_hypotheses(num_hypotheses, search.beam_size)
        outputs: list[list[Translation]] = [[] for _ in encoded]
        for idx in _batches(
            [len(e) for e in encoded], max_tokens or self.max_tokens, max_sentences or self.max_sentences
        ):
            nbest = self.generate_nbest(self.pad([encoded[i] for i in idx]), search, num_hypotheses)
            for i, hyps in zip(idx, nbest, strict=True):
                outputs[i] = [Translation(self.decode_ids(h.tokens), h.score, h.tokens) for h in hyps]
        return outputs

    def translate(
        self,
        texts: str | Sequence[str],
        beam_size: int | None = None,
        len_penalty: float | None = None,
        max_len_a: float | None = None,
        max_len_b: int | None = None,
        min_len: int | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        num_hypotheses: int | None = None,
        return_scores: bool = False,
    ) -> list[str] | list[list[Translation]]:
        """Source strings → output strings in input order (unset options: the manifest's defaults; a setting
        outside SEARCH_LIMITS raises SearchError naming the allowed range).

        With `num_hypotheses` (an integer 1 … beam_size, else SearchError naming them) or `return_scores`, per
        source a list of `Translation(text, score, tokens)` instead: the num_hypotheses (default 1) best
        hypotheses, best first, scored as the search ranks them (module docstring). The first text is always
        what the plain call returns."""
        if isinstance(texts, str):
            texts = [texts]
        search = self.search_settings(
            beam_size=beam_size, len_penalty=len_penalty, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len
        )
        if num_hypotheses is None and not return_scores:
            return self.translate_encoded(self.encode_texts(texts), search, max_tokens, max_sentences)
        n = check_num_hypotheses(1 if num_hypotheses is None else num_hypotheses, search.beam_size)
        return self.translate_encoded_nbest(self.encode_texts(texts), search, n, max_tokens, max_sentences)

    # ------------------------------------------------------------------ forced decoding
    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per target text to score, truncated to what the search can produce: max_positions - 2
        tokens, so that with eos the output stays below the position limit (as zoo.evaluation.encode_targets).
        An empty target stays empty (it scores eos alone)."""
        cap = max(0, self.max_positions - 2)
        return [ids[:cap] for ids in self.sp.encode(list(texts), out_type=int)]

    def check_targets(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> None:
        """ScoreError unless there is one target per source and every target is at most max_positions - 2 ids
        in [0, vocab size) — what `score_encoded` can run (a server checks this before queueing a request)."""
        if len(sources) != len(targets):
            raise ScoreError(f"got {len(sources)} sources but {len(targets)} targets; give one target per source")
        cap = self.max_positions - 2
        for i, ids in enumerate(targets):
            if len(ids) > cap:
                raise ScoreError(f"target {i} has {len(ids)} tokens; the model produces at most {cap} (+ eos)")
            if any(not 0 <= int(t) < self.vocab_size for t in ids):
                raise ScoreError(f"target {i} holds token ids outside the vocabulary [0, {self.vocab_size})")

    def score_cost(self, targets: Sequence[Sequence[int]]) -> int:
        """Decoder row-steps of scoring these targets (tokens + eos each): `request_cost`'s unit, for budgets."""
        return sum(len(t) + 1 for t in targets)

    def score_encoded(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        len_penalty: float | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[Scored]:
        """Token ids per source (as `encode_texts` gives them) and per target (as `encode_targets`) → per pair
        `Scored(tokens, token_logprobs, score)` in input order: the teacher-forced log-prob of each target token
        and of eos, and the sentence score normalised with `len_penalty` (default: the manifest's) as beam
        search ranks hypotheses — equal to zoo.generate.score_targets to 1e-4. Batched by source length as
        `translate_encoded`. ScoreError (`check_targets`) or SearchError (len_penalty) before anything runs."""
        self.check_targets(sources, targets)
        penalty = float(search_setting("len_penalty", self.search.len_penalty if len_penalty is None else len_penalty))
        out: list[Scored | None] = [None] * len(sources)
        for idx in _batches(
            [len(s) for s in sources], max_tokens or self.max_tokens, max_sentences or self.max_sentences
        ):
            scored = self._teacher_forced(self.pad([sources[i] for i in idx]), [targets[i] for i in idx])
            for i, (ids, token_lp) in zip(idx, scored, strict=True):
                total = float(np.sum(token_lp, dtype=np.float32))
                out[i] = Scored(ids, token_lp.tolist(), _normalised(total, len(ids), penalty))
        return [s for s in out if s is not None]

    def _teacher_forced(self, src: np.ndarray, targets: Sequence[Sequence[int]]) -> list[tuple[list[int], np.ndarray]]:
        """src [B, S] and one target per row → per row (target ids + eos, their log-probs [len] f32), feeding
        bos + target one step at a time through the search's own decoder graph and reading each next token's
        log-prob from the full `log_probs` output. Rows leave the batch once their eos is scored."""
        b = src.shape[0]
        lengths = np.array([len(t) + 1 for t in targets])  # [B] scored positions: tokens + eos
        width = int(lengths.max())
        feed = np.full((b, width), self.pad_id, dtype=np.int64)  # [B, T] bos + target
        want = np.full((b, width), self.pad_id, dtype=np.int64)  # [B, T] target + eos
        for row, ids in enumerate(targets):
            feed[row, : lengths[row]] = [self.bos_id, *ids]
            want[row, : lengths[row]] = [*ids, self.eos_id]
        lp = np.zeros((b, width), dtype=np.float32)  # [B, T]
        step = self.stepper(self.encode(src), steps=width)
        live = np.arange(b)  # rows of the batch still being scored, in stepper order
        for t in range(width):
            dist = step.distribution(feed[live, t], t)  # [n, V]
            lp[live, t] = dist[np.arange(live.size), want[live, t]]
            keep = np.nonzero(lengths[live] > t + 1)[0]
            if keep.size == 0:
                break
            if keep.size < live.size:
                step.select(keep)
                live = live[keep]
        return [(want[row, :n].tolist(), lp[row, :n]) for row, n in enumerate(lengths.tolist())]

    def score(
        self,
        sources: str | Sequence[str],
        targets: str | Sequence[str],
        len_penalty: float | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> list[Scored]:
        """Forced decoding of text pairs: per (source, target) the target's `Scored(tokens, token_logprobs,
        score)` (see `score_encoded`) — for reranking, filtering, quality estimation. Sources are truncated as
        `translate` truncates them, targets to max_positions - 2 tokens (`encode_targets`); an empty target
        scores eos alone. Scoring a hypothesis `translate` returned gives back its score to 1e-4 unless the
        search forced eos at its length limit (log-prob 0 there, the model's real one here) or its text
        re-tokenises to other ids than the search produced (`score_encoded` its `tokens` for the exact score).
        ScoreError unless there is one target per source."""
        if isinstance(sources, str):
            sources = [sources]
        if isinstance(targets, str):
            targets = [targets]
        if len(sources) != len(targets):
            raise ScoreError(f"got {len(sources)} sources but {len(targets)} targets; give one target per source")
        return self.score_encoded(
            self.encode_texts(sources), self.encode_targets(targets), len_penalty, max_tokens, max_sentences
        )


def load(
    directory: str | os.PathLike[str],
    threads: int | None = None,
    optimization: str | None = None,
    check_files: bool = True,
    spinning: bool = False,
    provider: str = "cpu",
    device_id: int = 0,
) -> ExportedModel:
    """Load an export directory (`python -m export …` output) for translation: `threads` ORT intra-op
    threads (default: the manifest's, else all cores), `optimization` ORT graph optimisation level
    (disabled|basic|extended|all, default: the manifest's), `check_files` verifies sha256 checksums,
    `spinning` lets ORT's idle threads spin (lower latency on dedicated cores), `provider` cpu | cuda runs the
    graphs on ORT's CPU or CUDA execution provider (GPU `device_id`; needs onnxruntime-gpu)."""
    return ExportedModel(
        directory,
        threads=threads,
        optimization=optimization,
        check_files=check_files,
        spinning=spinning,
        provider=provider,
        device_id=device_id,
    )
