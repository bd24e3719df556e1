"""What a request costs an instance, in the unit the lanes count: a plain search's decoder row-step (copied next to
model.py; pure Python).

Why a price beside the row-step bound: the bound (`request_cost`: rows × beam × maximum output tokens) says how
many decoder steps a request may take, not what each costs. The options that read every row's whole distribution
each step (sampling, the repetition options) made a row-step several times dearer, and requests whose sources are
all empty were priced 0 although their answer costs Triton a response — so sampled requests priced under the
express limit held the express lane, and a stream of empty requests made a one-word request wait 34 s (issue 84).
The rule: price = row-steps × (1 + Σ (factor − 1) over the options a request uses) + rows × per_row +
per_request, each factor and minimum measured on the served model by `python -m serve.bench.prices`
(serve/bench/prices.py) and read from the `prices.json` beside model.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRICES_FILE = "prices.json"
OPTIONS = ("beam", "sampling", "repetition_penalty", "no_repeat_ngram_size", "return_alignments")


@dataclass(frozen=True)
class PriceRule:
    """Per option the cost of a row-step with it relative to a plain greedy one; the fixed costs in row-steps."""

    factors: dict[str, float]
    per_row: float
    per_request: float

    @classmethod
    def read(cls, path: str | Path) -> PriceRule:
        raw = json.loads(Path(path).read_text())
        factors = {name: float(raw["factors"].get(name, 1.0)) for name in OPTIONS}
        rule = cls(factors, float(raw["per_row"]), float(raw["per_request"]))
        bad = [k for k, v in factors.items() if not (math.isfinite(v) and v >= 1.0)]
        if bad or not (0 <= rule.per_row < 1e6 and 0 <= rule.per_request < 1e6):
            raise ValueError(f"{path}: factors must be finite and ≥ 1 ({bad}), per_row and per_request in [0, 1e6)")
        return rule

    def price(self, row_steps: int, rows: int, options: tuple[str, ...]) -> int:
        """The price of a request of `rows` sources bounded by `row_steps`, using `options` (names of OPTIONS)."""
        factor = 1.0 + sum(self.factors[o] - 1.0 for o in options)
        return math.ceil(row_steps * factor + rows * self.per_row + self.per_request)


def options_of(search: Any) -> tuple[str, ...]:
    """The priced options a translation uses: its search's settings and the optional outputs it asked for."""
    used = []
    if search.beam_size > 1 and not search.sampling:
        used.append("beam")
    if search.sampling:
        used.append("sampling")
    if search.repetition_penalty != 1.0:
        used.append("repetition_penalty")
    if search.no_repeat_ngram_size > 0:
        used.append("no_repeat_ngram_size")
    if search.return_alignments:
        used.append("return_alignments")
    return tuple(used)
