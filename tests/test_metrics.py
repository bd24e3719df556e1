"""zoo.metrics on small cases whose values are known independently (by hand, or from the
sacrebleu command line run as a separate process on the same files)."""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from zoo.metrics import (
    corpus_bleu,
    corpus_chrf,
    document_rouge,
    document_stats,
    mean_from_stats,
    output_stats,
    paired_bootstrap,
    paired_bootstrap_means,
    quality_report,
    rouge,
    tokenized_bleu,
)

REFS = [
    "The cat sat on the mat, didn't it?",
    "Guten Morgen! Wie geht es dir heute?",
    "Install the package with apt-get install foo.",
    "It works, really.",
]
HYPS = [
    "The cat sat on a mat, didn't it?",
    "Guten Morgen! Wie geht's dir heute?",
    "Install this package with apt install foo.",
    "It really works.",
]


def test_identical_output_scores_100() -> None:
    assert corpus_bleu(REFS, REFS) == pytest.approx(100.0)
    assert corpus_chrf(REFS, REFS) == pytest.approx(100.0)
    assert tokenized_bleu(REFS, REFS) == pytest.approx(100.0)
    assert rouge(REFS, REFS) == pytest.approx({"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0})


def test_bleu_by_hand() -> None:
    # clipped n-gram precisions 5/6, 3/5, 2/4, 1/3; equal lengths so brevity penalty 1
    expected = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert corpus_bleu(["the cat sat on the mat"], ["the cat sat on a mat"]) == pytest.approx(expected)
    assert tokenized_bleu(["the cat sat on the mat"], ["the cat sat on a mat"]) == pytest.approx(expected)
    # brevity penalty: 4 of 6 reference words, all n-grams match -> exp(1 - 6/4)
    assert corpus_bleu(["the cat sat on"], ["the cat sat on a mat"]) == pytest.approx(100 * math.exp(1 - 6 / 4))


def _cli(args: list[str], hyps: list[str], refs: list[str], tmp_path: Path) -> float:
    (tmp_path / "hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    exe = shutil.which("sacrebleu", path=str(Path(sys.executable).parent)) or "sacrebleu"
    out = subprocess.run(
        [exe, str(tmp_path / "ref.txt"), "-i", str(tmp_path / "hyp.txt"), "-b", "-w", "4", *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    ).stdout
    return float(out.split()[0])


def test_matches_sacrebleu_command_line(tmp_path: Path) -> None:
    # `sacrebleu REF -i HYP -b -w 4` prints the score alone, rounded to 4 decimals
    assert corpus_bleu(HYPS, REFS) == pytest.approx(_cli(["-m", "bleu"], HYPS, REFS, tmp_path), abs=1e-3)
    assert corpus_chrf(HYPS, REFS) == pytest.approx(_cli(["-m", "chrf"], HYPS, REFS, tmp_path), abs=1e-3)
    tok = _cli(["-m", "bleu", "--tokenize", "none", "--smooth-method", "none", "--force"], HYPS, REFS, tmp_path)
    assert tokenized_bleu(HYPS, REFS) == pytest.approx(tok, abs=1e-3)
    assert 0 < corpus_bleu(HYPS, REFS) < 100


def test_tokenized_and_detokenized_bleu_differ_on_attached_punctuation() -> None:
    ref = ["The quick brown fox jumps over the lazy dog, and then it runs away."]
    hyp = ["The quick brown fox jumps over the lazy dog , and then it runs away ."]
    # 13a splits the punctuation off both sides, so the detokenized score sees identical text…
    assert corpus_bleu(hyp, ref) == pytest.approx(100.0)
    # …while whitespace splitting sees "dog," vs "dog" "," and "away." vs "away" ".".
    tok = tokenized_bleu(hyp, ref)
    assert 0 < tok < 90
    assert tokenized_bleu([h.replace(" ,", ",").replace(" .", ".") for h in hyp], ref) == pytest.approx(100.0)


def test_rouge_by_hand_with_stemming() -> None:
    scores = rouge(["the cat sat"], ["the cat ran"])
    # unigrams 2/3 both ways; bigrams 1/2; LCS "the cat" = 2 of 3
    assert scores == pytest.approx({"rouge1": 200 / 3, "rouge2": 50.0, "rougeL": 200 / 3})
    # Porter stemming: running -> run, dogs -> dog
    assert rouge(["running dogs"], ["run dog"])["rouge1"] == pytest.approx(100.0)
    # averaged over segments, not pooled
    both = rouge(["the cat sat", "running dogs"], ["the cat ran", "run dog"])
    assert both["rouge2"] == pytest.approx((50.0 + 100.0) / 2)


def test_quality_report_per_source() -> None:
    origins = ["debian", "ubuntu", "debian", "ubuntu"]
    report = quality_report("translation", HYPS, REFS, origins)
    assert set(report) == {"bleu", "chrf", "n", "per_source"}
    assert report["bleu"] == pytest.approx(corpus_bleu(HYPS, REFS))
    assert list(report["per_source"]) == ["debian", "ubuntu"]
    debian = report["per_source"]["debian"]
    assert debian["n"] == 2
    assert debian["bleu"] == pytest.approx(corpus_bleu([HYPS[0], HYPS[2]], [REFS[0], REFS[2]]))
    assert debian["chrf"] == pytest.approx(corpus_chrf([HYPS[0], HYPS[2]], [REFS[0], REFS[2]]))
    assert "per_source" not in quality_report("translation", HYPS, REFS)

    summ = quality_report("summarization", ["the cat sat", "running dogs"], ["the cat ran", "run dog"], ["a", "b"])
    assert set(summ) == {"rouge1", "rouge2", "rougeL", "n", "per_source"}
    assert summ["per_source"]["b"] == {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0, "n": 1}
    assert summ["per_source"]["a"]["rouge2"] == pytest.approx(50.0)


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        quality_report("parsing", HYPS, REFS)
    with pytest.raises(ValueError):
        corpus_bleu(HYPS, REFS[:2])
    with pytest.raises(ValueError):
        quality_report("translation", HYPS, REFS, origins=["a"])
    with pytest.raises(ValueError):
        corpus_bleu([], [])


def _synthetic(n: int = 150) -> tuple[list[str], list[str], list[str]]:
    """References plus a good system (10% words dropped) and a bad one (40% dropped)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 16))) for _ in range(n)]

    def degrade(p: float) -> list[str]:
        return [" ".join(w for w in r.split() if rng.random() > p) or r.split()[0] for r in refs]

    return refs, degrade(0.4), degrade(0.1)


def test_paired_bootstrap_detects_a_real_difference() -> None:
    refs, bad, good = _synthetic()
    env_before = os.environ.get("SACREBLEU_SEED")
    result = paired_bootstrap(bad, good, refs, n_samples=300)
    assert result["baseline"]["bleu"] == pytest.approx(corpus_bleu(bad, refs))
    assert result["system"]["bleu"] == pytest.approx(corpus_bleu(good, refs))
    assert result["system"]["bleu"] > result["baseline"]["bleu"]
    assert 0 < result["p_value"] < 0.05 and result["significant"]
    assert result["system"]["ci"] > 0 and result["baseline"]["ci"] > 0
    assert "bs:300" in result["signature"] and "seed:12345" in result["signature"]
    assert os.environ.get("SACREBLEU_SEED") == env_before  # the seed override does not leak


def test_paired_bootstrap_matches_sacrebleu_and_is_reproducible(monkeypatch: pytest.MonkeyPatch) -> None:
    refs, bad, good = _synthetic()
    near = [g if i % 3 else b for i, (g, b) in enumerate(zip(good, bad, strict=True))]  # a closer pair
    ours = paired_bootstrap(good, near, refs, n_samples=200, seed=7)
    assert ours == paired_bootstrap(good, near, refs, n_samples=200, seed=7)
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    signatures, scores = PairedTest(
        [("a", good), ("b", near)], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=200
    )()
    baseline, system = scores["BLEU"]
    # number for number: zoo.metrics runs sacreBLEU's steps with fewer resample passes, not an approximation
    assert ours["p_value"] == system.p_value and 0 < ours["p_value"] <= 1
    assert (ours["system"]["bleu"], ours["system"]["mean"], ours["system"]["ci"]) == (
        system.score,
        system.mean,
        system.ci,
    )
    assert (ours["baseline"]["bleu"], ours["baseline"]["mean"], ours["baseline"]["ci"]) == (
        baseline.score,
        baseline.mean,
        baseline.ci,
    )
    assert ours["signature"] == str(signatures["BLEU"])


def test_paired_bootstrap_identical_systems_not_significant() -> None:
    refs, _, good = _synthetic()
    result = paired_bootstrap(good, list(good), refs, n_samples=200)
    assert result["p_value"] == 1.0 and not result["significant"]
    assert result["system"]["bleu"] == result["baseline"]["bleu"]


def test_paired_bootstrap_equal_scores_from_different_outputs_not_significant() -> None:
    """Two different systems that both score BLEU 0 tie in every resample: sacreBLEU reports its minimum
    p there; no observed difference must not be called significant."""
    refs = [f"the quick brown fox number {i} jumps" for i in range(30)]
    sys_a = [f"alpha {i}" for i in range(30)]
    sys_b = [f"beta gamma {i}" for i in range(30)]
    result = paired_bootstrap(sys_a, sys_b, refs, n_samples=50)
    assert result["system"]["bleu"] == result["baseline"]["bleu"] == 0.0
    assert result["p_value"] == 1.0 and not result["significant"]


def test_document_rouge_rows_are_what_rouge_averages() -> None:
    hyps, refs = ["the cat sat", "running dogs", "a b c d"], ["the cat ran", "run dog", "a b x d"]
    rows = document_rouge(hyps, refs)
    assert rows.shape == (3, 3)
    assert rows[0] == pytest.approx([2 / 3, 0.5, 2 / 3])  # by hand, as in test_rouge_by_hand_with_stemming
    assert rouge(hyps, refs) == pytest.approx(
        {"rouge1": 100 * rows[:, 0].mean(), "rouge2": 100 * rows[:, 1].mean(), "rougeL": 100 * rows[:, 2].mean()}
    )
    stats = document_stats(hyps, refs, "rougeL")  # [N, 2]: F1 × 100 and 1, summed over any resample
    assert stats.shape == (3, 2) and (stats[:, 1] == 1).all()
    assert mean_from_stats(stats.sum(axis=0)) == pytest.approx(rouge(hyps, refs)["rougeL"])
    assert mean_from_stats(stats[[0, 0, 2]].sum(axis=0)) == pytest.approx(100 * (2 * rows[0, 2] + rows[2, 2]) / 3)
    with pytest.raises(ValueError, match="unknown ROUGE metric 'bleu'"):
        document_stats(hyps, refs, "bleu")


def _paired_bootstrap_by_the_rule(base: list[float], system: list[float], n: int, seed: int) -> float:
    """sacreBLEU's paired-bootstrap rule written out: the same document resamples for both systems, the absolute
    difference of their means per resample, centred; p counts centred differences above the observed one."""
    rng = np.random.default_rng(seed)
    resamples = rng.choice(len(base), size=(n, len(base)), replace=True)
    observed = abs(sum(system) / len(system) - sum(base) / len(base))
    diffs = [abs(sum(system[i] for i in r) / len(r) - sum(base[i] for i in r) / len(r)) for r in resamples]
    centre = sum(diffs) / n
    return (sum(1 for d in diffs if d - centre > observed) + 1) / (n + 1)


def test_paired_bootstrap_of_means_follows_sacrebleus_rule() -> None:
    rng = random.Random(3)
    base = [rng.uniform(0, 60) for _ in range(80)]
    close = [b + rng.gauss(0.3, 8.0) for b in base]  # a small effect under much noise
    far = [b + 6.0 + rng.gauss(0.0, 2.0) for b in base]  # a large, consistent effect
    for system in (close, far):
        got = paired_bootstrap_means(np.array(base), np.array(system), n_samples=300, seed=7)
        assert got["p_value"] == pytest.approx(_paired_bootstrap_by_the_rule(base, system, 300, 7))
        assert got["baseline"] == pytest.approx(sum(base) / 80) and got["system"] == pytest.approx(sum(system) / 80)
    assert paired_bootstrap_means(np.array(base), np.array(far), n_samples=300)["p_value"] == pytest.approx(1 / 301)
    assert paired_bootstrap_means(np.array(base), np.array(close), n_samples=300)["significant"] is False
    same = paired_bootstrap_means(np.array(base), np.array(base), n_samples=300)
    assert same["p_value"] == 1.0 and same["significant"] is False
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap_means(np.array(base), np.array(base[:-1]))


def test_output_stats_count_what_depends_on_the_input() -> None:
    constant = output_stats(["files for the library"] * 4)
    assert constant == {"documents": 4, "distinct": 1, "top_share": 1.0, "mean_words": 4.0}
    varied = output_stats(["a b", "a b", "c", "d e f"])
    assert varied == {"documents": 4, "distinct": 3, "top_share": 0.5, "mean_words": 2.0}
    assert output_stats([]) == {"documents": 0, "distinct": 0, "top_share": 0.0, "mean_words": 0.0}
