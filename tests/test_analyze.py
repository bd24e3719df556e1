"""Attention-map rank analysis (zoo.analyze): pure functions on constructed matrices, and one
end-to-end `python -m zoo.analyze` run on a smoke-trained checkpoint."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch

from tests.zoo_testing import REPO, random_batch, tiny_model
from zoo.analyze import (
    collect_maps,
    crop_maps,
    cumulative_singular_values,
    matrix_ranks,
    module_kind,
    rank_histogram,
    resample_curve,
    singular_values,
    summarise_maps,
)


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
    low = (torch.randn(2, 6, 1, generator=g) @ torch.randn(2, 1, 6, generator=g))  # two rank-1 heads [2, 6, 6]
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
    enc, dec_self, cross = (maps[n][0] for n in ("encoder.layers.0.self_attn", "decoder.layers.0.self_attn",
                                                 "decoder.layers.0.cross_attn"))
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
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "attention-map ranks" in proc.stdout and "encoder.layers.0.self_attn" in proc.stdout
    result = json.loads((out / "analysis.json").read_text())
    assert (out / "ranks.png").stat().st_size > 1000 and (out / "singular_values.png").stat().st_size > 1000
    assert result["sentences"] == 12 and result["entry"] == "transformer" and not result["skipped"]
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
    bad = subprocess.run([sys.executable, "-m", "zoo.analyze", f"checkpoint={tmp_path / 'nope'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
