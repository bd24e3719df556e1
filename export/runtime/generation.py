"""The one decoding driver: texts or token ids in, n-best `Translation`s out, for any model that opens decoding
states — the exported graphs (`ExportedModel`) and the torch models (zoo/decoding/generate.py `TorchEngine`) alike.

Why one driver: everything around the search loop (search_loop.py) — checking a call's inputs, batching by length,
sampling keys, the greedy/beam/sampling dispatch, prefixes, alignments, building the results — is the same for both
engines, so it is written once here and the engines only say how a batch is encoded and stepped (`Engine`,
`Batch`), as fairseq2 splits its generator from the step and CTranslate2 has one `translate_batch`. A call's
options travel as one `Search` value (search.py), checked where it was made.

    prepare   a call's inputs checked once (lengths, prefixes, sampling keys): a `Work`
    run       a `Work`'s sources batched by length, each batch searched (`search_batch`), in input order
    generate  token ids → hypotheses: `prepare`, then `run`
    score     teacher-forced scores of targets, checked once and batched as the search is (`score_texts`: texts)
    translate texts → `Work` → `run` → `Translation`s (what every `translate` is, in both engines and the server)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol, TypeVar

import numpy as np

from .search import (
    Hypothesis,
    RowLimits,
    Scored,
    Search,
    SearchError,
    Translation,
    check_pairs,
    check_targets,
    concat_limits,
    length_batches,
    row_limits,
    search_setting,
    truncate_sources,
    truncate_targets,
)
from .search_loop import (
    SearchVocab,
    Step,
    beam,
    beam_first_rows,
    check_prefixes,
    given_for,
    greedy,
    sample_rows,
    samples_by_sentence,
)
from .tokenizer import TextTokenizer

T = TypeVar("T")


class Batch(Protocol):
    """A padded batch of sources an engine has encoded for one search."""

    width: int  # tokens a step scores: the vocabulary, or a shortlist's candidates

    def step(self, rows: np.ndarray, steps: int, slots: int) -> Step:
        """A decoding state over the sources `rows` [N] (equal consecutive groups: a sentence's beams or samples),
        sized for `steps` steps of at most `slots` rows (0: N)."""
        ...


class Engine(Protocol):
    """What the driver needs of a model."""

    vocab: SearchVocab
    max_positions: int
    max_tokens: int  # a decoding batch's default size: padded source tokens and sentences (`length_batches`)
    max_sentences: int
    tokenizer: TextTokenizer | None  # what text calls need (`translate`); None: token ids only

    def open(self, src: np.ndarray, search: Search) -> Batch:
        """src [B, S] int64 (pad-right) encoded for `search` (its shortlist, its alignments)."""
        ...

    def map(self, run: Callable[[Engine, list[int]], T], batches: list[list[int]]) -> Iterable[T]:
        """`run(engine, batch)` for every batch of source indices, results in order (an engine may spread them over
        copies of itself, or show progress)."""
        ...

    def teacher_forced(self, src: np.ndarray, targets: list[list[int]], len_penalty: float) -> list[Scored]:
        """src [B, S] (pad-right) and one target per row → each target's `Scored` (its tokens then eos, their
        log-probs, the sentence score normalised as the search ranks hypotheses)."""
        ...


class Work(NamedTuple):
    """A call's sources, checked for one search (`prepare`): token ids, each one's length bounds, given first
    output tokens and sampling key (its index in its own call or request, so its samples do not depend on what
    it is batched with)."""

    encoded: list[list[int]]
    limits: RowLimits
    prefixes: list[list[int]] | None
    keys: list[int]


def prepare(
    engine: Engine,
    encoded: Sequence[Sequence[int]],
    search: Search,
    prefixes: Sequence[Sequence[int]] | None = None,
    limits: RowLimits | None = None,
    keys: Sequence[int] | None = None,
) -> Work:
    """Token ids per source and what each keeps for itself (`limits`: default what `search` sets; `prefixes`;
    `keys`: default its index here) checked once, before anything runs: SearchError for counts that differ from
    the sources' or a prefix the search cannot take (named by its key). The search's options were checked where
    it was made (`search_settings` of each engine: a shortlist or alignments the model lacks)."""
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    if limits is None:
        limits = row_limits(lengths, search, engine.max_positions)
    elif len(limits.max_len) != len(encoded):
        raise SearchError(f"got length bounds for {len(limits.max_len)} sentences but {len(encoded)} sources")
    if keys is not None and len(keys) != len(encoded):
        raise SearchError(f"got {len(keys)} sampling keys for {len(encoded)} sources")
    if prefixes is not None:
        check_prefixes(prefixes, limits, engine.vocab, keys)
    return Work(
        [list(e) for e in encoded],
        limits,
        None if prefixes is None else [list(p) for p in prefixes],
        list(range(len(encoded))) if keys is None else [int(k) for k in keys],
    )


def join(works: Sequence[Work]) -> Work:
    """Several checked calls as one (a server batching requests that share a search), in order."""
    given = any(w.prefixes is not None for w in works)
    return Work(
        [ids for w in works for ids in w.encoded],
        concat_limits([w.limits for w in works]),
        [p for w in works for p in (w.prefixes or [[]] * len(w.encoded))] if given else None,
        [k for w in works for k in w.keys],
    )


def run(
    engine: Engine, work: Work, search: Search, max_tokens: int | None = None, max_sentences: int | None = None
) -> list[list[Hypothesis]]:
    """Per source of `work` its `search.num_hypotheses` best hypotheses, best first, in input order: sources
    batched by length (`max_tokens`/`max_sentences`: default the engine's), each batch searched alone."""
    outputs: list[list[Hypothesis]] = [[] for _ in work.encoded]

    def searched(model: Engine, idx: list[int]) -> list[list[Hypothesis]]:
        src = padded([work.encoded[i] for i in idx], model.vocab.pad_id)
        given = None if work.prefixes is None else [work.prefixes[i] for i in idx]
        return search_batch(model, src, search, work.limits.take(idx), given, [work.keys[i] for i in idx])

    batches = length_batches(
        [len(e) for e in work.encoded], max_tokens or engine.max_tokens, max_sentences or engine.max_sentences
    )
    for idx, nbest in zip(batches, engine.map(searched, batches), strict=True):
        for i, hyps in zip(idx, nbest, strict=True):
            outputs[i] = hyps
    return outputs


def generate(
    engine: Engine,
    encoded: Sequence[Sequence[int]],
    search: Search,
    prefixes: Sequence[Sequence[int]] | None = None,
    limits: RowLimits | None = None,
    keys: Sequence[int] | None = None,
) -> list[list[Hypothesis]]:
    """Token ids per source → per source its `search.num_hypotheses` best hypotheses, best first: `prepare`
    (the checks, once) then `run` (batched with the engine's default batch sizes)."""
    return run(engine, prepare(engine, encoded, search, prefixes, limits, keys), search)


def search_batch(
    engine: Engine,
    src: np.ndarray,
    search: Search,
    limits: RowLimits | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    keys: Sequence[int] | None = None,
) -> list[list[Hypothesis]]:
    """Per sentence of src [B, S] its `search.num_hypotheses` best hypotheses, best first: greedy's one, with
    sampling that many draws, else beam search's best (fewer only when the search finished fewer: a length limit
    of 1 token leaves the empty hypothesis alone). Inputs as `prepare` checks them (`limits`: default search's)."""
    b, n = src.shape[0], search.num_hypotheses
    if limits is None:
        limits = row_limits((src != engine.vocab.pad_id).sum(1), search, engine.max_positions)
    steps = int(limits.max_len.max())
    if search.sampling:  # greedy's loop over every sentence n times, each row its own generator
        rows, row_keys = sample_rows(b, n, keys)
        given = given_for(len(rows), search, None if prefixes is None else [prefixes[i] for i in rows], row_keys)
        # each sample its own encoder row (as before the driver: the scores stay bit-identical; sharing one
        # encoder row per source would save the encoder's work n-fold and move scores in their last bits)
        step = engine.open(src[rows], search).step(np.arange(len(rows)), steps, 0)
        return samples_by_sentence(greedy(step, limits.take(rows), search, engine.vocab, given), n)
    batch = engine.open(src, search)
    given = given_for(b, search, prefixes)
    if search.beam_size <= 1:
        return [[h] for h in greedy(batch.step(np.arange(b), steps, 0), limits, search, engine.vocab, given)]
    g = beam_first_rows(search.beam_size, batch.width)  # rows per sentence of the first step
    step = batch.step(np.repeat(np.arange(b), g), steps, b * search.beam_size)
    return [hyps[:n] for hyps in beam(step, g, limits, search, engine.vocab, given)]


def best_tokens(nbest: Sequence[Sequence[Hypothesis]]) -> list[list[int]]:
    """Each sentence's best hypothesis' token ids ([] where it has none)."""
    return [hyps[0].tokens if hyps else [] for hyps in nbest]


def padded(rows: Sequence[Sequence[int]], pad_id: int) -> np.ndarray:
    """Right-padded [B, S] int64 batch."""
    src = np.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=np.int64)
    for i, ids in enumerate(rows):
        src[i, : len(ids)] = ids
    return src


def encode_texts(engine: Engine, texts: Sequence[str]) -> list[list[int]]:
    """Token ids per source text, truncated to half the position limit (the output needs room too)."""
    tokenizer = _tokenizer(engine)
    return truncate_sources(tokenizer.encode_sources(texts), engine.max_positions, tokenizer.unk_id)


def _tokenizer(engine: Engine) -> TextTokenizer:
    if engine.tokenizer is None:
        raise SearchError("texts need the model's tokenizer; give the engine one, or decode token ids")
    return engine.tokenizer


def encode_prefixes(engine: Engine, sources: int, target_prefix: str | Sequence[str]) -> list[list[int]]:
    """Per source the token ids of its target prefix text (one per source; a str for a single source),
    tokenised as targets are."""
    given = [target_prefix] if isinstance(target_prefix, str) else list(target_prefix)
    if len(given) != sources:
        raise SearchError(f"got {len(given)} target prefixes for {sources} sources; give one per source")
    return _tokenizer(engine).encode_targets(given)


def translate(
    engine: Engine,
    texts: Sequence[str],
    search: Search,
    target_prefix: str | Sequence[str] | None = None,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
) -> list[list[Translation]]:
    """Source texts → per source its `search.num_hypotheses` best `Translation`s, best first, in input order
    (`target_prefix`: per source a target text its output starts with, "" = none; the output includes it)."""
    prefixes = None if target_prefix is None else encode_prefixes(engine, len(texts), target_prefix)
    work = prepare(engine, encode_texts(engine, texts), search, prefixes)
    return translations(engine, run(engine, work, search, max_tokens, max_sentences))


def translations(engine: Engine, nbest: Sequence[Sequence[Hypothesis]]) -> list[list[Translation]]:
    """Hypotheses → `Translation`s: each with its text (detokenised), score, token ids and alignment."""
    decode = _tokenizer(engine).decode
    return [[Translation(decode(h.tokens), h.score, h.tokens, h.alignment) for h in hyps] for hyps in nbest]


def shaped(nbest: list[list[Translation]], lists: bool) -> list[str] | list[list[Translation]]:
    """What a `translate` call returns: per source its Translation list when the call asked for hypotheses,
    scores or alignments (`lists`), else its best text ("" where there is none)."""
    return nbest if lists else [hyps[0].text if hyps else "" for hyps in nbest]


def asks_for_lists(search: Search, overrides: dict[str, object]) -> bool:
    """Whether a `translate(…, **overrides)` call returns Translation lists: it named num_hypotheses, or asked for
    more than one hypothesis, for scores or for alignments."""
    return (
        "num_hypotheses" in overrides or search.num_hypotheses > 1 or search.return_scores or search.return_alignments
    )


def score(
    engine: Engine,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    len_penalty: float,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
) -> list[Scored]:
    """Token ids per source and per target → per pair the target's `Scored` in input order, batched by source
    length as `run` batches. ScoreError (one target per source, each at most max_positions - 2 ids in the
    vocabulary) or SearchError (len_penalty) before anything runs."""
    check_targets(targets, len(sources), engine.vocab.size, engine.max_positions)
    penalty = float(search_setting("len_penalty", len_penalty))
    out: list[Scored] = [Scored([], [], 0.0)] * len(sources)

    def forced(model: Engine, idx: list[int]) -> list[Scored]:
        src = padded([sources[i] for i in idx], model.vocab.pad_id)
        return model.teacher_forced(src, [list(targets[i]) for i in idx], penalty)

    batches = length_batches(
        [len(s) for s in sources], max_tokens or engine.max_tokens, max_sentences or engine.max_sentences
    )
    for idx, scored in zip(batches, engine.map(forced, batches), strict=True):
        for i, one in zip(idx, scored, strict=True):
            out[i] = one
    return out


def encode_targets(engine: Engine, texts: Sequence[str]) -> list[list[int]]:
    """Token ids per target text to score, truncated to what the search can produce (max_positions - 2)."""
    return truncate_targets(_tokenizer(engine).encode_targets(texts), engine.max_positions)


def score_texts(
    engine: Engine,
    sources: str | Sequence[str],
    targets: str | Sequence[str],
    len_penalty: float,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
) -> list[Scored]:
    """Forced decoding of text pairs (reranking, filtering, quality estimation): per (source, target) the target's
    `Scored`. Sources are truncated as `translate` truncates them, targets to max_positions - 2 tokens; an empty
    target scores eos alone. Scoring a hypothesis `translate` returned gives back its score to 1e-4 unless the
    search forced eos at its length limit (it counts that eos as 0) or its text re-tokenises to other ids (`score`
    its `tokens` for the exact score). ScoreError unless there is one target per source."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    targets = [targets] if isinstance(targets, str) else list(targets)
    check_pairs(len(sources), len(targets))
    encoded = encode_texts(engine, sources), encode_targets(engine, targets)
    return score(engine, *encoded, len_penalty, max_tokens, max_sentences)
