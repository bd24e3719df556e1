"""Triton `model_warmup` for the text models: a model is marked ready only after it has translated real text.

Why: the first request to a fresh ORT session pays for memory-arena growth and kernel selection at every new
shape; without warm-up that cost lands on the first user (measured in serve/README.md). Triton runs the samples
of `model_warmup` on every instance before reporting the model ready, so the cost moves to load time.

The sample is a held-out source sentence of the export (real text: an empty or random string would be answered
without running the model, see model_common). Warm-up requests carry no request parameters (Triton's
ModelWarmup has none), so they run the export's default search (beam search with the manifest's beam size, the
path most requests take); greedy decoding runs the same two ORT sessions with smaller shapes. Two samples: one
sentence, and a batch of the same sentence as large as the dynamic batcher's smallest preferred batch, cut so
that it stays within `max_request_cost` (a refused warm-up request would fail the model's load).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export import runtime as export_runtime
from export.runtime.tokenizer import load_tokenizer
from serve.errors import ServeError

WARMUP_DIR = "warmup"  # Triton reads `input_data_file` names relative to <model dir>/warmup/
SAMPLE_FILE = "sample_text"
INPUT = "TEXT"
MAX_SAMPLE_ROWS = 8
REEXPORT = "re-export the model with `python -m export`"
MAX_HELDOUT_BYTES = 64 << 20  # the sample is a few hundred sentences (kB); a larger file is not one


class WarmupError(ServeError):
    """The export's held-out sample cannot be read as one (the warm-up sentence comes from it)."""


@dataclass(frozen=True)
class WarmupPlan:
    """The sample sentence and the batch sizes it is sent with (each ≤ max_batch_size and within budget)."""

    sentence: str
    batch_sizes: tuple[int, ...]


def serialize_strings(texts: list[str]) -> bytes:
    """Triton's raw BYTES tensor layout, as `input_data_file` expects it: per element a 4-byte little-endian
    length, then the UTF-8 bytes."""
    out = bytearray()
    for text in texts:
        data = text.encode("utf-8")
        out += struct.pack("<I", len(data)) + data
    return bytes(out)


def heldout_sources(path: Path) -> list[str]:
    """The held-out sample's source sentences: `{"src": [str, …], …}` in a regular file of at most
    MAX_HELDOUT_BYTES, else a WarmupError naming the file and what is wrong (an export is untrusted input)."""
    try:
        held = json.loads(export_runtime.read_limited(path, MAX_HELDOUT_BYTES).decode("utf-8"))
    except export_runtime.ExportedModelError as exc:
        raise WarmupError(str(exc)) from None
    except (ValueError, RecursionError) as exc:
        raise WarmupError(
            f"{path} is not JSON ({str(exc)[:120]}); re-export the model with `python -m export`"
        ) from None
    sources = held.get("src") if isinstance(held, dict) else None
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise WarmupError(f"{path} has no 'src' list of strings; {REEXPORT}")
    return sources


def plan_warmup(
    export_dir: Path, manifest: export_runtime.Manifest, max_batch_size: int, max_request_cost: int
) -> WarmupPlan | None:
    """Choose the sample (the longest held-out source up to the median token length: realistic, not extreme)
    and the batch sizes whose request cost (rows × beam × maximum output tokens) fits `max_request_cost`;
    None when the export has no held-out text or not even one sentence fits the budget."""
    sources = [s for s in heldout_sources(export_dir / manifest["heldout"]) if s.strip()]
    if not sources:
        return None
    with export_runtime.open_regular(export_dir / manifest["tokenizer"]) as fh:
        tokenizer = load_tokenizer(fh.read())
    limit = max(1, manifest["max_positions"] // 2)
    lengths = [min(len(ids), limit) or 1 for ids in tokenizer.encode_sources(sources)]
    median = sorted(lengths)[len(lengths) // 2]
    length, sentence = max((n, s) for n, s in zip(lengths, sources, strict=True) if n <= median)
    search = export_runtime.Search.from_generation(manifest["generation"])
    lengths_arr = np.asarray([length], dtype=np.int64)
    per_row = int(export_runtime.max_lengths(lengths_arr, search, manifest["max_positions"])[0])
    per_row *= max(1, int(search.beam_size))
    fitting = max_request_cost // per_row
    sizes = sorted({b for b in (1, min(MAX_SAMPLE_ROWS, max_batch_size)) if b <= fitting})
    return WarmupPlan(sentence, tuple(sizes)) if sizes else None


def warmup_text(plan: WarmupPlan | None) -> str:
    """The config.pbtxt `model_warmup` block ("" without a plan)."""
    if plan is None:
        return ""
    samples = ",\n".join(
        f'  {{ name: "sample_batch{b}" batch_size: {b} count: 1 inputs {{ key: "{INPUT}" value {{ '
        f'data_type: TYPE_STRING dims: [ 1 ] input_data_file: "{SAMPLE_FILE}" }} }} }}'
        for b in plan.batch_sizes
    )
    return f"model_warmup [\n{samples}\n]"


def write_warmup_data(model_dir: Path, plan: WarmupPlan | None) -> None:
    """<model dir>/warmup/sample_text: one BYTES element (Triton repeats it for each row of a sample batch)."""
    if plan is None:
        return
    (model_dir / WARMUP_DIR).mkdir(exist_ok=True)
    (model_dir / WARMUP_DIR / SAMPLE_FILE).write_bytes(serialize_strings([plan.sentence]))
