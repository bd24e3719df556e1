"""Attention rank analysis (zoo.analyze): pure functions on constructed matrices (post-softmax map ranks,
numerical rank of QKᵀ, length buckets), the per-mechanism score capture on tiny models, and end-to-end
`python -m zoo.analyze` runs on smoke-trained checkpoints (one, and several with the QKᵀ overlay)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from tests.zoo_testing import REPO, random_batch, tiny_model
from zoo.analyze import (
    AnalyzeError,
    bucket_ranks,
    checkpoint_locations,
    collect_maps,
    collect_scores,
    crop_maps,
    cumulative_singular_values,
    length_bucket,
    matrix_ranks,
    module_kind,
    numerical_ranks,
    plot_score_ranks,
    plot_sentence_maps,
    rank_histogram,
    resample_curve,
    score_rank_report,
    sentence_maps,
    singular_values,
    summarise_maps,
    summarise_score_ranks,
)
from zoo.analyze.scores import LINEAR_SKIP


def test_ranks_of_constructed_matrices() -> None:
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(9, 2, generator=g), torch.randn(2, 12, generator=g)
    rank2 = u @ v  # [9, 12] of rank 2
    uniform = torch.full((7, 7), 1 / 7)  # every query attends uniformly: rank 1
    causal = torch.ones(6, 6).tril()
    causal = causal / causal.sum(-1, keepdim=True)  # lower-triangular, positive diagonal: full rank
    assert matrix_ranks(rank2).item() == 2
    assert matrix_ranks(uniform).item() == 1
    assert matrix_ranks(torch.eye(5)).item() == 5
    assert matrix_ranks(causal).item() == 6
    assert matrix_ranks(torch.zeros(4, 3)).item() == 0
    # a direction below the threshold does not count
    tiny = torch.diag(torch.tensor([1.0, 0.5, 1e-8], dtype=torch.float64))
    assert matrix_ranks(tiny).item() == 2 and matrix_ranks(tiny, threshold=1e-9).item() == 3
    # batched: [..., n, m] -> [...]
    assert matrix_ranks(torch.stack([torch.eye(4), torch.ones(4, 4)])).tolist() == [4, 1]
    assert singular_values(rank2).shape == (9,)


def test_cumulative_curves() -> None:
    eye = cumulative_singular_values(singular_values(torch.eye(4)))
    assert torch.allclose(eye, torch.tensor([0.25, 0.5, 0.75, 1.0], dtype=torch.float64))
    one = cumulative_singular_values(singular_values(torch.ones(5, 5)))
    assert torch.allclose(one, torch.ones(5, dtype=torch.float64), atol=1e-12)  # all mass in σ_1
    assert torch.equal(cumulative_singular_values(torch.zeros(3, dtype=torch.float64)), torch.ones(3))
    # resampling onto fractions of the singular values: equal σ gives the diagonal at any size
    for n in (3, 4, 7):
        curve = resample_curve(cumulative_singular_values(singular_values(torch.eye(n))), grid=10)
        assert torch.allclose(curve, torch.linspace(0, 1, 11, dtype=torch.float64), atol=1e-12)
    r1 = resample_curve(torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64), grid=4)
    assert r1.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    halfway = resample_curve(torch.tensor([0.5, 1.0], dtype=torch.float64), grid=4)  # k = 0, .5, 1, 1.5, 2
    assert torch.allclose(halfway, torch.tensor([0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64))


def test_summary_histogram_and_cropping() -> None:
    g = torch.Generator().manual_seed(1)
    low = torch.randn(2, 6, 1, generator=g) @ torch.randn(2, 1, 6, generator=g)  # two rank-1 heads [2, 6, 6]
    full = torch.eye(4).expand(2, 4, 4)  # two full-rank heads of size 4
    s = summarise_maps([low, full], threshold=1e-6, grid=4)
    assert s["matrices"] == 4 and s["ranks"] == [1, 1, 4, 4] and s["sizes"] == [6, 6, 4, 4]
    assert s["rank_histogram"] == {1: 2, 4: 2} == rank_histogram([4, 1, 1, 4])
    assert s["mean_rank"] == 2.5 and s["full_rank_fraction"] == 0.5
    assert s["mean_rank_ratio"] == pytest.approx((1 / 6 + 1 / 6 + 1 + 1) / 4)
    expected = (torch.tensor([0, 1, 1, 1, 1.0]) * 2 + torch.tensor([0, 0.25, 0.5, 0.75, 1.0]) * 2) / 4
    assert torch.allclose(torch.tensor(s["curve"], dtype=torch.float64), expected.double(), atol=1e-6)
    assert summarise_maps([])["matrices"] == 0
    attn = torch.arange(2 * 3 * 4 * 5, dtype=torch.float).view(2, 3, 4, 5)  # [B, H, T, S]
    crops = crop_maps(attn, torch.tensor([4, 2]), torch.tensor([5, 3]))
    assert [c.shape for c in crops] == [(3, 4, 5), (3, 2, 3)] and torch.equal(crops[1], attn[1, :, :2, :3])
    assert module_kind("decoder.layers.2.cross_attn") == ("decoder cross-attention", 2)
    assert module_kind("encoder.layers.0.self_attn") == ("encoder self-attention", 0)


def test_collect_maps_crops_padding_and_restores_capture() -> None:
    model = tiny_model("mixhead_b")
    src, tgt = random_batch()  # src row 0 has 2 padding positions
    attn = model.attention_modules()
    attn["encoder.layers.0.self_attn"].capture = ("V",)
    maps = collect_maps(model, [(src, tgt)])
    enc, dec_self, cross = (
        maps[n][0] for n in ("encoder.layers.0.self_attn", "decoder.layers.0.self_attn", "decoder.layers.0.cross_attn")
    )
    assert enc.shape == (8, 5, 5) and dec_self.shape == (8, 6, 6) and cross.shape == (8, 6, 5)
    assert maps["encoder.layers.1.self_attn"][1].shape == (8, 7, 7)
    assert attn["encoder.layers.0.self_attn"].capture == ("V",) and not attn["decoder.layers.0.self_attn"].capture
    assert all(not m.captured for m in attn.values())
    # Mixhead's pre-mixing maps are rows of probabilities; mha modules fall back to "A"
    raw = collect_maps(model, [(src, tgt)], map_name="A_unmixed")["decoder.layers.1.cross_attn"][2]
    assert torch.allclose(raw.sum(-1), torch.ones(8, 6), atol=1e-5)
    plain = collect_maps(tiny_model("transformer"), [(src, tgt)], map_name="A_unmixed")
    assert plain["decoder.layers.1.self_attn"][0].shape == (8, 6, 6)


def test_cli_end_to_end_on_smoke_checkpoint(smoke_run, tmp_path) -> None:
    run_dir = smoke_run("transformer")
    out = tmp_path / "analysis"
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.analyze", f"checkpoint={run_dir}", f"out={out}", "sentences=12", "threads=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "attention-map ranks" in proc.stdout and "encoder.layers.0.self_attn" in proc.stdout
    result = json.loads((out / "analysis.json").read_text())
    assert (out / "ranks.png").stat().st_size > 1000 and (out / "singular_values.png").stat().st_size > 1000
    assert result["sentences"] == 12 and result["entry"] == "transformer" and not result["skipped"]
    # one checkpoint: the QKᵀ rank files sit next to the map analysis, labelled by the entry
    qk = json.loads((out / "qk_rank.json").read_text())
    assert [c["label"] for c in qk["checkpoints"]] == ["transformer"] and (out / "qk_rank.png").is_file()
    names = set(result["modules"])
    assert {"encoder.layers.1.self_attn", "decoder.layers.1.self_attn", "decoder.layers.1.cross_attn"} <= names
    for name, m in result["modules"].items():
        assert m["matrices"] == 12 * m["heads"], name
        assert all(0 < r <= s for r, s in zip(m["ranks"], m["sizes"], strict=True)), name
        assert sum(m["rank_histogram"].values()) == m["matrices"]
        curve = m["curve"]
        assert curve[0] == 0 and abs(curve[-1] - 1) < 1e-9
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(curve))  # non-decreasing
        assert 0.5 - 1e-9 <= m["curve_area"] <= 1
    # missing checkpoint: a clear error, exit code 2
    bad = subprocess.run(
        [sys.executable, "-m", "zoo.analyze", f"checkpoint={tmp_path / 'nope'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr


# ---------------------------------------------------------------------- QKᵀ numerical rank vs n
def test_numerical_rank_of_score_matrices_of_known_rank() -> None:
    g = torch.Generator().manual_seed(2)
    for n, r in ((12, 3), (20, 8), (9, 9), (6, 8)):  # S = Q Kᵀ from n×r factors: rank min(n, r)
        q, k = torch.randn(n, r, generator=g, dtype=torch.float64), torch.randn(n, r, generator=g, dtype=torch.float64)
        assert numerical_ranks(q @ k.T).item() == min(n, r), (n, r)
    full = torch.randn(10, 10, generator=g, dtype=torch.float64)  # a random square matrix is full rank
    assert numerical_ranks(full).item() == 10
    # the tolerance is relative to σ_max: σ = 1, 1e-3, 1e-9 is rank 2 at 1e-6 and rank 3 at 1e-10 ...
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    sigma = torch.tensor([1.0, 1e-3, 1e-9, 0, 0, 0], dtype=torch.float64)
    graded = u @ torch.diag(sigma) @ v.T
    assert numerical_ranks(graded).item() == 2 and numerical_ranks(graded, tol=1e-10).item() == 3
    assert numerical_ranks(graded, tol=1e-2).item() == 1
    # ... and invariant to scale, where an absolute threshold (the post-softmax analysis) is not
    assert numerical_ranks(graded * 1e-7).item() == 2 and matrix_ranks(graded * 1e-7).item() == 0
    assert numerical_ranks(torch.zeros(4, 5)).item() == 0
    batched = torch.stack([torch.eye(5, dtype=torch.float64), torch.ones(5, 5, dtype=torch.float64)])  # [2, 5, 5]
    assert numerical_ranks(batched).tolist() == [5, 1]


def test_length_buckets_and_rank_summary() -> None:
    assert [length_bucket(n, 4) for n in (1, 4, 5, 8, 9)] == [(1, 4), (1, 4), (5, 8), (5, 8), (9, 12)]
    assert length_bucket(7, 1) == (7, 7)
    with pytest.raises(ValueError):
        length_bucket(0, 4)
    # head size 4: n = 3 (bound 3), 5 and 6 (bound 4), 9 (bound 4)
    ns, ranks = [3, 5, 6, 9, 9], [3, 4, 2, 4, 3]
    buckets = bucket_ranks(ns, ranks, [min(n, 4) for n in ns], width=4)
    assert [(b["lo"], b["hi"], b["matrices"]) for b in buckets] == [(1, 4, 1), (5, 8, 2), (9, 12, 2)]
    assert buckets[1]["mean_n"] == 5.5 and buckets[1]["mean_rank"] == 3 and buckets[1]["at_bound_fraction"] == 0.5
    assert buckets[2]["max_rank"] == 4 and buckets[2]["at_bound_fraction"] == 0.5
    s = summarise_score_ranks(ns, ranks, head_dim=4, width=4, min_len=5)
    assert s["matrices"] == 5 and s["mean_rank"] == pytest.approx(16 / 5)
    assert s["at_bound_fraction"] == pytest.approx(3 / 5) and s["above_bound"] == 0
    assert s["long"]["min_len"] == 5 and s["long"]["matrices"] == 4 and s["long"]["at_bound_fraction"] == 0.5
    assert summarise_score_ranks([2], [2], head_dim=4, width=4, min_len=5)["long"] == {"min_len": 5, "matrices": 0}


def test_collect_scores_per_mechanism() -> None:
    src, tgt = random_batch()  # src row 0 has 2 padding positions; tiny models have head size 4
    model = tiny_model("transformer").double()
    attn = model.attention_modules()
    seen: dict[str, torch.Tensor] = {}
    hook = attn["encoder.layers.1.self_attn"].register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    reference = model(src, tgt)
    stacks, skipped = collect_scores(model, [(src, tgt)])
    hook.remove()
    assert not skipped and torch.equal(model(src, tgt), reference)  # the pass changes nothing ...
    assert all("attend" not in m.__dict__ for m in attn.values())  # ... and the shadowed attend is gone
    # the captured scores are the per-head projections' product, cropped to the real tokens
    enc = attn["encoder.layers.1.self_attn"]
    x = seen["x"][0, :5]  # [5, D] real positions of sentence 0
    q = enc.q_proj(x).view(5, 8, 4).transpose(0, 1)  # [H, 5, dh]
    k = enc.k_proj(x).view(5, 8, 4).transpose(0, 1)
    assert torch.allclose(stacks["encoder.layers.1.self_attn"][0], q @ k.transpose(-1, -2), atol=1e-12)
    assert [s.shape for s in stacks["decoder.layers.0.cross_attn"]] == [(8, 6, 5), (8, 6, 7), (8, 6, 7)]
    assert numerical_ranks(stacks["encoder.layers.1.self_attn"][1]).tolist() == [4] * 8  # n = 7 > d_p = 4
    # Mixhead: the scores before mixing; MGK: one product per key component; linear: skipped with the reason
    assert set(collect_scores(tiny_model("mixhead_b").double(), [(src, tgt)])[0]) == set(stacks)
    mgk, none = collect_scores(tiny_model("mgk_4head").double(), [(src, tgt)])
    assert not none and {"encoder.layers.0.self_attn[k0]", "encoder.layers.0.self_attn[k1]"} <= set(mgk)
    assert mgk["encoder.layers.0.self_attn[k1]"][2].shape == (4, 7, 7)
    lin, why = collect_scores(tiny_model("linear_8head").double(), [(src, tgt)])
    assert not lin and set(why.values()) == {LINEAR_SKIP} and len(why) == 6


def test_sentence_maps_and_checkpoint_options() -> None:
    src, tgt = random_batch(b=1)
    model = tiny_model("mixhead_b")
    maps = sentence_maps(model, src, tgt, "decoder.layers.1.cross_attn")
    assert list(maps) == ["A_unmixed", "A"] and maps["A"].shape == (8, 6, 7)
    assert torch.allclose(maps["A_unmixed"].sum(-1), torch.ones(8, 6), atol=1e-5)
    assert all(not m.capture and not m.captured for m in model.attention_modules().values())
    assert list(sentence_maps(tiny_model("mgk_4head"), src, tgt, "encoder.layers.1.self_attn")) == ["A"]
    assert checkpoint_locations(OmegaConf.create({"checkpoint": "a", "checkpoints": None})) == ["a"]
    assert checkpoint_locations(OmegaConf.create({"checkpoint": None, "checkpoints": ["a", "b"]})) == ["a", "b"]
    for bad in ({"checkpoint": None, "checkpoints": None}, {"checkpoint": "a", "checkpoints": ["b"]}):
        with pytest.raises(AnalyzeError):
            checkpoint_locations(OmegaConf.create(bad))


def test_overlay_and_sentence_figures_for_every_mechanism_kind(tmp_path) -> None:
    """The figures in-process on tiny (untrained) models: no training needed for Mixhead / MGK / linear."""
    src, tgt = random_batch()
    reports = []
    for entry in ("mixhead_b", "mgk_4head", "linear_8head"):
        model = tiny_model(entry).double()
        stacks, skipped = collect_scores(model, [(src, tgt)])
        dims = {name: m.head_dim for name, m in model.attention_modules().items()}
        modules, by_kind = score_rank_report(stacks, dims, tol=1e-6, width=2, min_len=5)
        reports.append({"label": entry, "by_kind": by_kind, "skipped_reason": next(iter(skipped.values()), None)})
        for m in modules.values():
            assert all(r <= min(n, 4) for n, rs in zip(m["n"], m["ranks"], strict=True) for r in rs)
    assert not reports[2]["by_kind"] and reports[2]["skipped_reason"] == LINEAR_SKIP
    plot_score_ranks(reports, tmp_path / "qk_rank.png", "tiny models")
    assert (tmp_path / "qk_rank.png").stat().st_size > 1000
    one = random_batch(b=1)
    maps = sentence_maps(tiny_model("mixhead_b"), *one, "encoder.layers.1.self_attn")  # unmixed + mixed blocks
    plot_sentence_maps(maps, [f"s{i}" for i in range(7)], [f"s{i}" for i in range(7)], tmp_path / "maps.png", "mix")
    assert (tmp_path / "maps.png").stat().st_size > 1000


def test_cli_overlay_of_several_checkpoints(smoke_run, tmp_path) -> None:
    """`checkpoints=[…]` on the shared transformer smoke run (its selected checkpoint and last.pt: no extra
    training); the same entry twice is labelled transformer, transformer-2."""
    run = smoke_run("transformer")
    out = tmp_path / "overlay"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zoo.analyze",
            f"checkpoints=[{run},{run / 'checkpoints' / 'last.pt'}]",
            f"out={out}",
            "sentences=12",
            "threads=1",
            "figure_sentence=3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "pre-softmax QKᵀ numerical rank" in proc.stdout
    assert (out / "qk_rank.png").stat().st_size > 1000
    qk = json.loads((out / "qk_rank.json").read_text())
    assert qk["tol"] == 1e-6 and qk["dtype"] == "float64"
    labels = [c["label"] for c in qk["checkpoints"]]
    assert labels == ["transformer", "transformer-2"]
    for label in labels:  # the per-checkpoint outputs, one folder each
        assert (out / label / "analysis.json").is_file() and (out / label / "ranks.png").is_file()
        assert (out / label / "attention_maps_s3_encoder.layers.1.self_attn.png").stat().st_size > 1000
    for c in qk["checkpoints"]:
        dp = c["head_dim"]
        assert dp == 8 and c["min_len"] == dp + 1 and c["sentences"] == 12 and not c["skipped"]
        assert set(c["by_kind"]) == {"encoder self-attention", "decoder self-attention", "decoder cross-attention"}
        for name, m in c["modules"].items():
            assert len(m["n"]) == len(m["ranks"]) == 12, name
            for n, ranks in zip(m["n"], m["ranks"], strict=True):  # never above the bound min(n, d_p)
                assert len(ranks) == m["heads"] and all(0 < r <= min(n, dp) for r in ranks), (name, n, ranks)
            assert m["above_bound"] == 0 and m["matrices"] == 12 * m["heads"]
        enc = c["by_kind"]["encoder self-attention"]
        assert enc["long"]["matrices"] > 0  # the smoke sentences include some longer than the head size
        assert sum(b["matrices"] for b in enc["buckets"]) == enc["matrices"]
