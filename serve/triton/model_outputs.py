"""What a translation response holds: its output arrays, built in one place (copied next to model.py).

Why one place: OUTPUT is always returned and every other output is optional, asked for by a boolean request
parameter; each optional output is one entry of OPTIONAL_OUTPUTS (the parameter, the tensor it adds and the
function that fills it from the hypotheses), so the parameter's parsing (model_requests.py), the batching key
(requests asking for different outputs are generated apart) and the response all follow from that entry. Word
alignments (per hypothesis one source-token index per target token) are such an entry; an output is declared in
the model config too (serve/model_config.py `text_io_text`). Only numpy is imported: no Triton, no runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

OUTPUT = "OUTPUT"
SCORES = "SCORES"
ALIGNMENT = "ALIGNMENT"

# A request's hypotheses: per row its n hypotheses, best first, each with the runtime's Translation fields (text,
# score, tokens) or None where there is none (an empty source, or a search that finished fewer than n)
Grid = Sequence[Sequence[Any]]


def texts(grid: Grid) -> np.ndarray:
    """OUTPUT: [rows, n] TYPE_STRING of UTF-8 bytes ("" where a row has no hypothesis)."""
    rows = [[b"" if h is None else h.text.encode("utf-8") for h in row] for row in grid]
    return np.array(rows, dtype=np.object_).reshape(len(grid), -1)


def scores(grid: Grid) -> np.ndarray:
    """SCORES: [rows, n] TYPE_FP32, each hypothesis' score (NaN where a row has no hypothesis)."""
    rows = [[np.nan if h is None else h.score for h in row] for row in grid]
    return np.array(rows, dtype=np.float32).reshape(len(grid), -1)


def alignments(grid: Grid) -> np.ndarray:
    """ALIGNMENT: [rows, n, T] TYPE_INT32, per hypothesis and target token the source piece it attended to most
    (an index into the source's tokens; export/runtime/alignment.py maps pieces to words), -1 after its last token
    and where a row has no hypothesis."""
    width = max((len(h.tokens) for row in grid for h in row if h is not None), default=0)
    n = max((len(row) for row in grid), default=0)
    out = np.full((len(grid), n, width), -1, dtype=np.int32)
    for r, row in enumerate(grid):
        for j, h in enumerate(row):
            if h is not None and h.alignment:
                out[r, j, : len(h.alignment)] = h.alignment
    return out


# request parameter → (output tensor, its builder); the hook for more optional outputs (module docstring)
OPTIONAL_OUTPUTS: dict[str, tuple[str, Callable[[Grid], np.ndarray]]] = {
    "return_scores": (SCORES, scores),
    "return_alignments": (ALIGNMENT, alignments),
}


def response_arrays(grid: Grid, search: Any) -> list[tuple[str, np.ndarray]]:
    """A translation request's output arrays: OUTPUT, then each optional output its `search` asked for (the
    OPTIONAL_OUTPUTS whose flag is set)."""
    asked = [(name, build) for flag, (name, build) in OPTIONAL_OUTPUTS.items() if getattr(search, flag)]
    return [(OUTPUT, texts(grid)), *((name, build(grid)) for name, build in asked)]


def generated_tokens(grid: Grid) -> int:
    """Tokens of the returned hypotheses (the metrics' zoo_generated_tokens_total)."""
    return sum(len(h.tokens) for row in grid for h in row if h is not None)
