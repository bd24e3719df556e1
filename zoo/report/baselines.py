"""Summarization baselines that cost nothing (issue 64): a *constant* summary and *lead-k*, each chosen on the
validation split and stored as test outputs in `results/<suite>/baselines.json.gz`; the render scores them against
the suite's references like any record (zoo/report/render_outputs.py), so their numbers are never typed in.

- constant: the training summary with the best mean ROUGE-L on the validation split, output for every test document.
  Every distinct training summary is scored by its mean unigram F1 against the validation summaries (word sets, a
  matrix product); the CONSTANT_CANDIDATES best are rescored by exact ROUGE-L (all of them exactly would be ~10⁸
  ROUGE computations).
- lead-k: the document's first k words, k in 1 … LEAD_MAX_WORDS chosen by mean validation ROUGE-L.
- oracle (an upper bound, not a baseline to beat): each test document's own sentence with the best ROUGE-L against
  its own reference — what the best one-sentence extract would score, which needs the reference to choose.

A model that does not beat both on every seed has not shown that it summarizes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from zoo.metrics import ROUGE_TYPES, document_rouge, output_stats, rouge
from zoo.report.pairing import input_dependence
from zoo.report.records import (
    BASELINES_FILE,
    RecordError,
    References,
    load_records,
    read_json_gz,
    references_sha256,
    write_json_gz,
)
from zoo.report.suite import Suite

CONSTANT_CANDIDATES = 200
LEAD_MAX_WORDS = 40
_ROUGE_L = ROUGE_TYPES.index("rougeL")


def lead(document: str, k: int) -> str:
    """The first `k` whitespace-separated words of `document`."""
    return " ".join(document.split()[:k])


def sentences(document: str) -> list[str]:
    """The document's sentences: split after . ! or ? before whitespace (the whole text if it has no such end)."""
    return [part for part in re.split(r"(?<=[.!?])\s+", document.strip()) if part] or [document]


def oracle(documents: Sequence[str], refs: Sequence[str]) -> list[str]:
    """Per document, its sentence with the best ROUGE-L F1 against the document's own reference (the first of the
    best): the best one-sentence extract, chosen with the answer in hand."""
    pieces = [sentences(d) for d in documents]
    flat_hyps = [p for ps in pieces for p in ps]
    flat_refs = [r for ps, r in zip(pieces, refs, strict=True) for _ in ps]
    scores = document_rouge(flat_hyps, flat_refs)[:, _ROUGE_L] if flat_hyps else np.zeros(0)
    best, start = [], 0
    for ps in pieces:
        best.append(ps[int(np.argmax(scores[start : start + len(ps)]))])
        start += len(ps)
    return best


def _mean_rouge_l(hyps: Sequence[str], refs: Sequence[str]) -> float:
    return float(100.0 * np.mean(document_rouge(hyps, refs)[:, _ROUGE_L]))


def _words(text: str) -> set[str]:
    """rouge-score's tokens (lowercase [a-z0-9] runs), unstemmed: enough to shortlist candidates."""
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def shortlist(summaries: Sequence[str], valid_refs: Sequence[str], n: int = CONSTANT_CANDIDATES) -> list[str]:
    """The `n` distinct training summaries with the best mean unigram F1 against the validation summaries (word
    sets, one matrix product per chunk): every distinct summary scored exactly would be ~10⁸ ROUGE computations."""
    refs = [_words(r) for r in valid_refs]
    vocab = {w: i for i, w in enumerate(sorted(set().union(*refs)))}
    ref_matrix = np.zeros((len(vocab), len(refs)), dtype=np.float32)  # [V, R]
    for j, words in enumerate(refs):
        ref_matrix[[vocab[w] for w in words], j] = 1.0
    ref_sizes = np.array([len(w) for w in refs], dtype=np.float32)  # [R]
    distinct = list(dict.fromkeys(summaries))
    means = []
    for start in range(0, len(distinct), 4096):
        chunk = [_words(t) for t in distinct[start : start + 4096]]
        rows = np.zeros((len(chunk), len(vocab)), dtype=np.float32)  # [C, V]
        for i, words in enumerate(chunk):
            rows[i, [vocab[w] for w in words if w in vocab]] = 1.0
        sizes = np.array([len(w) for w in chunk], dtype=np.float32)[:, None]  # [C, 1]
        overlap = rows @ ref_matrix  # [C, R]
        means.append((2 * overlap / np.maximum(sizes + ref_sizes[None, :], 1)).mean(axis=1))
    order = np.argsort(-np.concatenate(means), kind="stable")[:n]
    return [distinct[i] for i in order]


def choose_constant(train_summaries: Sequence[str], valid_refs: Sequence[str]) -> dict[str, Any]:
    """Of the shortlisted training summaries, the one with the best mean ROUGE-L as the output for every
    validation document."""
    candidates = shortlist(train_summaries, valid_refs)
    scores = {text: _mean_rouge_l([text] * len(valid_refs), valid_refs) for text in candidates}
    best = max(candidates, key=lambda t: (scores[t], -candidates.index(t)))
    return {"text": best, "valid_rougeL": round(scores[best], 4), "candidates": len(candidates)}


def choose_lead(valid_docs: Sequence[str], valid_refs: Sequence[str]) -> dict[str, Any]:
    """k of lead-k by mean validation ROUGE-L (the smallest k of the best)."""
    by_k = {k: _mean_rouge_l([lead(d, k) for d in valid_docs], valid_refs) for k in range(1, LEAD_MAX_WORDS + 1)}
    best = max(by_k, key=lambda k: (by_k[k], -k))
    return {"k": best, "valid_rougeL_by_k": {str(k): round(v, 4) for k, v in by_k.items()}}


def build_baselines(data_cfg: dict[str, Any], suite: Suite, refs: References) -> dict[str, Any]:
    """Both baselines of the corpus `data_cfg` describes (rebuilt from the corpus cache), with their test outputs."""
    from zoo.data import build_splits  # the corpus builders: only needed when the file is made

    # the record's cache_dir is the training machine's (a GPU host's `.gpu/cache`): this machine's cache serves
    splits = build_splits(OmegaConf.create({**data_cfg, "cache_dir": None}))
    test_refs = tuple(e.tgt for e in splits.test)
    if references_sha256(test_refs) != refs.sha256:
        raise RecordError(
            f"the corpus rebuilt from the records' data config has other test references than "
            f"results/{suite.name}/references.json.gz: the cached corpus changed, so baselines of it would not "
            "share the records' table"
        )
    valid_docs, valid_refs = [e.src for e in splits.valid], [e.tgt for e in splits.valid]
    constant = choose_constant([e.tgt for e in splits.train], valid_refs)
    chosen_lead = choose_lead(valid_docs, valid_refs)
    return {
        "record_format": 1,
        "suite": suite.name,
        "references_sha256": refs.sha256,
        "constant": constant,
        "lead": {**chosen_lead, "outputs": [lead(e.src, chosen_lead["k"]) for e in splits.test]},
        "oracle": {"outputs": oracle([e.src for e in splits.test], test_refs)},
    }


def run_baselines(results_dir: Path, suite: Suite) -> Path | None:
    """Write `baselines.json.gz` for a summarization suite that has records and none yet; returns its path."""
    path = results_dir / BASELINES_FILE
    if suite.task == "translation" or path.is_file():
        return path if path.is_file() else None
    refs, records = load_records(results_dir, suite)
    if not records:
        return None
    data_cfg = next(iter(records.values()))["config"]["data"]
    print(f"[report] choosing the constant and lead-k baselines of {suite.name} on its validation split", flush=True)
    return write_json_gz(path, build_baselines(data_cfg, suite, refs))


def _stored(results_dir: Path, refs: References) -> tuple[Path, dict[str, Any] | None]:
    """The suite's baselines file and its contents (None when it stores none), refused when made for other
    references."""
    path = results_dir / BASELINES_FILE
    if not path.is_file():
        return path, None
    raw = read_json_gz(path)
    if raw.get("references_sha256") != refs.sha256:
        raise RecordError(f"{path}: made for other test references; delete it and rerun stages=[baselines]")
    return path, raw


def constant_outputs(results_dir: Path, refs: References) -> list[str] | None:
    """The constant baseline's output for every test document (None when the suite stores no baselines): the floor
    a summarizer must clear beyond its interval for its claims to read as more than degenerate outputs."""
    _, raw = _stored(results_dir, refs)
    return None if raw is None else [raw["constant"]["text"]] * len(refs.texts)


def score_baselines(results_dir: Path, refs: References) -> dict[str, Any] | None:
    """The stored baselines scored against the suite's references (None when the suite has none)."""
    path, raw = _stored(results_dir, refs)
    if raw is None:
        return None
    n = len(refs.texts)
    constant, lead_ = raw["constant"], raw["lead"]
    if len(lead_["outputs"]) != n:
        raise RecordError(f"{path}: {len(lead_['outputs'])} lead outputs for {n} references")
    scored: dict[str, Any] = {}
    if "oracle" in raw:  # files made before the oracle was added have none (rerun stages=[baselines] for it)
        outputs = raw["oracle"]["outputs"]
        if len(outputs) != n:
            raise RecordError(f"{path}: {len(outputs)} oracle outputs for {n} references")
        scored["oracle"] = {
            "test": rouge(outputs, refs.texts),
            "mean_words": output_stats(outputs)["mean_words"],
            **_dependence(outputs, refs),
        }
    constant_outputs = [constant["text"]] * n
    return {
        **scored,
        "constant": {**constant, "test": rouge(constant_outputs, refs.texts), **_dependence(constant_outputs, refs)},
        "lead": {
            "k": lead_["k"],
            "valid_rougeL": lead_["valid_rougeL_by_k"][str(lead_["k"])],
            "test": rouge(lead_["outputs"], refs.texts),
            "distinct": len(set(lead_["outputs"])),
            **_dependence(lead_["outputs"], refs),
        },
    }


def _dependence(outputs: Sequence[str], refs: References) -> dict[str, Any]:
    """The paired-minus-shuffled control of a baseline's outputs, as every run gets it (zoo/report/pairing.py)."""
    return {"dependence": input_dependence(outputs, refs.texts)} if len(refs.texts) >= 2 else {}


__all__ = [
    "build_baselines",
    "choose_constant",
    "choose_lead",
    "lead",
    "oracle",
    "run_baselines",
    "score_baselines",
    "sentences",
]
