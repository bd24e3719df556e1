"""Quality metrics for evaluation and reports: sacreBLEU BLEU/chrF, tokenized BLEU, ROUGE, and the paired
bootstrap test (sacreBLEU's for BLEU, the same rule on per-document ROUGE).

Why wrappers at all: every caller (evaluate, reports, GHT-PS comparisons) must use the *same*
metric settings, or numbers from different commands cannot be put in one table. Each function
takes one hypothesis and one reference per segment (plain strings, detokenized unless said
otherwise) and returns scores on the 0–100 scale. Nothing here downloads anything.
"""

from __future__ import annotations

import functools
import statistics
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import _compute_p_value, estimate_ci

TASKS = ("translation", "summarization")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


# (tokenize, hypotheses, references) → (per-segment BLEU statistics, nrefs), most recently used last
_BLEU_STATS: OrderedDict[tuple, tuple[np.ndarray, int]] = OrderedDict()
_BLEU_STATS_KEPT = 64
# (tokenize, references) → sacreBLEU's reference n-gram cache and nrefs: a report's records share one test split
_BLEU_REFS: OrderedDict[tuple, tuple[list[Any], int]] = OrderedDict()
_BLEU_REFS_KEPT = 8


class _SegmentStatsBLEU(BLEU):
    """sacreBLEU's BLEU, whose per-segment statistics of one (hypotheses, references) pair are extracted once per
    process. Rendering a report runs a paired bootstrap per entry, seed and claim: the same records' hypotheses and
    the same references come back again and again, and extracting their n-gram statistics each time was most of a
    render's time (results/heads: 166 extractions of 44 distinct hypothesis lists). The statistics are a pure
    function of the segments and the tokenizer, so every number stays sacreBLEU's own, bit for bit."""

    def __init__(self, tokenize: str = "13a") -> None:
        super().__init__(tokenize=tokenize, force=tokenize == "none")
        self._tokenize_name = tokenize

    def _extract_corpus_statistics(self, hypotheses: Sequence[str], references: Any) -> Any:
        if not references:  # sacreBLEU's own reference cache: nothing to key on
            return super()._extract_corpus_statistics(hypotheses, references)
        key = (self._tokenize_name, tuple(hypotheses), tuple(tuple(stream) for stream in references))
        if key in _BLEU_STATS:
            _BLEU_STATS.move_to_end(key)
            stats, self.num_refs = _BLEU_STATS[key]  # extracting also sets nrefs, which the signature reports
        else:
            stats = np.asarray(super()._extract_corpus_statistics(hypotheses, references), dtype=np.int64)
            _BLEU_STATS[key] = (stats, self.num_refs)
            if len(_BLEU_STATS) > _BLEU_STATS_KEPT:
                _BLEU_STATS.popitem(last=False)
        return stats.tolist()  # sacreBLEU's form: a fresh list of int rows per call

    def _cache_references(self, references: Sequence[Sequence[str]]) -> list[Any]:
        """sacreBLEU's reference n-grams, extracted once per process for one tokenizer and reference set (every
        record of a report is scored against the same test split). sacreBLEU only reads them."""
        key = (self._tokenize_name, tuple(tuple(stream) for stream in references))
        if key in _BLEU_REFS:
            _BLEU_REFS.move_to_end(key)
            cache, self.num_refs = _BLEU_REFS[key]
            return cache
        cache = super()._cache_references(references)
        _BLEU_REFS[key] = (cache, self.num_refs)
        if len(_BLEU_REFS) > _BLEU_REFS_KEPT:
            _BLEU_REFS.popitem(last=False)
        return cache


def output_stats(hypotheses: Sequence[str]) -> dict[str, Any]:
    """Whether a model's outputs depend on its inputs (a summarizer that emits one string still scores): how
    many documents, how many distinct outputs, the share of the most frequent one, and the mean length in words."""
    counts = Counter(hypotheses)
    n = len(hypotheses)
    return {
        "documents": n,
        "distinct": len(counts),
        "top_share": round(counts.most_common(1)[0][1] / n, 4) if n else 0.0,
        "mean_words": round(statistics.fmean(len(h.split()) for h in hypotheses), 2) if n else 0.0,
    }


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise ValueError("cannot score an empty corpus")


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Detokenized, case-sensitive sacreBLEU (13a tokenizer, exp smoothing): the comparable
    number for raw-text output (signature nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp)."""
    _check(hyps, refs)
    return BLEU().corpus_score(list(hyps), [list(refs)]).score


def corpus_chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """sacreBLEU chrF2 (char order 6, no word n-grams): less tokenization-sensitive than BLEU,
    which matters for the morphologically rich (German) side."""
    _check(hyps, refs)
    return CHRF().corpus_score(list(hyps), [list(refs)]).score


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """BLEU on text that is already tokenized: split on whitespace only (sacreBLEU tokenize="none").

    This is the number fairseq-generate prints for fairseq-prepared IWSLT'14 de-en (Moses-tokenized,
    lowercased, BPE removed), i.e. the one the GHT/MGK papers quote; it is not comparable with
    `corpus_bleu`. fairseq's scorer applies no smoothing, so neither do we: the two agree exactly
    (they differ only on a corpus with no matching n-gram of some order, where both give 0).
    """
    _check(hyps, refs)
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(list(hyps), [list(refs)]).score


@functools.cache
def _rouge_scorer() -> Any:
    """One scorer per process (building one logs a line and loads nltk's stemmer)."""
    from rouge_score import rouge_scorer  # imported lazily: pulls in nltk, slow and unused for MT

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def document_rouge(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """Per-document ROUGE-1/2/L F1 (0–1; columns in `ROUGE_TYPES` order), shape [N, 3]: the rows `rouge`
    averages, and what a bootstrap over documents resamples. rouge-score with Porter stemming; its tokenizer
    lowercases and keeps only [a-z0-9] runs, so it is meant for English output (non-ASCII letters are dropped)."""
    _check(hyps, refs)
    scorer = _rouge_scorer()
    rows = []
    for hyp, ref in zip(hyps, refs, strict=True):
        scores = scorer.score(ref, hyp)  # rouge-score's argument order is (target, prediction)
        rows.append([scores[name].fmeasure for name in ROUGE_TYPES])
    return np.asarray(rows, dtype=np.float64)


def reordered_rouge_l(hyps: Sequence[str], refs: Sequence[str], orders: np.ndarray) -> np.ndarray:
    """Per-document ROUGE-L F1 (0–1) [K, N] of `hyps` against `refs` taken in each row's order of `orders` [K, N]
    (row k pairs hyps[i] with refs[orders[k, i]]): `document_rouge`'s ROUGE-L column for every reordering, with each
    text tokenized and stemmed once (rouge-score's own tokenizer, memoised) — the cost of K pairings is about one."""
    from rouge_score import rouge_scorer, tokenizers

    _check(hyps, refs)
    stemming = tokenizers.DefaultTokenizer(use_stemmer=True)
    memo: dict[str, list[str]] = {}

    class _Memoised(tokenizers.Tokenizer):
        def tokenize(self, text: str) -> list[str]:
            if text not in memo:
                memo[text] = stemming.tokenize(text)
            return memo[text]

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Memoised())
    return np.asarray(
        [
            [scorer.score(refs[j], hyp)["rougeL"].fmeasure for hyp, j in zip(hyps, order, strict=True)]
            for order in orders
        ],
        dtype=np.float64,
    )


def rouge(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, float]:
    """ROUGE-1/2/L F1 × 100, averaged over documents as the summarization papers report (`document_rouge`)."""
    scores = document_rouge(hyps, refs)
    return {name: 100.0 * sum(scores[:, i].tolist()) / len(hyps) for i, name in enumerate(ROUGE_TYPES)}


def document_stats(hyps: Sequence[str], refs: Sequence[str], metric: str = "rougeL") -> np.ndarray:
    """Per-document statistics [N, 2] of a ROUGE metric — F1 × 100, and 1 — whose sums over any resample give
    that resample's score through `mean_from_stats`: the summarization counterpart of `sentence_stats`."""
    if metric not in ROUGE_TYPES:
        raise ValueError(f"unknown ROUGE metric {metric!r}; expected one of {', '.join(ROUGE_TYPES)}")
    f1 = 100.0 * document_rouge(hyps, refs)[:, ROUGE_TYPES.index(metric)]
    return np.stack([f1, np.ones_like(f1)], axis=-1)


def mean_from_stats(stats: np.ndarray) -> np.ndarray:
    """The mean of per-document scores from summed `document_stats` [..., 2], vectorised over leading axes."""
    return stats[..., 0] / stats[..., 1]


def paired_bootstrap_means(
    baseline: np.ndarray, system: np.ndarray, n_samples: int = 1000, seed: int = 12345
) -> dict[str, Any]:
    """Paired bootstrap resampling (Koehn 2004) of a mean of per-document scores [N] (ROUGE), system against
    baseline, by sacreBLEU's rule for its `--paired-bs` test: resample documents, take the absolute difference of
    the two means per resample, centre those differences, and p = (#centred > observed + 1) / (n + 1); equal
    observed means give p = 1, as `paired_bootstrap` does. Returns {"baseline", "system" (the observed means),
    "p_value", "significant" (p < 0.05), "n_samples", "seed"}."""
    if baseline.shape != system.shape or baseline.ndim != 1 or not len(baseline):
        raise ValueError(f"need two equal-length score vectors, got shapes {baseline.shape} and {system.shape}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    rng = np.random.default_rng(seed)
    idxs = rng.choice(len(baseline), size=(n_samples, len(baseline)), replace=True)  # [B, N]
    base_mean, sys_mean = float(baseline.mean()), float(system.mean())
    sample_diffs = np.abs(system[idxs].mean(axis=1) - baseline[idxs].mean(axis=1))  # [B]
    centred = sample_diffs - sample_diffs.mean()
    p_value = (int(np.sum(centred > abs(sys_mean - base_mean))) + 1) / (n_samples + 1)
    if sys_mean == base_mean:
        p_value = 1.0
    return {
        "baseline": base_mean,
        "system": sys_mean,
        "p_value": p_value,
        "significant": p_value < 0.05,
        "n_samples": n_samples,
        "seed": seed,
    }


def paired_bootstrap(
    sys_a: Sequence[str],
    sys_b: Sequence[str],
    refs: Sequence[str],
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str = "13a",
) -> dict[str, Any]:
    """Paired bootstrap resampling (Koehn 2004) of BLEU, system B against baseline A: sacreBLEU's test
    (`PairedTest(test_type="bs")`, the `--paired-bs` CLI path) number for number, so p-values match what readers
    get from sacrebleu itself. zoo/DESIGN.md §3c: quality differences are claimed only with this test (and ≥ 2
    seeds). It runs sacreBLEU's own steps — its statistics, resample indices (`default_rng(seed)`), per-resample
    scoring, `estimate_ci` and p-value — but draws and scores the baseline's resamples once where PairedTest does
    it twice, and sums resamples by one matrix product (`_resampled_scores`): a report renders dozens of these
    tests. tests/test_metrics.py checks it against PairedTest itself.

    Returns {"baseline": {"bleu", "mean", "ci"}, "system": {"bleu", "mean", "ci"}, "p_value",
    "significant" (p < 0.05), "n_samples", "seed", "signature"}; "ci" is the half-width of the 95%
    interval around the bootstrap mean. One correction to sacreBLEU: when both systems have
    identical per-segment statistics every resampled difference is 0 and sacreBLEU returns the
    minimum p = 1/(n+1) ("significant"); we return p = 1.0 there, which is the right answer, and
    likewise whenever the two corpus BLEU scores are exactly equal.
    `tokenize="none"` runs the test on tokenized BLEU instead (see `tokenized_bleu`).
    """
    _check(sys_a, refs)
    _check(sys_b, refs)
    if seed == 0:
        raise ValueError("seed 0 means 'unseeded' inside sacreBLEU; pick another seed")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    metric = _SegmentStatsBLEU(tokenize)
    ref_streams = [list(refs)]
    base_stats = metric._extract_corpus_statistics(list(sys_a), ref_streams)
    sys_stats = metric._extract_corpus_statistics(list(sys_b), ref_streams)
    base_score = float(metric._aggregate_and_compute(base_stats).score)
    sys_score = float(metric._aggregate_and_compute(sys_stats).score)
    # sacreBLEU draws the same resamples twice, for the baseline's interval and for the paired test (both
    # default_rng(seed).choice(N, (n, N))): the baseline's resampled scores are one list here
    idxs = np.random.default_rng(seed).choice(len(sys_a), size=(n_samples, len(sys_a)), replace=True)
    base_scores = _resampled_scores(metric, base_stats, idxs)
    sys_scores = _resampled_scores(metric, sys_stats, idxs)
    base_mean, base_ci = estimate_ci(base_scores)
    sys_mean, sys_ci = estimate_ci(sys_scores)
    sample_diffs = np.abs(sys_scores - base_scores)
    p_value = float(_compute_p_value(sample_diffs - sample_diffs.mean(), abs(base_score - sys_score)))
    if sys_score == base_score:
        # no observed difference: identical per-segment statistics (identical outputs) give equal corpus
        # scores, and so do different outputs that score the same (e.g. both at BLEU 0). Every resample then
        # ties and sacreBLEU reports its minimum p, but no difference is never significant.
        p_value = 1.0
    signature = metric.get_signature()  # as PairedTest writes it: the seed and the number of resamples
    signature.update("seed", str(seed).lower())
    signature.update("bs", n_samples)
    return {
        "baseline": {"bleu": base_score, "mean": float(base_mean), "ci": float(base_ci)},
        "system": {"bleu": sys_score, "mean": float(sys_mean), "ci": float(sys_ci)},
        "p_value": p_value,
        "significant": p_value < 0.05,
        "n_samples": n_samples,
        "seed": seed,
        "signature": str(signature),
    }


def _resampled_scores(metric: BLEU, stats: list[list[int]], idxs: np.ndarray) -> np.ndarray:
    """BLEU of every resample `idxs` [n, N] of per-segment `stats` [N, 10], as sacreBLEU's paired bootstrap
    computes it: each resample's float32 sum of its rows, scored by the metric's own `_compute_score_from_stats`.
    The sums are counts of n-grams and tokens, so while a resample's total stays below 2^24 float32 holds them
    exactly in any summation order: then one product of resample counts [n, N] with the rows gives the very sums
    sacreBLEU's row-by-row `sum(0)` gives, without materialising [n, N, 10]."""
    rows = np.asarray(stats, dtype=np.int64)
    n, size = idxs.shape
    if size * int(rows.max(initial=0)) < 2**24:
        counts = np.bincount((np.arange(n)[:, None] * size + idxs).ravel(), minlength=n * size).reshape(n, size)
        sums = (counts.astype(np.float64) @ rows.astype(np.float64)).astype(np.float32)
    else:  # a corpus too large for exact float32 counts: sacreBLEU's own summation, row by row
        rows32 = rows.astype(np.float32)
        sums = np.stack([rows32[i].sum(0) for i in idxs])
    return np.array([metric._compute_score_from_stats(s).score for s in sums])


def sentence_stats(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a") -> np.ndarray:
    """Per-segment BLEU sufficient statistics, shape [N, 10]: hypothesis and reference length, then matching
    and total n-grams for n = 1..4 (sacreBLEU's own, the rows its paired bootstrap sums). Summed over any
    resample of the segments they give that resample's corpus BLEU through `bleu_from_stats`, without
    tokenizing again — what makes a bootstrap over seeds *and* sentences cheap."""
    _check(hyps, refs)
    metric = _SegmentStatsBLEU(tokenize)
    return np.asarray(metric._extract_corpus_statistics(list(hyps), [list(refs)]), dtype=np.float64)


def bleu_from_stats(stats: np.ndarray) -> np.ndarray:
    """Corpus BLEU (exp smoothing, as `corpus_bleu`) of summed statistics [..., 10], vectorised over the leading
    axes: sacreBLEU's `compute_bleu` rule for rule — brevity penalty; an order with no match gets
    100 / (2^k · total), k counting the orders without a match so far; 0 when nothing matches or an order has no
    n-grams at all."""
    sys_len, ref_len = stats[..., 0], stats[..., 1]
    correct, total = stats[..., 2:6], stats[..., 6:10]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len >= ref_len, 1.0, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0))
        halvings = np.cumsum(correct == 0, axis=-1)
        precision = np.where(correct == 0, 100.0 / (2.0**halvings * total), 100.0 * correct / total)
        score = bp * np.exp(np.log(precision).mean(axis=-1))
    defined = (correct.sum(axis=-1) > 0) & (total > 0).all(axis=-1)
    return np.where(defined, score, 0.0)


def _task_scores(task: str, hyps: Sequence[str], refs: Sequence[str]) -> dict[str, float]:
    if task == "translation":
        return {"bleu": corpus_bleu(hyps, refs), "chrf": corpus_chrf(hyps, refs)}
    if task == "summarization":
        return rouge(hyps, refs)
    raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")


def quality_report(
    task: str, hyps: Sequence[str], refs: Sequence[str], origins: Sequence[str] | None = None
) -> dict[str, Any]:
    """The task's headline scores over the whole test set, plus the same scores per source corpus.

    translation → {"bleu", "chrf", "n"}; summarization → {"rouge1", "rouge2", "rougeL", "n"}.
    With `origins` (one corpus label per segment) adds "per_source": {origin: {…scores, "n"}},
    sorted by origin, because test sets are pooled from several Debian-derived corpora and a
    pooled score can hide a regression on one of them.
    """
    _check(hyps, refs)
    report: dict[str, Any] = {**_task_scores(task, hyps, refs), "n": len(hyps)}
    if origins is not None:
        if len(origins) != len(hyps):
            raise ValueError(f"{len(origins)} origins for {len(hyps)} hypotheses")
        groups: dict[str, list[int]] = {}
        for i, origin in enumerate(origins):
            groups.setdefault(origin, []).append(i)
        report["per_source"] = {
            origin: {
                **_task_scores(task, [hyps[i] for i in idx], [refs[i] for i in idx]),
                "n": len(idx),
            }
            for origin, idx in sorted(groups.items())
        }
    return report
