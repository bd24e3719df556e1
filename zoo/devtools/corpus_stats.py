"""A summarization corpus measured: the numbers zoo/data/README.md states for `data=longsumm` (and `data=summ`).

usage: python -m zoo.devtools.corpus_stats [DATA=longsumm]   (from the repository root: it composes conf/)

Builds (or loads from the cache) the corpus and prints, as JSON: documents per split and per source; median and
mean words of documents and summaries; how many summaries have two or more sentences; how extractive the summaries
are (the share of a summary's words, ROUGE's tokens, that its document does not contain); the two baselines the
suite's report scores (zoo/report/baselines.py: lead-k with k in 1…40 words chosen on validation ROUGE-L, and the
best constant training summary), plus lead-k over a wider grid of k, scored on the test split; and the lengths in
tokens of the tokenizer a run trains (train split, vocab_size, seed 1) against data.max_len.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from zoo.data import build_splits, train_run_tokenizer
from zoo.data.longsumm import sentences, words
from zoo.data.types import SPLIT_NAMES
from zoo.metrics import document_rouge, rouge
from zoo.report.baselines import choose_constant, choose_lead, lead

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
WIDE_K = (40, 60, 80, 100, 150, 200, 300)


def _novel_share(document: str, summary: str) -> float:
    seen = set(words(document))
    tokens = words(summary)
    return sum(t not in seen for t in tokens) / max(1, len(tokens))


def measure(data: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="corpus", overrides=[f"data={data}"]).data
    splits = build_splits(cfg)
    out: dict = {"data": data, "cache_dir": splits.stats.get("cache_dir"), "splits": {}}
    for name in SPLIT_NAMES:
        examples = splits.split(name)
        doc_words = [len(e.src.split()) for e in examples]
        sum_words = [len(e.tgt.split()) for e in examples]
        out["splits"][name] = {
            "documents": len(examples),
            "by_source": dict(sorted(Counter(e.origin for e in examples).items())),
            "document_words": [statistics.median(doc_words), round(statistics.fmean(doc_words), 1)],
            "summary_words": [statistics.median(sum_words), round(statistics.fmean(sum_words), 1)],
            "summaries_2plus_sentences": sum(len(sentences(e.tgt)) >= 2 for e in examples),
            "novel_summary_words": round(statistics.fmean(_novel_share(e.src, e.tgt) for e in examples), 3),
        }
    valid_docs, valid_refs = [e.src for e in splits.valid], [e.tgt for e in splits.valid]
    test_docs, test_refs = [e.src for e in splits.test], [e.tgt for e in splits.test]
    chosen = choose_lead(valid_docs, valid_refs)
    wide = {k: float(100 * np.mean(document_rouge([lead(d, k) for d in valid_docs], valid_refs)[:, 2])) for k in WIDE_K}
    best_wide = max(wide, key=lambda k: (wide[k], -k))
    constant = choose_constant([e.tgt for e in splits.train], valid_refs)
    out["baselines_test"] = {
        f"lead-{chosen['k']} (k of 1-40 by valid ROUGE-L)": rouge([lead(d, chosen["k"]) for d in test_docs], test_refs),
        f"lead-{best_wide} (k of {list(WIDE_K)} by valid ROUGE-L)": rouge(
            [lead(d, best_wide) for d in test_docs], test_refs
        ),
        "constant (best training summary by valid ROUGE-L)": rouge([constant["text"]] * len(test_refs), test_refs),
    }
    out["lead_valid_rougeL_wide_k"] = {k: round(v, 2) for k, v in wide.items()}
    tokenizer = train_run_tokenizer(splits.train, cfg, seed=1)
    max_len = int(cfg.max_len)
    for name in SPLIT_NAMES:
        src = [len(ids) for ids in tokenizer.encode_batch([e.src for e in splits.split(name)])]
        tgt = [len(ids) for ids in tokenizer.encode_batch([e.tgt for e in splits.split(name)])]
        out["splits"][name]["tokens"] = {
            "document_median": statistics.median(src),
            "summary_median": statistics.median(tgt),
            f"pairs_over_max_len_{max_len}": sum(s > max_len or t + 1 > max_len for s, t in zip(src, tgt, strict=True)),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1] if len(sys.argv) > 1 else "longsumm"), indent=2, ensure_ascii=False))
