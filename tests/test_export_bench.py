"""`python -m export.bench` end to end on smoke exports (numbers meaningless here) and its refusals.

Every export here runs with one thread (`runtime.threads=1`): the two cores are shared.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from export import runtime as rt
from export.bench import points, roofline, speed
from export.bench import table as bench_table
from export.runtime.generation import padded
from tests.zoo_testing import REPO, tiny_model


def test_bench_runs_side_by_side(ght_ps_unpruned, exported, smoke_run, tmp_path, capsys) -> None:
    """`python -m export.bench` end to end on smoke checkpoints with tiny settings (numbers meaningless here)."""
    _, unpruned, _ = ght_ps_unpruned
    pruned, _ = exported("ght_ps")
    report_path = tmp_path / "bench.json"
    speed.main(
        [
            "--roofline",
            "--checkpoint",
            str(smoke_run("ght_ps")),
            "--export",
            str(unpruned),
            "--pruned-export",
            str(pruned),
            "--threads",
            "1",
            "--repeats",
            "1",
            "--batches",
            "1,4",
            "--batch1-sentences",
            "2",
            "--paper-batch",
            "8",
            "--fixed-len",
            "4",
            "--json",
            str(report_path),
        ]
    )
    text = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    labels = [p["label"] for p in report["points"]]
    for mode in ("natural", "fixed"):
        for search in ("greedy", "beam5"):
            for batch in (1, 4):
                assert f"{mode} {search} batch {batch}" in labels
    assert "paper: beam 5, batch 8, max len 10" in labels
    assert "headline: fixed beam5 batch 32" in labels  # the grid lacks batch 32 (and has 1 round): measured apart
    for p in report["points"]:
        e = p["engines"]
        assert set(e) == {"torch", "ort"} and all(v["sentences_per_s"] > 0 for v in e.values())
        [vs_torch] = p["pairs"]
        assert (vs_torch["engine"], vs_torch["baseline"]) == ("ort", "torch") and vs_torch["ratio"] == p["ratio"] > 0
        assert vs_torch["identical"] == p["sentences"]  # both engines return the same hypotheses
        if p.get("mode") == "fixed":
            assert 0 < e["ort"]["gflops_per_s"] < report["matmul_roofline_gflops"] * 2
            # the same matmuls on both sides of the share: a search can only come near its matmuls' own roofline
            assert e["ort"]["roofline_gflops"] > 0 and 0 < e["ort"]["efficiency"] < 1
            ort = e["ort"]
            assert ort["matmul_gflops_per_s"] == pytest.approx(ort["efficiency"] * ort["roofline_gflops"])
            assert ("bandwidth_fraction" in e["ort"]) == (p["batch"] == 1)  # weight traffic: batch 1 only
            if p["batch"] == 1:  # the step's matmuls alone take a share of the search's time, and stream its weights
                assert 0 < ort["stream_fraction"] < 1 and ort["stream_gb_per_s"] > 0
                [stream] = report["limits"]["step_stream_s"]
                assert stream["weight_bytes"] == ort["step_weight_bytes"]
                assert ort["stream_gb_per_s"] == pytest.approx(stream["weight_bytes"] / stream["seconds"] / 1e9)
    assert report["headline"]["rounds"] == 3 and report["baseline_runtime"] is None
    assert report["matmul_roofline_gflops"] > 0
    assert set(report["memory"]) >= {"fp32"} and set(report["memory"]["fp32"]["engines"]) == {"ort"}
    pruning = report["pruning"]
    assert 0 < pruning["analytic_flops_ratio"] < 1 and pruning["torch"]["speedup"] > 0 and pruning["ort"]["speedup"] > 0
    assert "ratio" in text and "analytic FLOP ratio" in text and "of their roofline" in text
    assert report["read_bandwidth_gbps"] > 0 and "% of memory" in text
    # every shape the roofline timed, per kernel; the limits table has a row per fixed-length point of the grid
    assert report["limits"]["kernels_s"] and all(
        set(t) == {"torch", "onnxruntime"} for t in report["limits"]["kernels_s"].values()
    )
    rows = [line for line in bench_table.render_limits(report, "r.json").splitlines() if line.startswith("| ")]
    fixed = [p for p in report["points"] if p.get("mode") == "fixed" and not p["label"].startswith("headline")]
    assert len(rows) == 1 + len(fixed) and all("%**" in row for row in rows[1:])  # the header, then a row each


def test_step_matmuls_are_the_decoder_linears_a_step_runs() -> None:
    """Per decoder layer: self-attention q, k, v, out; cross-attention q and out (its keys and values come from the
    encoder pass); the FFN's two; then the output projection. A pruned module's projections shrink with it."""
    model = tiny_model("transformer")  # d 32, 8 heads of 4, FFN 64, 2 decoder layers, vocabulary 64
    d, f, v = model.cfg.d_model, model.cfg.ffn_dim, model.cfg.vocab_size
    layer = [(5, d, d)] * 4 + [(5, d, d)] * 2 + [(5, d, f), (5, f, d)]
    assert roofline.step_matmuls(model, 5) == layer * model.cfg.decoder_layers + [(5, d, v)]
    assert roofline.step_weight_bytes(model) == 4 * sum(k * n for _, k, n in roofline.step_matmuls(model, 1))
    model.apply_head_plan({"decoder.layers.0.self_attn": [0, 2]}, remove=True)
    shrunk = roofline.step_matmuls(model, 1)
    kept = 2 * d // model.cfg.num_heads
    assert shrunk[0] == (1, d, kept) and shrunk[3] == (1, kept, d)  # q_proj, out_proj of 2 of 8 heads
    assert roofline.read_bandwidth(threads=1, megabytes=8, repeats=1) > 0
    # the step's matmuls alone, every weight its own: more work (a wider step) takes longer
    one = roofline.step_stream_seconds(shrunk, threads=1, repeats=1)
    assert 0 < one < roofline.step_stream_seconds(shrunk * 8, threads=1, repeats=1)


def test_search_matmuls_are_the_encoder_pass_then_every_step_at_its_rows() -> None:
    """Each padded batch [B, S] decoded to its length limit L: the encoder's Linears and the decoder's cross-attention
    keys and values once over B × S positions; then L − 1 steps (the last position's eos is forced without one):
    beam search's first on one row per sentence (every beam is the same bos), the others on beam × B rows; greedy
    runs B rows throughout. The limits time each distinct shape once per kernel and take the faster."""
    model = tiny_model("transformer")  # vocabulary 64 ≥ 2 × beam + banned: beam search starts on one row
    d, f = model.cfg.d_model, model.cfg.ffn_dim
    batches = [np.zeros((2, 3), dtype=np.int64), np.zeros((1, 5), dtype=np.int64)]
    encoder = ([(d, d)] * 4 + [(d, f), (f, d)]) * model.cfg.encoder_layers + [(d, d)] * 2 * model.cfg.decoder_layers
    expected: Counter = Counter()
    for b, s in ((2, 3), (1, 5)):
        expected.update((b * s, k, n) for k, n in encoder)
        expected.update(roofline.step_matmuls(model, b))
        for _ in range(2):
            expected.update(roofline.step_matmuls(model, 5 * b))
    assert roofline.search_matmuls(model, batches, max_len=4, beam_size=5) == expected
    assert roofline.decoder_steps(batches, max_len=4) == 6
    greedy = roofline.search_matmuls(model, batches, max_len=4, beam_size=1)
    assert sum(c for (m, _, _), c in greedy.items() if m == 2) == 3 * len(roofline.step_matmuls(model, 2))
    limits = roofline.MachineLimits.measure(threads=1)
    seconds = limits.matmul_seconds(greedy)
    assert seconds > 0 and set(limits.kernels) == set(greedy)
    assert seconds == sum(c * min(limits.kernels[shape].values()) for shape, c in greedy.items())
    assert limits.matmul_seconds(greedy) == seconds  # each shape timed once, then reused


def test_bench_against_a_baseline_runtime_without_torch(exported, tmp_path, capsys) -> None:
    """--baseline-runtime: another runtime (here the same package, so the same hypotheses) timed against
    export.runtime on the same fp32 and INT8 exports, no torch engine, no checkpoint; the fresh-process
    memory probe reports positive peaks without importing torch, next to the graphs' weight bytes."""
    fp32, manifest = exported("transformer")
    int8, _ = exported("transformer", "keep_heads=2", "quantize=true")
    runtime_file = (REPO / "export" / "runtime").resolve()
    report_path = tmp_path / "bench.json"
    speed.main(
        [
            *("--export", str(fp32), "--int8-export", str(int8), "--baseline-runtime", str(runtime_file)),
            *("--no-torch", "--threads", "1", "--repeats", "1", "--modes", "fixed", "--searches", "beam5"),
            *("--batches", "4", "--paper-batch", "4", "--fixed-len", "4", "--json", str(report_path)),
        ]
    )
    text = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    # a package's sha256: that of `sha256sum *.py` run in it
    listing = "".join(
        f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in sorted(runtime_file.glob("*.py"))
    )
    assert report["baseline_runtime"] == {
        "path": str(runtime_file),
        "sha256": hashlib.sha256(listing.encode()).hexdigest(),
    }
    assert report["checkpoint"] is None and report["engines"] == ["ort-baseline", "ort", "int8-baseline", "int8"]
    labels = [p["label"] for p in report["points"]]
    assert labels == ["fixed beam5 batch 4", "headline: fixed beam5 batch 32", "paper: beam 5, batch 4, max len 10"]
    for p in report["points"]:
        assert [(q["engine"], q["baseline"]) for q in p["pairs"]] == [
            ("ort", "ort-baseline"),
            ("int8", "int8-baseline"),
        ]
        for q in p["pairs"]:
            assert q["identical"] == p["sentences"] and math.isfinite(q["ratio"]) and q["ratio"] > 0
    assert report["headline"]["rounds"] >= 3 and report["points"][1]["sentences"] == 64
    assert "headline (fixed beam 5 × batch 32, 4 tokens, median of 3 interleaved rounds): ort/ort-baseline" in text
    memory = report["memory"]
    assert (memory["beam"], memory["batch"], memory["sentences"], memory["fixed_len"]) == (5, 32, 64, 4)
    for kind, out in (("fp32", fp32), ("int8", int8)):
        entry = memory[kind]
        assert set(entry["engines"]) == {"ort", "ort-baseline"}
        for m in entry["engines"].values():
            assert 0 < m["after_load_mb"] <= m["peak_mb"] and m["sentences"] == 64 and not m["torch_imported"]
        w = entry["weights"]
        graphs = json.loads((out / "manifest.json").read_text())["graphs"]
        for graph in ("encoder", "decoder"):
            inits = onnx.load(str(out / graphs[graph]["file"])).graph.initializer
            assert w[f"{graph}_bytes"] == sum(numpy_helper.to_array(t).nbytes for t in inits) > 0
        assert w["graph_bytes"] == w["encoder_bytes"] + w["decoder_bytes"]
    assert memory["fp32"]["weights"]["unique_params"] == manifest["size"]["after"]["params"]
    assert memory["fp32"]["weights"]["unique_param_bytes_fp32"] == 4 * manifest["size"]["after"]["params"]
    assert memory["int8"]["weights"]["graph_bytes"] < memory["fp32"]["weights"]["graph_bytes"]
    assert "memory (fresh process, beam 5 × batch 32, fixed 4): fp32 ort peak " in text
    assert "memory (fresh process, beam 5 × batch 32, fixed 4): int8 ort peak " in text


def test_bench_refuses_a_baseline_export_of_another_checkpoint(exported, capsys) -> None:
    """--baseline-export (the export a baseline runtime of an older export format reads) must encode the same
    checkpoint as --export, or the ratios compare two models: one `error:` line naming the fix, before timing."""
    fp32, _ = exported("transformer")
    other, _ = exported("mgk_4head")
    runtime_file = REPO / "export" / "runtime"
    with pytest.raises(SystemExit) as exc:
        speed.main(
            [
                *("--export", str(fp32), "--no-torch", "--baseline-runtime", str(runtime_file)),
                *("--baseline-export", str(other)),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "was exported from another checkpoint" in err and "with the baseline's commit" in err, err


def test_bench_refuses_a_missing_or_foreign_baseline_runtime(tmp_path, capsys) -> None:
    """A bad --baseline-runtime is one `error:` line naming the fix, before anything is loaded."""
    not_runtime = tmp_path / "other.py"
    not_runtime.write_text("x = 1\n")
    cases = [
        (tmp_path / "missing.py", "no such file"),
        (tmp_path, "no export/runtime.py or runtime.py in that directory"),
        (not_runtime, "does not define load() and Search"),
    ]
    for path, message in cases:
        with pytest.raises(SystemExit) as exc:
            speed.main(["--export", str(tmp_path / "export"), "--no-torch", "--baseline-runtime", str(path)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert message in err and "export/runtime.py" in err, err
    checkout = tmp_path / "checkout"  # what `git worktree add /tmp/checkout <commit>` leaves
    (checkout / "export").mkdir(parents=True)
    shutil.copytree(REPO / "export" / "runtime", checkout / "export" / "runtime")
    assert speed.resolve_runtime(checkout) == (checkout / "export" / "runtime").resolve()
    path, module = speed.load_baseline_runtime(checkout / "export")
    assert path == (checkout / "export" / "runtime").resolve() and module.load is not rt.load
    old = tmp_path / "old" / "export"  # a commit from before the package: one export/runtime.py
    old.mkdir(parents=True)
    (old / "runtime.py").write_text("class Search: ...\n\n\ndef load(directory): ...\n")
    assert speed.load_baseline_runtime(old.parent)[0] == (old / "runtime.py").resolve()
    with pytest.raises(SystemExit) as exc:  # torch compared without a checkpoint
        speed.main(["--export", str(tmp_path / "export")])
    assert exc.value.code == 2 and "--checkpoint is required unless --no-torch" in capsys.readouterr().err


def test_latency_percentiles_are_numpys_linear_order_statistics() -> None:
    assert points.latency_percentiles([0.1 * i for i in range(1, 11)]) == pytest.approx(
        {"p50": 0.55, "p90": 0.91, "n": 10}
    )


def test_batch1_points_store_per_sentence_latency_and_the_table_renders_it(exported) -> None:
    """At batch 1 every generate call is one sentence: the point stores p50 / p90 of those calls over the timed
    rounds (the warm-up round left out), which `--latency` renders; a point of larger batches stores none."""
    fp32, _ = exported("transformer")
    model = rt.load(fp32, threads=1)
    texts = json.loads((fp32 / "heldout.json").read_text())["src"][:3]
    singles = [padded(model.encode_texts([t]), model.pad_id) for t in texts]
    search = points.searches("greedy", 4)
    point = points.bench_point("fixed greedy batch 1", {"ort": ("ort", model)}, singles, search, repeats=2)
    entry = point["engines"]["ort"]
    latency = entry["latency_s"]
    assert latency["n"] == 6 and 0 < latency["p50"] <= latency["p90"] <= max(entry["times_s"])
    batched = points.bench_point(
        "fixed greedy batch 3", {"ort": ("ort", model)}, [padded(model.encode_texts(texts), model.pad_id)], search, 1
    )
    assert "latency_s" not in batched["engines"]["ort"]
    report = {"machine": {}, "threads": 1, "repeats": 2, "points": [point, batched]}
    row = (
        f"| fixed greedy batch 1 | ort | {entry['sentences_per_s']:.1f} | {1e3 * latency['p50']:.1f} | "
        f"{1e3 * latency['p90']:.1f} | 6 |"
    )
    assert row in bench_table.render_latency(report, "r.json")
    with pytest.raises(ValueError, match="no batch-1 point"):
        bench_table.render_latency({**report, "points": [batched]}, "r.json")


def test_ort_spinning_takes_the_runtimes_choices_and_names_them_otherwise(capsys) -> None:
    assert speed.spinning_choice("both") is True and speed.spinning_choice("decoder") == "decoder"
    assert speed.spinning_choice("false") is False and speed.spinning_choice("auto") == "auto"
    with pytest.raises(SystemExit):
        speed.main(["--export", "unused", "--ort-spinning", "sometimes"])
    assert "'sometimes': give auto, both, decoder or false" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        speed.main(["--export", "unused", "--ort-spinning", "shared"])
    assert "time it against the others in fresh processes: python -m export.bench.spin_pairs" in capsys.readouterr().err
