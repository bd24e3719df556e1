"""Vocabulary shortlists (issue 42): the builder against its formula, the shortlisted search against the full one for
every mechanism kind, the export that carries a shortlist, and what is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import export
import export.shortlist as shortlist_builder
from export import runtime as rt
from export.bench import shortlist as bench_shortlist
from export.exporter import export_checkpoint
from export.graph import ExportError
from export.pruning import prune
from export.runtime import Search
from export.runtime.generation import padded, search_batch
from export.runtime.manifest import ShortlistInfo
from export.runtime.shortlist import SHORTLIST_FILE, Shortlist
from export.shortlist import ShortlistSettings, build_shortlist, count_pairs
from tests.export_testing import TRAINED_ENTRIES, export_config
from tests.zoo_testing import REPO
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.decoding.generate import generate as torch_generate


# ---------------------------------------------------------------------------------------------- the builder
def literal_shortlist(
    pairs: list[tuple[list[int], list[int]]],
    vocab: int,
    settings: ShortlistSettings,
    always: set[int],
    banned: set[int],
) -> tuple[dict[int, list[int]], list[int]]:
    """Written from the formula: sentence counts c(s), c(t), c(s, t) over distinct tokens per pair; per source token
    the `per_source_token` targets with the highest p(t | s) = c(s, t) / c(s) among pairs seen ≥ min_pairs times
    (ties: lower id); `always` = the `frequent` most frequent targets (ties: lower id) ∪ the given ids."""
    cs, ct, c = Counter(), Counter(), Counter()
    for src, tgt in pairs:
        cs.update(set(src))
        ct.update(set(tgt))
        c.update((s, t) for s in set(src) for t in set(tgt))
    lists = {}
    for s in range(vocab):
        scored = [(n / cs[s], t) for (a, t), n in c.items() if a == s and n >= settings.min_pairs and t not in banned]
        scored.sort(key=lambda x: (-x[0], x[1]))
        lists[s] = sorted(t for _, t in scored[: settings.per_source_token])
    frequent = sorted((t for t in ct if t not in banned), key=lambda t: (-ct[t], t))[: settings.frequent]
    return lists, sorted(set(frequent) | always)


@pytest.mark.parametrize(
    "settings", [ShortlistSettings(3, 4, 1), ShortlistSettings(5, 0, 2), ShortlistSettings(1, 9, 3)]
)
def test_the_builder_follows_its_formula(settings: ShortlistSettings, monkeypatch) -> None:
    rng = np.random.default_rng(7)
    vocab = 40
    pairs = []
    for _ in range(300):  # a word-for-word "translation" 10 → 10 + 20 with noise, so p(t | s) has something to find
        src = rng.integers(4, 20, size=rng.integers(1, 9)).tolist()
        tgt = [t + 20 if rng.random() < 0.8 else int(rng.integers(4, vocab)) for t in src]
        pairs.append((src, tgt))
    monkeypatch.setattr(shortlist_builder, "CHUNK", 37)  # several chunks: their counts are merged
    counts = count_pairs([p[0] for p in pairs], [p[1] for p in pairs], vocab)
    built = build_shortlist(counts, settings, always=(3, 1), banned=(0, 2))
    lists, always = literal_shortlist(pairs, vocab, settings, {3, 1}, {0, 2})
    assert built.always.tolist() == always
    assert {s: built.targets[built.offsets[s] : built.offsets[s + 1]].tolist() for s in range(vocab)} == lists
    if settings.per_source_token >= 3:  # the word's own translation leads its list
        assert all(s + 20 in lists[s] for s in range(4, 20))
    built.check(vocab)


def test_a_batch_decodes_over_its_sources_lists_always_and_eos() -> None:
    offsets = np.array([0, 0, 2, 2, 5, 5], dtype=np.int64)  # token 1 → {4, 2}, token 3 → {0, 1, 4}
    shortlist = Shortlist(offsets, np.array([2, 4, 0, 1, 4], dtype=np.int32), np.array([3], dtype=np.int32))
    src = np.array([[1, 0, 0], [3, 1, 0]])  # 0 is padding, listed nothing
    assert shortlist.candidates(src, required=(2,)).tolist() == [0, 1, 2, 3, 4]
    assert shortlist.candidates(np.array([[1]]), required=(2,)).tolist() == [2, 3, 4]
    assert shortlist.candidates(np.array([[1]])).dtype == np.int64


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"offsets": [0, 1, 1], "targets": [1], "always": [3]}, "offsets for 2 source tokens"),
        ({"offsets": [0, 2, 1, 1, 1, 1], "targets": [1], "always": [3]}, "do not partition"),
        ({"offsets": [0, 1, 1, 1, 1, 1], "targets": [9], "always": [3]}, r"outside the vocabulary \[0, 5\)"),
        ({"offsets": [0, 0, 0, 0, 0, 0], "targets": []}, "lacks"),
    ],
)
def test_a_bad_shortlist_file_is_refused_naming_the_fix(arrays: dict, message: str, tmp_path: Path) -> None:
    path = tmp_path / SHORTLIST_FILE
    np.savez(path, **{k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()})
    with pytest.raises(rt.ExportedModelError, match=message) as err:
        Shortlist.load(path, vocab_size=5)
    assert "shortlist.build=true" in str(err.value)
    path.write_bytes(b"not a zip file")
    with pytest.raises(rt.ExportedModelError, match="cannot read"):
        Shortlist.load(path, vocab_size=5)


# ---------------------------------------------------------------------------------------------- the searches
def _setup(entry: str, exported, smoke_run, smoke_corpus):
    out, manifest = exported(entry, "shortlist.build=true")  # a decoder graph that takes a shortlist
    payload = load_checkpoint(smoke_run(entry))
    _, reference = prune(model_from_checkpoint(payload), manifest["head_plan"], remove=False)  # what ORT equals
    runtime = export.load(out, threads=1)
    texts = (smoke_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:24]
    return runtime, reference, padded(runtime.encode_texts(texts), runtime.pad_id)


def _searches(runtime, src: np.ndarray, shortlist: int) -> list[list[list[rt.Hypothesis]]]:
    """n-best lists of greedy search and of beam 5 (all five hypotheses)."""
    greedy = search_batch(runtime, src, Search(beam_size=1, shortlist=shortlist))
    beam = search_batch(runtime, src, Search(beam_size=5, len_penalty=0.8, shortlist=shortlist, num_hypotheses=5))
    return [greedy, beam]


def _only(tokens: set[int], vocab: int) -> Shortlist:
    """A shortlist that lets every batch produce `tokens` and nothing else."""
    no_lists = np.zeros(vocab + 1, dtype=np.int64)
    return Shortlist(no_lists, np.zeros(0, dtype=np.int32), np.array(sorted(tokens), dtype=np.int32))


@pytest.mark.parametrize("entry", TRAINED_ENTRIES)
def test_a_shortlist_holding_every_emitted_token_changes_no_hypothesis(
    entry: str, exported, smoke_run, smoke_corpus
) -> None:
    """The acceptance test, for every attention computation the decoder step exports differently. With a shortlist
    that holds every token the full search emits: greedy returns the full search's hypotheses; greedy and beam
    return the hypotheses and scores (1e-4, ORT vs torch) of the full search over the masked vocabulary — torch's
    search with every other logit at -inf, so probabilities are normalised within the shortlist (as Marian's and
    CTranslate2's shortlists normalise); and a token outside the shortlist is never emitted."""
    runtime, reference, src = _setup(entry, exported, smoke_run, smoke_corpus)
    full = _searches(runtime, src, shortlist=0)
    emitted = {t for nbest in full for hyps in nbest for h in hyps for t in h.tokens}
    runtime.shortlist = _only(emitted, runtime.vocab_size)
    rows = runtime.shortlist.candidates(src, required=(runtime.eos_id,))
    assert len(rows) < runtime.vocab_size // 3  # the shortlist leaves most of the vocabulary out
    shortlisted = _searches(runtime, src, shortlist=1)
    assert [h[0].tokens for h in shortlisted[0]] == [h[0].tokens for h in full[0]]
    searches = (Search(beam_size=1, shortlist=1), Search(beam_size=5, len_penalty=0.8, shortlist=1, num_hypotheses=5))
    for search, ours in zip(searches, shortlisted, strict=True):
        theirs = torch_generate(reference, torch.from_numpy(src), search, vocab_rows=torch.from_numpy(rows))
        for a, b in zip(ours, theirs, strict=True):
            assert a[0].tokens == b[0].tokens
            mine, ref = {tuple(h.tokens): h.score for h in a}, {tuple(h.tokens): h.score for h in b}
            assert mine.keys() == ref.keys()
            assert max(abs(mine[k] - ref[k]) for k in mine) <= 1e-4

    # a shortlist without the most frequent emitted word: never emitted, the search still ends every sentence
    word, _ = Counter(t for h in full[0] for t in h[0].tokens).most_common(1)[0]
    runtime.shortlist = _only(emitted - {word}, runtime.vocab_size)
    allowed = set(runtime.shortlist.candidates(src, required=(runtime.eos_id,)).tolist())
    for nbest in _searches(runtime, src, shortlist=1):
        assert all(set(h.tokens) <= allowed and word not in h.tokens for hyps in nbest for h in hyps)
        assert all(hyps for hyps in nbest)


@pytest.fixture(scope="module")
def biased(exported, smoke_run, smoke_corpus, tmp_path_factory) -> tuple[rt.ExportedModel, dict, set[int], np.ndarray]:
    """(runtime, manifest, K, sources): the smoke transformer with a final logits bias that puts every token outside K
    at -30, K = the tokens its full searches emit on 24 test sources (+ eos), exported with a shortlist counted from
    parallel files (shortlist.src/tgt: the smoke corpus's training pairs)."""
    payload = load_checkpoint(smoke_run("transformer"))
    texts = (smoke_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:24]
    # the run's unpruned export (with a shortlist, which the searches below leave off: shortlist=0)
    plain = export.load(exported("transformer", "shortlist.build=true")[0], threads=1)
    src = padded(plain.encode_texts(texts), plain.pad_id)
    kept = {t for nbest in _searches(plain, src, 0) for hyps in nbest for h in hyps for t in h.tokens} | {plain.eos_id}
    bias = torch.full((plain.vocab_size,), -30.0)
    bias[sorted(kept)] = 0.0
    payload["model_config"] = {**payload["model_config"], "final_logits_bias": True}
    payload["model"] = {**payload["model"], "final_logits_bias": bias}
    root = tmp_path_factory.mktemp("biased")
    torch.save(payload, root / "biased.pt")
    pairs = [f"shortlist.src={smoke_corpus / 'train.de'}", f"shortlist.tgt={smoke_corpus / 'train.en'}"]
    made = export_checkpoint(export_config(root / "biased.pt", root / "biased", "shortlist.build=true", *pairs))
    return export.load(made["out"], threads=1), made, kept, src


def test_where_the_model_gives_the_rest_no_mass_the_shortlisted_search_is_the_full_one(biased) -> None:
    """The same statement without renormalisation: a transformer whose final logits bias puts every token outside a
    set K at -30 (e^-30 of the mass) — the shortlisted search over K returns the full search's hypotheses and
    scores to 1e-5, greedy and beam."""
    runtime, _, kept, src = biased
    full = _searches(runtime, src, shortlist=0)
    assert {t for nbest in full for hyps in nbest for h in hyps for t in h.tokens} <= kept
    runtime.shortlist = _only(kept, runtime.vocab_size)
    for ours, theirs in zip(_searches(runtime, src, shortlist=1), full, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert max(abs(x.score - y.score) for x, y in zip(a, b, strict=True)) <= 1e-5


def test_an_export_built_with_a_shortlist_carries_and_uses_it(exported) -> None:
    out, manifest = exported("transformer", "shortlist.build=true")
    info = manifest["shortlist"]
    assert info["file"] == SHORTLIST_FILE and SHORTLIST_FILE in manifest["files"]
    assert info["per_source_token"] == 100 and info["pairs"] > 0 and info["entries"] > 0
    assert list(info) == list(ShortlistInfo.__annotations__)  # the manifest schema's keys, in order
    assert manifest["verification"]["max_abs_shortlist_logits_diff"] <= 1e-4
    runtime = export.load(out, threads=1)
    texts = json.loads((out / "heldout.json").read_text())["src"][:8]
    src = padded(runtime.encode_texts(texts), runtime.pad_id)
    rows = set(runtime.candidates(src, Search(shortlist=1)).tolist())
    assert runtime.eos_id in rows and len(rows) < runtime.vocab_size
    for hyps in runtime.translate(texts, shortlist=1, num_hypotheses=5):
        assert all(set(h.tokens) <= rows for h in hyps)
    assert runtime.search.shortlist == 0  # off by default: a search asks for it


def test_shortlist_from_parallel_files_and_what_is_refused(biased, smoke_run, smoke_corpus, tmp_path) -> None:
    """shortlist.src/tgt: a converted model has no training split to count; bad files are refused before any work,
    naming the fix, and nothing is written. (The export built from files is the biased one above: a checkpoint
    file, not a run.)"""
    run = smoke_run("transformer")
    refused = [
        (["shortlist.src=a.de"], "go together"),
        ([f"shortlist.src={smoke_corpus / 'test.de'}", f"shortlist.tgt={tmp_path / 'missing.en'}"], "cannot read"),
    ]
    for overrides, message in refused:
        with pytest.raises(ExportError, match=message):
            export_checkpoint(export_config(run, tmp_path / "refused", "shortlist.build=true", *overrides))
        assert not (tmp_path / "refused").exists()
    _, manifest, _, _ = biased
    assert manifest["shortlist"]["built_from"] == "train.de / train.en" and manifest["shortlist"]["entries"] > 0


def test_shortlist_on_an_export_without_one_is_refused_naming_the_fix(exported) -> None:
    out, _ = exported("transformer")
    runtime = export.load(out, threads=1)
    with pytest.raises(rt.SearchError, match=r"without a vocabulary shortlist.*shortlist\.build=true"):
        runtime.translate(["Guten Morgen."], shortlist=1)
    with pytest.raises(rt.SearchError, match=r"shortlist=2.*\[0, 1\]"):
        runtime.translate(["Guten Morgen."], shortlist=2)


def test_bench_shortlist_measures_quality_sizes_and_speed(exported, smoke_corpus, tmp_path) -> None:
    """`python -m export.bench.shortlist`: quality with and without the shortlist (paired bootstrap), candidate
    sizes, coverage, both modes at the four standard points in fresh processes, and its README render."""
    out, _ = exported("transformer", "shortlist.build=true")
    report_file = tmp_path / "report.json"
    args = ["--export", str(out), "--src", str(smoke_corpus / "test.de"), "--ref", str(smoke_corpus / "test.en")]
    args += ["--rounds", "1", "--sentences-b1", "3", "--sentences-b32", "6", "--quality-sentences", "12"]
    proc = subprocess.run(
        [sys.executable, "-m", "export.bench.shortlist", *args, "--json", str(report_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(report_file.read_text())
    q = report["quality"]
    assert q["sentences"] == 12 and 0 < q["p_value"] <= 1 and 0 < q["coverage"] <= 1
    sizes = report["candidates"]
    assert 0 < sizes["batch1"]["median"] <= sizes["batch32"]["max"] < report["model"]["vocab"]
    assert set(report["points"]) == {"greedy_b1", "greedy_b32", "beam5_b1", "beam5_b32"}
    for point in report["points"].values():
        assert point["ratio"] > 0 and all(point[m]["median_sentences_per_s"] > 0 for m in ("full", "shortlist"))
    assert "| beam5_b32 |" in proc.stdout
    rendered = bench_shortlist.render([(report, "r.json")])
    assert "`python -m export.bench.shortlist --render r.json`" in rendered and "paired bootstrap p =" in rendered
