"""Search settings, results and errors of both engines, and the runtime's greedy and beam search over a step function.

One search for both engines: zoo.generate runs these loops over a torch `Step` (its `TorchStep`), the runtime over
the exported graph's, so a setting, a result, an error and every rule of the search are the same in both by
construction, `Search` is checked once, where it is made, and engine parity is the parity of two steppers. The
rules: pad and bos are banned (bos not where it is eos: fairseq's models start from eos), eos is
banned before `min_len` and forced at each sentence's length limit (`max_lengths`); beam search keeps fairseq's
2·K candidates, counts only eos among the top K as finished, stops a sentence after K finished hypotheses and drops
it from the batch; greedy runs until every row has ended.

Scores, one definition everywhere: a hypothesis' summed token log-probs, eos included, / length ** len_penalty
(length counting eos) — what beam search ranks by and what teacher-forced scoring gives back, except where the
search forced eos at the length limit (log-prob 0 there, the model's real log-prob when scored).

The step function returns each row's k best (log-prob, token) — the decoder graph's in-graph TopK — instead of
[rows, vocab]: the bans remove at most BANNED of a row's best tokens, so with k = 2·beam + BANNED each row's, and
each sentence's, 2·beam best allowed candidates (what `torch.topk` over [beams·vocab] finds) are among them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

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
}
_INTEGER_SETTINGS = frozenset({"beam_size", "max_len_b", "min_len", "shortlist"})
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
BANNED = 3  # tokens the search may ban from a row (pad, bos, eos): fetch this many extra best tokens


class SearchError(ExportRuntimeError, ValueError):
    """A search setting (or num_hypotheses) that is not a finite number within its limits; the message names the
    allowed range."""


class ScoreError(ExportRuntimeError, ValueError):
    """Targets that cannot be scored (not one per source, too long for the model, ids outside the vocabulary);
    the message says which and what is allowed."""


def _bounded(name: str, value: Any, low: float, high: float, integer: bool, allowed: str) -> int | float:
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
        if not low <= value <= high:
            raise SearchError(f"{name}={_shown(value)} is out of range; {allowed}")
        return int(value) if integer else float(value)
    number = float(value)
    if not np.isfinite(number) or not low <= number <= high:
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


@dataclass(frozen=True)
class Search:
    """Search settings, each checked against SEARCH_LIMITS and converted when the object is made (SearchError
    names the setting and its range): a Search in hand is valid, so nothing downstream checks it again."""

    beam_size: int = 5
    len_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1
    shortlist: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, search_setting(f.name, getattr(self, f.name)))

    @classmethod
    def from_generation(cls, gen: Mapping[str, Any]) -> Search:
        """The one conversion of a `generation` node — a config's (train, evaluate, export) or a manifest's —
        into settings; keys it lacks or leaves None (a config's null) keep their defaults, the values written
        here only, and its batching keys are not search settings."""
        return cls(**{f.name: gen[f.name] for f in fields(cls) if gen.get(f.name) is not None})


class Hypothesis(NamedTuple):
    """A finished search hypothesis: token ids (no bos/eos) and its length-normalised score (module docstring)."""

    tokens: list[int]
    score: float


class Translation(NamedTuple):
    """One output hypothesis of a source text: its text, its score and its token ids (no bos/eos) — the ids are
    what scoring scores exactly; re-tokenising the text usually, not always, gives them back."""

    text: str
    score: float
    tokens: list[int]


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
    rows: Iterable[list[int]], totals: Iterable[float], len_penalty: float, eos_id: int, pad_id: int
) -> list[Hypothesis]:
    """Greedy search's rows of tokens (bos first) and their summed log-probs → a Hypothesis each, scored as
    beam search scores."""
    out = []
    for row, total in zip(rows, totals, strict=True):
        ids = strip(row[1:], eos_id, pad_id)
        out.append(Hypothesis(ids, normalised(total, len(ids) + 1, len_penalty)))
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


# ---------------------------------------------------------------------------------------------- the searches
class SearchVocab(NamedTuple):
    """What the search needs of a vocabulary."""

    size: int
    pad_id: int
    bos_id: int
    eos_id: int


class Step(Protocol):
    """A decoding state over the live rows (the runtime's `Stepper`)."""

    def __call__(self, last: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """last [N] tokens at position t → every row's k best (log-prob [N, k] f32, token [N, k]), descending."""
        ...

    def select(self, rows: np.ndarray) -> None:
        """Continue from these rows of the last step (beam reordering, finished sentences leaving)."""
        ...


def never_emitted(pad_id: int, bos_id: int, eos_id: int) -> list[int]:
    """The tokens no search emits: pad, and the decoder's start token unless it is eos (fairseq's models start from
    eos, which still ends a hypothesis)."""
    return [pad_id] if bos_id in (pad_id, eos_id) else [pad_id, bos_id]


def _mask(lp: np.ndarray, tok: np.ndarray, no_eos: np.ndarray, at_limit: np.ndarray, vocab: SearchVocab) -> None:
    """The bans on a row's best-token list: pad and bos always (never_emitted), eos on rows still short of their
    min_len (`no_eos` [N]); a row at its length limit gets only eos (log-prob 0). In place on lp/tok [N, k]."""
    banned = (tok == vocab.eos_id) & no_eos[:, None]  # [N, k]
    for token in never_emitted(vocab.pad_id, vocab.bos_id, vocab.eos_id):
        banned |= tok == token
    lp[banned] = -np.inf
    if at_limit.any():
        lp[at_limit] = -np.inf
        lp[at_limit, 0] = 0.0
        tok[at_limit, 0] = vocab.eos_id


def _best_tokens(
    step: Step,
    last: np.ndarray,
    t: int,
    k: int,
    no_eos: np.ndarray,
    at_limit: np.ndarray,
    vocab: SearchVocab,
    ended: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The k best (log-prob [N, k], token [N, k]) of every row at position t after the bans; `no_eos` [N]: rows
    that may not end yet, `ended` [N]: rows that have finished already (greedy keeps them as padding). A step
    where every row must end (at its limit or finished) does not run the decoder: eos at log-prob 0 is all it
    could give. Measured: results/runtime/docstring_figures.md."""
    must_end = at_limit if ended is None else at_limit | ended
    if must_end.all():
        shape = (len(must_end), min(k, vocab.size))  # what the decoder's top-k would have returned
        lp, tok = np.zeros(shape, dtype=np.float32), np.full(shape, vocab.eos_id, dtype=np.int64)
        _mask(lp, tok, no_eos, must_end, vocab)
        return lp, tok
    lp, tok = step(last, t, k)
    _mask(lp, tok, no_eos, at_limit, vocab)
    return lp, tok


def greedy(step: Step, limits: RowLimits, search: Search, vocab: SearchVocab) -> list[Hypothesis]:
    """Argmax decoding of B sentences within their length bounds `limits`: one hypothesis per sentence, scored as
    beam search scores."""
    min_len, max_len = limits
    b = len(max_len)
    tokens = np.full((b, 1), vocab.bos_id, dtype=np.int64)  # [B, t+1]
    finished = np.zeros(b, dtype=bool)
    total = np.zeros(b, dtype=np.float32)  # [B] summed log-probs of the emitted tokens, eos included
    rows = np.arange(b)
    for t in range(int(max_len.max())):
        lp, tok = _best_tokens(step, tokens[:, -1], t, BANNED + 1, min_len > t, max_len <= t + 1, vocab, finished)
        best = lp.argmax(-1)  # [B] first maximum = lowest id among ties, as argmax
        total += np.where(finished, np.float32(0), lp[rows, best])
        nxt = tok[rows, best]
        nxt[finished] = vocab.pad_id
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        finished |= nxt == vocab.eos_id
        if finished.all():
            break
    return greedy_hypotheses(tokens.tolist(), total.tolist(), search.len_penalty, vocab.eos_id, vocab.pad_id)


def beam_first_rows(beam_size: int, vocab_size: int) -> int:
    """Rows per sentence of beam search's first step. All beams start as the same bos hypothesis, whose 2K
    candidates come from beam 0 alone (the others score -inf), so one row per sentence gives them for 1/K of the
    step — if a row's list holds 2K allowed tokens: a smaller vocabulary (test models) starts with K rows.
    Measured: results/runtime/docstring_figures.md."""
    return 1 if min(2 * beam_size + BANNED, vocab_size) - BANNED >= 2 * beam_size else beam_size


def beam(step: Step, first_rows: int, limits: RowLimits, search: Search, vocab: SearchVocab) -> list[list[Hypothesis]]:
    """Beam search of B sentences within their length bounds `limits`, `step` starting on `first_rows`
    consecutive rows per sentence (`beam_first_rows`): every finished hypothesis per sentence (beam_size of them;
    fewer only when the length limit is 1 token), best first — the first finished wins ties."""
    k, g = search.beam_size, first_rows  # g: rows per sentence this step
    min_len, max_len = limits
    b = len(max_len)
    active = np.arange(b)  # original sentence ids still searching
    tokens = np.full((b * g, 1), vocab.bos_id, dtype=np.int64)  # [n*g, t+1]
    scores = np.full((b, g), -np.inf, dtype=np.float32)  # [n, g]
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step yields distinct ones
    finals: list[list[Hypothesis]] = [[] for _ in range(b)]
    arange2k = np.arange(2 * k)
    for t in range(int(max_len.max())):
        n = active.size
        at_limit = np.repeat(max_len[active] <= t + 1, g)  # [n*g]
        no_eos = np.repeat(min_len[active] > t, g)  # [n*g]
        lp, tok = _best_tokens(step, tokens[:, -1], t, 2 * k + BANNED, no_eos, at_limit, vocab)  # [n*g, c]
        c = lp.shape[1]
        # torch.topk(2K) over [n, K*V] finds the same finite candidates among each row's c best
        cand = (scores.reshape(-1, 1) + lp).reshape(n, g * c)
        flat_tok = tok.reshape(n, g * c)
        flat_id = (np.arange(g * c) // c)[None, :] * vocab.size + flat_tok  # beam*V + token: tie order
        top = np.lexsort((flat_id, -cand), axis=1)[:, : 2 * k]  # [n, 2K] sorted by score desc
        top_scores = np.take_along_axis(cand, top, 1)
        beam_idx, token_idx = top // c, np.take_along_axis(flat_tok, top, 1)
        is_eos = (token_idx == vocab.eos_id) & (top_scores > -np.inf)
        done = np.zeros(n, dtype=bool)
        if is_eos.any():
            norm = float(t + 1) ** search.len_penalty
            prefix = tokens.reshape(n, g, -1)
            for r, j in zip(*np.nonzero(is_eos), strict=True):
                bucket = finals[int(active[r])]
                if len(bucket) < k and j < k:  # only eos among the top K counts, as fairseq
                    hyp = strip(prefix[r, beam_idx[r, j], 1:].tolist(), vocab.eos_id, vocab.pad_id)
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
