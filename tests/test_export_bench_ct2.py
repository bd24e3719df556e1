"""`python -m export.bench.ct2_anchor` (issue 88): CTranslate2 against our runtime on a real export, with a real
converted Marian model of its dimensions, every engine decoding exactly N new tokens; and the exports it refuses."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
import torch

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")

from export.bench import ct2_anchor, ct2_worker
from zoo.machine import cpu_signature

NEW_TOKENS = 5


@pytest.fixture(scope="module")
def plain(exported) -> Path:
    """A plain unpruned mha export: any override skips the test head plan (this one is shared with the shortlist,
    serving and fp16 tests; the search never asks for the shortlist)."""
    return exported("transformer", "shortlist.build=true")[0]


def test_anchor_times_both_engines_on_the_same_work(plain: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "anchor.json"
    argv = ["--export", str(plain), "--searches", "greedy,beam3", "--batches", "1,4", "--sentences", "6"]
    argv += ["--new-tokens", str(NEW_TOKENS), "--rounds", "1", "--threads", "1", "--work", str(tmp_path / "w")]
    argv += ["--spinning", "false"]  # ours with another setting than the runtime's default: recorded
    assert ct2_anchor.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "| search | batch | precision | ours sent/s | CT2 sent/s | ours/CT2 |" in printed
    assert report["machine"]["signature"] == cpu_signature()
    assert report["versions"]["ctranslate2"] and report["new_tokens"] == NEW_TOKENS
    assert report["ours_spinning"] == "false"
    points = {(p["search"], p["batch"], p["precision"]) for p in report["points"]}
    assert points == {(s, b, "fp32") for s in ("greedy", "beam3") for b in (1, 4)}
    for point in report["points"]:
        assert len(point["ratios"]) == 1 and point["ratio"] == pytest.approx(statistics.median(point["ratios"]))
        for engine in ("ours", "ct2"):
            record = point[engine]
            assert record["median_sentences_per_s"] > 0 and record["peak_rss_mb"] > 0
            [run] = record["runs"]  # the worker checked every output's length and the warm-up's decoder runs
            assert run["sentences"] == 6 and run["new_tokens"] == NEW_TOKENS and run["decoder_runs_checked"]
            assert not run["torch_imported"]
        assert point["ratios"][0] == pytest.approx(
            point["ours"]["runs"][0]["sentences_per_s"] / point["ct2"]["runs"][0]["sentences_per_s"], rel=1e-3
        )
        # CTranslate2 was tried under both GEMM backends at the one thread allowed, and timed under the fastest
        setting = point["ct2_setting"]
        assert [(t["threads"], t["backend"]) for t in setting["tried"]] == [(1, "mkl"), (1, "onednn")]
        assert max(setting["tried"], key=lambda t: t["sentences_per_s"])["backend"] == setting["backend"]
        [run] = point["ct2"]["runs"]
        assert run["ct2_use_mkl"] == {"mkl": "1", "onednn": "0"}[setting["backend"]] and run["threads"] == 1
    # both engines read the same ids: the converted vocabulary is the export's, id for id
    converted = json.loads((tmp_path / "w" / "ct2-fp32" / "shared_vocabulary.json").read_text())
    pieces, _, _ = ct2_anchor.vocabulary(plain, json.loads((plain / "manifest.json").read_text()))
    assert converted == pieces and len(converted) == report["model_config"]["vocab_size"]


def test_both_engines_decode_exactly_n_tokens(plain: Path, tmp_path: Path) -> None:
    """The worker's checks, seen from outside: N tokens per sentence from N decoder runs for a greedy and a beam
    search on both engines — and a measurement whose engine does other work fails (our runtime caps the output at
    the position limit, so it cannot decode max_positions tokens)."""
    manifest = json.loads((plain / "manifest.json").read_text())
    pieces = ct2_anchor.build_marian(plain, manifest, tmp_path / "marian", seed=0)
    model = ct2_anchor.convert(tmp_path / "marian", tmp_path / "ct2", None, pieces)
    sentences = ct2_anchor.workload(plain, manifest, None, 3)
    torch_threads = torch.get_num_threads()
    try:
        for beam in (1, 3):
            for engine, path, run in (("ours", plain, ct2_worker.ours), ("ct2", model, ct2_worker.ct2)):
                work = {"engine": engine, "model": str(path), "threads": 1, "beam": beam, "steps": NEW_TOKENS}
                decode, counted, _ = run({**work, "sentences": sentences, "batches": [[0, 1, 2]]})
                assert decode([0, 1, 2]) == [NEW_TOKENS] * 3, (engine, beam)
                assert counted([0, 1, 2]) == [NEW_TOKENS] * 3, (engine, beam)
    finally:  # a CTranslate2 translator in this process sets its OpenMP thread count, which torch shares
        torch.set_num_threads(torch_threads)
    too_long = {"engine": "ours", "model": str(plain), "threads": 1, "beam": 1, "steps": manifest["max_positions"]}
    with pytest.raises(ct2_worker.MeasurementError, match="did not run the decoder"):
        ct2_worker.measure({**too_long, "sentences": sentences, "batches": [[0]]})
    assert ct2_worker.main(["--help"]) == ct2_worker.main([]) == 2  # a usage line naming the anchor, no traceback


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ({"heads_removed": True, "head_plan": {"decoder.layers.0.self_attn": [0, 1]}}, "pruned heads in 1 modules"),
        ({"attention": "gqa"}, "attention 'gqa'"),
    ],
)
def test_refuses_what_ctranslate2_cannot_represent(plain: Path, tmp_path: Path, capsys, edit, reason) -> None:
    copy = tmp_path / "export"
    shutil.copytree(plain, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, **edit}))
    assert ct2_anchor.main(["--export", str(copy), "--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and reason in err and "anchor" in err
    assert not (tmp_path / "w" / "marian").exists()  # refused before anything was built
