"""Run an exported attention-zoo model with numpy + onnxruntime + sentencepiece only.

    import export
    model = export.load("exports/transformer-deen")
    model.translate(["Guten Morgen."])            # → ["Good morning."]

Why a separate runtime: serving must not need torch. This package is the ground floor: it imports the standard
library, numpy, onnxruntime and sentencepiece, and of itself only relatively — nothing of `zoo`, `serve` or the
exporter (tests/test_imports.py) — so `zoo`, the exporter, `serve` and the Triton models (which carry a copy of
`export/__init__.py` and this package under the same import path) all import it downward; everything
model-specific comes from the export directory's manifest.json.

    manifest   the manifest's schema and the one reader that checks it (`read_manifest`)
    manifest_checks  what that reader checks: the export format's files, regular files, every number's range
    search     settings (`Search`: every option of a call), results, errors and limits of both engines
    generation the one decoding driver (checks, batching, dispatch, n-best, scoring) over any `Engine`
    stores     host memory of a search: the self-attention store, its pool, the shared onnxruntime arena
    backend    where the two graphs run (`OrtBackend`: in-process sessions)
    model      `ExportedModel`: the driver's engine over a backend's two graphs (tokenizer, manifest defaults)

Every name is imported here at once. onnxruntime itself is not: backend.py and stores.py import it inside the
functions that make sessions, so zoo, which takes its search types from here, never loads it into a torch process.
"""

from __future__ import annotations

from .backend import (
    OPTIMIZATION_LEVELS,
    PROVIDERS,
    SPINNING,
    Backend,
    OrtBackend,
    check_spinning,
    execution_providers,
    resolve_spinning,
    shared_initializers,
    spinning_from_text,
    spinning_text,
)
from .errors import ExportedModelError, ExportRuntimeError, GraphRunError
from .loading import load
from .manifest import (
    ALIGNMENT_OUTPUT,
    MANIFEST,
    MANIFEST_KEYS,
    NEXT_PREFIX,
    OLDEST_RUNTIME_FORMAT,
    RUNTIME_FORMAT,
    AlignmentInfo,
    CacheEntry,
    CheckpointRef,
    GenerationDefaults,
    GraphInfo,
    Graphs,
    HeadsInfo,
    Int8Quality,
    Manifest,
    RuntimeDefaults,
    SharedWeight,
    SizeInfo,
    Vocab,
    read_manifest,
    sha256_file,
)
from .manifest_checks import EXPORT_FILES, MANIFEST_LIMITS, open_regular, read_limited
from .model import ExportedModel
from .search import (
    SEARCH_LIMITS,
    Hypothesis,
    RowLimits,
    Scored,
    ScoreError,
    Search,
    SearchError,
    Translation,
    check_num_hypotheses,
    concat_limits,
    forced_limits,
    max_lengths,
    row_limits,
    search_setting,
)
from .stepper import Stepper, cross_rows
from .stores import SelfCache, StorePool, mapped_zeros

__all__ = [
    "ALIGNMENT_OUTPUT",
    "EXPORT_FILES",
    "MANIFEST",
    "MANIFEST_KEYS",
    "MANIFEST_LIMITS",
    "NEXT_PREFIX",
    "OLDEST_RUNTIME_FORMAT",
    "OPTIMIZATION_LEVELS",
    "PROVIDERS",
    "RUNTIME_FORMAT",
    "SEARCH_LIMITS",
    "SPINNING",
    "AlignmentInfo",
    "Backend",
    "CacheEntry",
    "CheckpointRef",
    "ExportRuntimeError",
    "ExportedModel",
    "ExportedModelError",
    "GenerationDefaults",
    "GraphInfo",
    "GraphRunError",
    "Graphs",
    "HeadsInfo",
    "Hypothesis",
    "Int8Quality",
    "Manifest",
    "OrtBackend",
    "RowLimits",
    "RuntimeDefaults",
    "ScoreError",
    "Scored",
    "Search",
    "SearchError",
    "SelfCache",
    "SharedWeight",
    "SizeInfo",
    "Stepper",
    "StorePool",
    "Translation",
    "Vocab",
    "check_num_hypotheses",
    "check_spinning",
    "concat_limits",
    "cross_rows",
    "execution_providers",
    "forced_limits",
    "load",
    "mapped_zeros",
    "max_lengths",
    "open_regular",
    "read_limited",
    "read_manifest",
    "resolve_spinning",
    "row_limits",
    "search_setting",
    "sha256_file",
    "shared_initializers",
    "spinning_from_text",
    "spinning_text",
]
