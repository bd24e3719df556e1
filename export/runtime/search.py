"""Search settings, results, length bounds and errors of both engines (the loops over them: search_loop.py).

`Search` is checked once, where it is made, so a setting, a result and an error are the same in both engines by
construction. Scores, one definition everywhere: a hypothesis' summed token log-probs, eos included, / length **
len_penalty (length counting eos; with a target prefix, the tokens after it) — what beam search ranks by and what
teacher-forced scoring gives back, except where the search forced eos at the length limit (log-prob 0 there, the
model's real log-prob when scored).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from .errors import ExportRuntimeError

# Allowed search settings: [lowest, highest]. Bounded so that no setting can overflow the length arithmetic or
# return a silently wrong answer (NaN/inf penalties, 2^63 lengths); lengths are capped by the model's positions
# anyway, and a request's total cost is bounded separately by whoever serves it.
SEARCH_LIMITS: dict[str, tuple[int | float, int | float]] = {
    "beam_size": (1, 64),
    "len_penalty": (0.0, 10.0),
    "max_len_a": (0.0, 10.0),
    "max_len_b": (0, 4096),
    "min_len": (0, 4096),
    "shortlist": (0, 1),  # 1: decode over the export's vocabulary shortlist (shortlist.py), 0: the whole vocabulary
    # repetition control and sampling (processing.py): 0 / 1.0 are off
    "no_repeat_ngram_size": (0, 64),
    "repetition_penalty": (0.0, 10.0),  # open below: > 0
    "sampling": (0, 1),  # 1: draw each token (greedy search's loop, beam_size 1) instead of taking the best
    "top_k": (0, 1_000_000),  # sampling: draw among the k most likely tokens (0: all)
    "top_p": (0.0, 1.0),  # sampling: among the nucleus of this mass (open below: > 0)
    "temperature": (0.0, 100.0),  # sampling: logits / temperature (open below: > 0)
    "seed": (0, 2**32 - 1),  # sampling: with the sentence's index, what a draw depends on
}
_INTEGER_SETTINGS = frozenset(
    {"beam_size", "max_len_b", "min_len", "shortlist", "no_repeat_ngram_size", "sampling", "top_k", "seed"}
)
_OPEN_BELOW = frozenset({"repetition_penalty", "top_p", "temperature"})  # 0 itself is not allowed
MAX_SAMPLES = 64  # the most samples one source may ask for (num_hypotheses with sampling=1)
# what a call returns, beside the settings of its search: how many hypotheses per source and which optional
# outputs — options of one call, never a model's defaults (a manifest does not store them)
CALL_OPTIONS = ("num_hypotheses", "return_scores", "return_alignments")
FLAGS = frozenset({"return_scores", "return_alignments"})  # booleans: true/false (JSON, or its text from a server)
# settings that act only when sampling: their neutral values
SAMPLING_ONLY = {"top_k": 0, "top_p": 1.0, "temperature": 1.0}
# A server's default budgets in decoder row-steps (rows × beam × max output tokens: ExportedModel.request_cost), one
# home for serve's settings and the Triton models: they keep one request of the CPU preset's model (d_model 256,
# 3+3 layers) to a few seconds on one core (serve/README.md measures them)
DEFAULT_MAX_REQUEST_COST = 10_000  # the most one request may ask for (more: refused)
DEFAULT_MAX_EXECUTE_COST = 40_000  # the most one batch runs at once (the rest waits for the next batch)
DEFAULT_EXPRESS_COST = 1_000  # requests up to this (≈ 4 sentences at beam 5) run in the express lane
# A decoding batch's default size in both engines (an export's manifest may set its own): padded source tokens
# and sentences (`length_batches`)
DEFAULT_MAX_TOKENS = 6000
DEFAULT_MAX_SENTENCES = 128
# what the error says when a setting sent as text is not written as `_integer_text` / `_decimal_text` read it
WRITTEN = {
    True: "written in ASCII digits (e.g. '10'; no '_', exponent, '+' or other scripts)",
    False: "written as an ASCII decimal (e.g. '1.5' or '2e-1'; no '_', 'nan', 'inf' or other scripts)",
}


class SearchError(ExportRuntimeError, ValueError):
    """A search setting (or num_hypotheses) that is not a finite number within its limits; the message names the
    allowed range."""


class ScoreError(ExportRuntimeError, ValueError):
    """Targets that cannot be scored (not one per source, too long for the model, ids outside the vocabulary);
    the message says which and what is allowed."""


def _bounded(
    name: str, value: Any, low: float, high: float, integer: bool, allowed: str, open_low: bool = False
) -> int | float:
    """`value` as a finite number in [low, high] (an integer when `integer`: whole floats pass, as JSON sends
    them), else SearchError naming `name` and `allowed`. Text (Triton parameters may arrive as strings) is read
    strictly, in ASCII (`TEXT_FORMS`): Python's own int()/float() would read "1_0" and "1e1" as 10 and "٣" as 3."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating, str)):
        raise SearchError(f"{name}={_shown(value)} is not a number; {allowed}")
    if isinstance(value, str):
        if len(value) > 32 or not (_integer_text(value) if integer else _decimal_text(value)):
            raise SearchError(
                f"{name}={_shown(value)} is not a number in the allowed form; {allowed}, {WRITTEN[integer]}"
            )
        value = int(value) if integer else float(value)
    if isinstance(value, (int, np.integer)):  # compared as integers: a huge one must not overflow a float
        if not low <= value <= high or (open_low and value == low):
            raise SearchError(f"{name}={_shown(value)} is out of range; {allowed}")
        return int(value) if integer else float(value)
    number = float(value)
    if not np.isfinite(number) or not low <= number <= high or (open_low and number == low):
        raise SearchError(f"{name}={_shown(value)} is out of range; {allowed}")
    if integer:
        if number != int(number):
            raise SearchError(f"{name}={_shown(value)} is not an integer; {allowed}")
        return int(number)
    return number


def _digits(text: str) -> bool:
    """One or more ASCII digits 0-9, nothing else (str.isdigit alone takes "٣" and "²")."""
    return bool(text) and text.isascii() and text.isdigit()


def _integer_text(text: str) -> bool:
    """[-]digits."""
    return _digits(text[1:] if text.startswith("-") else text)


def _decimal_text(text: str) -> bool:
    """[-]digits[.digits] or [-].digits, then optionally e|E [+|-] digits."""
    mantissa, _, exponent = text.lower().partition("e")
    if "e" in text.lower() and not _digits(exponent[1:] if exponent[:1] in "+-" else exponent):
        return False
    whole, _, fraction = (mantissa[1:] if mantissa.startswith("-") else mantissa).partition(".")
    return (_digits(whole) or _digits(fraction)) and all(_digits(p) for p in (whole, fraction) if p)


def _shown(value: Any) -> str:
    """A value as an error message shows it: at most 40 characters (a huge integer has no repr at all)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def search_setting(name: str, value: Any) -> int | float:
    """One search setting checked and converted: an integer where the search counts, a finite float else, a
    bool for FLAGS (num_hypotheses is checked against its search's most_hypotheses: `Search`)."""
    if name in FLAGS:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, (bool, np.bool_)):
            raise SearchError(f"{name}={_shown(value)} is not a boolean; allowed: true or false")
        return bool(value)
    if name not in SEARCH_LIMITS:
        raise SearchError(f"unknown search setting {name!r}; allowed: {sorted([*SEARCH_LIMITS, *CALL_OPTIONS])}")
    low, high = SEARCH_LIMITS[name]
    integer = name in _INTEGER_SETTINGS
    opened = name in _OPEN_BELOW
    kind = "an integer" if integer else "a finite number"
    return _bounded(
        name, value, low, high, integer, f"allowed: {kind} in {'(' if opened else '['}{low}, {high}]", opened
    )


def check_num_hypotheses(value: Any, most: int, sampling: bool = False) -> int:
    """How many hypotheses to return per source (validated): an integer 1 … `most` — a search's
    `most_hypotheses`: beam_size (greedy search has one), or MAX_SAMPLES draws when sampling — else SearchError
    naming the allowed values."""
    most = max(1, int(most))
    why = f"samples, at most {most}" if sampling else f"at most beam_size={most}"
    return int(_bounded("num_hypotheses", value, 1, most, True, f"allowed: an integer in [1, {most}] ({why})"))


@dataclass(frozen=True)
class Search:
    """Every decoding option of a call as one value — the search's settings and what the call returns (as Hugging
    Face's GenerationConfig, CTranslate2's TranslationOptions) — each checked against SEARCH_LIMITS and converted
    when the object is made (SearchError names the setting and its range): a Search in hand is valid, so nothing
    downstream checks it again, and a new option is a field here, the code that acts on it, and its flag."""

    beam_size: int = 5
    len_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1
    shortlist: int = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    sampling: int = 0
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    num_hypotheses: int = 1  # hypotheses per source, best first: 1 … beam_size (sampling: 1 … MAX_SAMPLES draws)
    return_scores: bool = False
    return_alignments: bool = False  # per output token the source piece it attended to most

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "num_hypotheses":
                object.__setattr__(self, f.name, search_setting(f.name, getattr(self, f.name)))
        if self.sampling and self.beam_size > 1:
            raise SearchError(
                f"sampling=1 with beam_size={self.beam_size}: sampling draws one token at a time; set beam_size=1 "
                "(num_hypotheses draws several samples per source), or sampling=0"
            )
        if not self.sampling:
            for name, neutral in SAMPLING_ONLY.items():
                if getattr(self, name) != neutral:
                    raise SearchError(f"{name}={getattr(self, name)} acts only when sampling; set sampling=1 too")
        n = check_num_hypotheses(self.num_hypotheses, self.most_hypotheses, bool(self.sampling))
        object.__setattr__(self, "num_hypotheses", n)

    @property
    def processed(self) -> bool:
        """Whether a step needs every row's whole distribution (processing.py) instead of the graph's top k."""
        return bool(self.sampling or self.no_repeat_ngram_size or self.repetition_penalty != 1.0)

    @property
    def most_hypotheses(self) -> int:
        """The most hypotheses per source this search returns: its beams, or MAX_SAMPLES draws."""
        return MAX_SAMPLES if self.sampling else self.beam_size

    def settings(self) -> dict[str, Any]:
        """The search's settings without the call's options (CALL_OPTIONS): what a manifest stores as defaults."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in CALL_OPTIONS}

    @classmethod
    def from_generation(cls, gen: Mapping[str, Any]) -> Search:
        """The one conversion of a `generation` node — a config's (train, evaluate, export) or a manifest's —
        into settings; keys it lacks or leaves None (a config's null) keep their defaults, the values written
        here only, and its batching keys are not search settings."""
        return cls(**{f.name: gen[f.name] for f in fields(cls) if gen.get(f.name) is not None})


class Hypothesis(NamedTuple):
    """A finished search hypothesis: token ids (no bos/eos), its length-normalised score (module docstring) and,
    when the search was asked for them, its alignment: per token the source position its step attended to most
    (search_loop.py)."""

    tokens: list[int]
    score: float
    alignment: list[int] | None = None


class Translation(NamedTuple):
    """One output hypothesis of a source text: its text, its score and its token ids (no bos/eos) — the ids are
    what scoring scores exactly; re-tokenising the text usually, not always, gives them back — and, when asked
    for, its alignment: per token the source piece it attended to most (an index into the source's pieces)."""

    text: str
    score: float
    tokens: list[int]
    alignment: list[int] | None = None


class Scored(NamedTuple):
    """A teacher-forced target: the scored ids (the target's tokens, then eos), each one's log-probability given
    the source and the tokens before it, and the sentence score normalised as the search ranks hypotheses."""

    tokens: list[int]
    token_logprobs: list[float]
    score: float


def max_lengths(src_lengths: np.ndarray, search: Search, max_positions: int) -> np.ndarray:
    """Per-sentence output limit (tokens incl. eos) from source lengths [B]: `int(a·len + b)` in float32, as torch
    computes `(a * src_len + b).long()`, clamped to [1, max_positions - 1]; capped at the position limit before
    the integer cast, so no setting can overflow int64."""
    raw = np.float32(search.max_len_a) * src_lengths.astype(np.float32) + np.float32(search.max_len_b)
    raw = np.minimum(raw, np.float32(max_positions))
    return np.clip(raw.astype(np.int64), 1, max_positions - 1)


class RowLimits(NamedTuple):
    """Each sentence's output length bounds: eos is banned until `min_len[i]` tokens were emitted and forced when
    the output reaches `max_len[i]` tokens counting eos. Per sentence, so sentences with different length
    settings (several clients' requests batched by a server, or forced lengths) share one search."""

    min_len: np.ndarray  # [B] int64
    max_len: np.ndarray  # [B] int64, ≥ 1

    def take(self, rows: Sequence[int]) -> RowLimits:
        """The bounds of these sentences, in this order."""
        idx = np.asarray(rows, dtype=np.int64)
        return RowLimits(self.min_len[idx], self.max_len[idx])


def row_limits(src_lengths: np.ndarray, search: Search, max_positions: int) -> RowLimits:
    """The bounds a Search sets for sources of these token lengths [B]: min_len for all, `max_lengths` each."""
    max_len = max_lengths(src_lengths, search, max_positions)
    return RowLimits(np.full(len(max_len), search.min_len, dtype=np.int64), max_len)


def forced_limits(lengths: Sequence[int], max_positions: int) -> RowLimits:
    """Exactly `lengths[i]` tokens and then eos for sentence i (capped by the position limit): decoding the amount
    of work a known output took — the speed benchmark's rebuilt models, whose weights are not the trained ones."""
    n = np.clip(np.asarray(lengths, dtype=np.int64), 0, max_positions - 2)
    return RowLimits(n, n + 1)


def concat_limits(parts: Sequence[RowLimits]) -> RowLimits:
    """Several batches' bounds as one, in order."""
    return RowLimits(
        np.concatenate([p.min_len for p in parts]).astype(np.int64),
        np.concatenate([p.max_len for p in parts]).astype(np.int64),
    )


def normalised(total: float, length: int, len_penalty: float) -> float:
    """A hypothesis' score from its summed log-probs and its length counting eos (the module docstring)."""
    return total / float(length) ** len_penalty


def strip(ids: Iterable[int], eos_id: int, pad_id: int) -> list[int]:
    """A hypothesis' token ids up to its first eos or pad."""
    out = []
    for i in ids:
        if i in (eos_id, pad_id):
            break
        out.append(int(i))
    return out


def greedy_hypotheses(
    rows: Iterable[list[int]],
    totals: Iterable[float],
    len_penalty: float,
    eos_id: int,
    pad_id: int,
    prefix_lengths: Sequence[int] | None = None,
    alignments: Sequence[list[int]] | None = None,
) -> list[Hypothesis]:
    """Greedy search's rows of tokens (bos first) and their summed log-probs → a Hypothesis each, scored as
    beam search scores (over the tokens after each row's given prefix, `prefix_lengths`); `alignments`: each
    row's source position per emitted token."""
    out = []
    for i, (row, total) in enumerate(zip(rows, totals, strict=True)):
        ids = strip(row[1:], eos_id, pad_id)
        given = 0 if prefix_lengths is None else int(prefix_lengths[i])
        aligned = None if alignments is None else alignments[i][: len(ids)]
        out.append(Hypothesis(ids, normalised(total, len(ids) + 1 - given, len_penalty), aligned))
    return out


def length_batches(lengths: Sequence[int], max_tokens: int, max_sentences: int) -> list[list[int]]:
    """Indices grouped by similar length (longest first), each group ≤ max_tokens padded source tokens and
    ≤ max_sentences sentences: padding is what makes beam search slow on a CPU, and both engines batch alike."""
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


def truncate_sources(encoded: Iterable[list[int]], max_positions: int, unk_id: int) -> list[list[int]]:
    """Source ids cut to half the position limit (the output needs room too); an empty source becomes [unk]."""
    limit = max(1, max_positions // 2)
    return [ids[:limit] or [unk_id] for ids in encoded]


def truncate_targets(encoded: Iterable[list[int]], max_positions: int) -> list[list[int]]:
    """Target ids to score cut to what the search can produce: max_positions - 2 tokens, so that with eos the
    output stays below the position limit. An empty target stays empty (it scores eos alone)."""
    return [ids[: max(0, max_positions - 2)] for ids in encoded]


def check_pairs(sources: int, targets: int) -> None:
    """ScoreError unless there is one target per source."""
    if targets != sources:
        raise ScoreError(f"got {sources} sources but {targets} targets; give one target per source")


def check_targets(targets: Sequence[Sequence[int]], sources: int, vocab_size: int, max_positions: int) -> None:
    """ScoreError unless there is one target per source, each at most max_positions - 2 ids in [0, vocab_size):
    what scoring can run, checked before anything runs (a server checks it before queueing a request)."""
    check_pairs(sources, len(targets))
    cap = max_positions - 2
    for i, ids in enumerate(targets):
        if len(ids) > cap:
            raise ScoreError(f"target {i} has {len(ids)} tokens; the model produces at most {cap} (+ eos)")
        if any(not 0 <= int(t) < vocab_size for t in ids):
            raise ScoreError(f"target {i} holds token ids outside the vocabulary [0, {vocab_size})")
