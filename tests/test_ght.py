"""GHT / GHT-PS: k-means, the group-constraint loss, compactness metrics, Voting-to-Stay, stage
transitions, resume and the ablation switches."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import smoke_overrides
from tests.zoo_testing import REPO, compose_train
from zoo.checkpoint import CheckpointPayload, load_checkpoint
from zoo.ght.constraint import dunn_index, group_constraint_loss, homogeneity_diversity, silhouette
from zoo.ght.kmeans import canonical_labels, kmeans, reseed_empty_groups
from zoo.ght.voting import fixed_groups, head_votes, nearest_heads, select_heads
from zoo.train import train


def _blobs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """8 points in 3 well-separated groups, interleaved so the grouping is not just index order."""
    g = torch.Generator().manual_seed(seed)
    truth = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    centres = torch.tensor([[10.0, 0, 0, 0], [0, 10.0, 0, 0], [0, 0, 10.0, 0]])
    return centres[truth] + 0.3 * torch.randn(8, 4, generator=g), truth


def test_kmeans_recovers_known_grouping_deterministically() -> None:
    points, truth = _blobs()
    for seed in range(5):
        res = kmeans(points, 3, seed=seed)
        assert torch.equal(res.labels, canonical_labels(truth))
    a, b = kmeans(points, 3, seed=7), kmeans(points, 3, seed=7)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.centres, b.centres)
    warm = kmeans(points, 3, init_labels=truth)
    assert torch.equal(warm.labels, canonical_labels(truth))


def _canonical_reference(labels: list[int]) -> list[int]:
    """Groups renumbered in order of first appearance, written as a loop."""
    mapping: dict[int, int] = {}
    return [mapping.setdefault(g, len(mapping)) for g in labels]


def _reseed_reference(new: torch.Tensor, dist: torch.Tensor, k: int) -> torch.Tensor:
    """Each empty group, in order, takes the point farthest from its centre among groups of ≥ 2 members."""
    new = new.clone()
    counts = torch.bincount(new, minlength=k)
    for empty in (counts == 0).nonzero().flatten().tolist():
        own = dist.gather(1, new[:, None]).squeeze(1)
        movable = counts[new] > 1
        if not movable.any():
            break
        far = int(torch.where(movable, own, torch.full_like(own, -1.0)).argmax())
        counts[new[far]] -= 1
        new[far] = empty
        counts[empty] = 1
    return new


def test_tensor_only_kmeans_steps_equal_their_loop_references() -> None:
    """The host-sync-free renumbering, empty-group re-seeding and voting equal the loops they replace, and
    testing convergence at iterations 2, 4, 8, 16 (the GPU schedule) gives the labels of testing every one."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        k = int(torch.randint(2, 5, (1,), generator=gen))
        labels = torch.randint(0, k, (8,), generator=gen)
        assert canonical_labels(labels, k).tolist() == _canonical_reference(labels.tolist())
        dist = torch.rand(8, k, generator=gen)
        new = torch.randint(0, max(k - 2, 1), (8,), generator=gen)  # some groups empty
        assert torch.equal(reseed_empty_groups(new, dist, k), _reseed_reference(new, dist, k))
        points = torch.randn(8, 6, generator=gen)
        every = kmeans(points, k, iters=20, seed=3, test_every_iteration=True)
        sparse = kmeans(points, k, iters=20, seed=3, test_every_iteration=False)
        assert torch.equal(every.labels, sparse.labels) and torch.equal(every.centres, sparse.centres)
        groups = fixed_groups(points, every.labels.tolist(), k)
        expected = torch.zeros(8)
        for h in nearest_heads(points, groups):
            expected[h] += 1
        assert torch.equal(head_votes(points, groups), expected)
    assert reseed_empty_groups(torch.zeros(8, dtype=torch.long), torch.rand(8, 3), 3).bincount().tolist() == [6, 1, 1]


def test_a_batch_of_modules_clusters_and_constrains_as_each_module_alone() -> None:
    """[M, H, F] points (the modules of one shape, batched so a GPU launches one set of kernels for them) give each
    module the labels, centres, loss terms and Voting-to-Stay votes it gets alone — warm-started and from
    k-means++."""
    gen = torch.Generator().manual_seed(1)
    points = torch.randn(5, 8, 12, generator=gen)
    points[2] = points[2, :1] + 0.01 * points[2]  # one module whose heads nearly coincide
    previous = torch.randint(0, 3, (5, 8), generator=gen)
    for init in (None, previous):
        batch = kmeans(points, 3, iters=20, seed=4, init_labels=init)
        for i in range(5):
            alone = kmeans(points[i], 3, iters=20, seed=4, init_labels=None if init is None else init[i])
            assert torch.equal(batch.labels[i], alone.labels)
            assert torch.allclose(batch.centres[i], alone.centres, atol=1e-6)
            assert torch.allclose(batch.inertia[i], alone.inertia, rtol=1e-5)
    loss, hom, div = group_constraint_loss(points, batch.labels, 3, alpha=0.7, beta=0.5)
    assert loss.shape == hom.shape == div.shape == (5,)
    for i in range(5):
        alone = group_constraint_loss(points[i], batch.labels[i], 3, alpha=0.7, beta=0.5)
        assert all(torch.allclose(a, b[i], atol=1e-6) for a, b in zip(alone, (loss, hom, div), strict=True))
    votes = head_votes(points, fixed_groups(points, previous, 3))  # [M, H]; module 2's heads nearly tie
    assert votes.shape == (5, 8)
    for i in range(5):
        assert torch.equal(votes[i], head_votes(points[i], fixed_groups(points[i], previous[i].tolist(), 3)))


def test_group_constraint_gradient_steps_move_the_right_way() -> None:
    """Minimising the loss raises intra-group cosine and lowers inter-group cosine."""
    torch.manual_seed(0)
    points = torch.randn(8, 16, requires_grad=True)
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    hom0, div0 = (float(v) for v in homogeneity_diversity(points.detach(), labels, 2))
    opt = torch.optim.SGD([points], lr=0.5)
    for _ in range(50):
        loss, _, _ = group_constraint_loss(points, labels, 2, alpha=1.0, beta=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    hom1, div1 = (float(v) for v in homogeneity_diversity(points.detach(), labels, 2))
    assert hom1 > hom0 + 0.1
    assert div1 < div0 - 0.1
    # and the sign convention itself: loss = −α·hom + β·div
    loss, hom, div = group_constraint_loss(points.detach(), labels, 2, alpha=0.3, beta=0.7)
    assert torch.isclose(loss, -0.3 * hom + 0.7 * div)


def _official_constraint(
    points: dict[str, torch.Tensor], labels: dict[str, list[int]], groups: int, alpha: float, beta: float
) -> float:
    """The official criterion's structure (`add_cluster_loss` in SenticNet/GHA's head_cluster_loss.py), written
    from the formula with plain loops: for every constrained module, −α·cos(head i, its centre)/H for each head
    and +β·cos(c_i, c_j)/C(C,2) for each pair of centres, all added into one running sum."""
    import math

    regu = 0.0
    for name, p in points.items():
        p = p.detach().double()
        heads = p.shape[0]
        centres = [p[[h for h in range(heads) if labels[name][h] == g]].mean(0) for g in range(groups)]
        for i in range(heads):
            c = centres[labels[name][i]]
            regu -= alpha * float(p[i] @ c / (p[i].norm() * c.norm())) / heads
        for i in range(groups):
            for j in range(i + 1, groups):
                a, b = centres[i], centres[j]
                regu += beta * float(a @ b / (a.norm() * b.norm())) / math.comb(groups, 2)
    return regu


def test_token_sum_is_the_official_scale_summed_over_modules_per_target_token() -> None:
    """`token_sum` = the official criterion: every module's terms in one sum, divided by the batch's target
    tokens (fairseq's sample_size). The old code averaged over modules first: 3× too weak here (3 modules)."""
    from zoo.data.batching import collate
    from zoo.ght.options import GHTOptions
    from zoo.ght.procedure import GHTProcedure

    model = _tiny_ght_model()
    pairs = [([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14, 15, 16, 17, 18])]
    batch = collate(pairs, 0, 1, 2)
    assert batch.ntokens == 10
    losses = {}
    for norm in ("mean", "token_sum"):
        proc = GHTProcedure(GHTOptions(groups=2, alpha=0.7, beta=0.5, loss_normalization=norm))
        proc.modules = dict(model.attention_modules())
        assert len(proc.modules) == 3
        proc._set_capture(True)
        model(batch.src, batch.tgt_in)
        points = proc._points(proc._masks(batch, 0))
        losses[norm], logs = proc.aux_loss(SimpleNamespace(bare=model), batch)  # the hook reads trainer.bare only
        labels = {name: v.tolist() for name, v in proc.labels.items()}
        assert all(len(set(v)) == 2 for v in labels.values())  # both groups populated
        official = _official_constraint(points, labels, 2, 0.7, 0.5)
        assert logs["gc_loss"] == pytest.approx(official / 3, rel=1e-5)  # logged per module either way
    assert float(losses["token_sum"].detach()) == pytest.approx(official / 10, rel=1e-5)
    assert float(losses["mean"].detach()) == pytest.approx(official / 3, rel=1e-5)
    with pytest.raises(ValueError, match="loss_normalization"):
        GHTOptions.from_config({"loss_normalization": "sum"})


def _tiny_ght_model():
    from zoo.model import ModelConfig, build_model

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        num_heads=4,
        ffn_dim=48,
        dropout=0.0,
        max_positions=32,
    )
    return build_model(cfg).eval()


def test_constraint_scale_multiplies_the_normalised_weight() -> None:
    """The scan's axis: ×s on `token_sum`'s weight is s × the official term; the logged terms do not change."""
    from zoo.data.batching import collate
    from zoo.ght.options import GHTOptions
    from zoo.ght.procedure import GHTProcedure

    model = _tiny_ght_model()
    batch = collate([([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14, 15, 16, 17, 18])], 0, 1, 2)
    out = {}
    for scale in (1.0, 16.0):
        proc = GHTProcedure(GHTOptions(groups=2, alpha=0.7, beta=0.5, constraint_scale=scale))
        proc.modules = dict(model.attention_modules())
        proc._set_capture(True)
        model(batch.src, batch.tgt_in)
        out[scale] = proc.aux_loss(SimpleNamespace(bare=model), batch)
    assert float(out[16.0][0].detach()) == pytest.approx(16 * float(out[1.0][0].detach()), rel=1e-6)
    assert out[16.0][1] == out[1.0][1]
    for bad in ({"constraint_scale": 0}, {"vote_trigger": "silhouette"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GHTOptions.from_config(bad)


def test_centres_pass_the_constraint_gradient_to_every_member() -> None:
    """As the official kmeans_pytorch allows, the centres are means of the members *with* gradient: the
    gradient of −α·mean cos(x_i, c_g(i)) reaches x_i through c_g(i) too, so it differs from the same loss with
    the centres detached (checked against autograd of the formula written out with either)."""
    torch.manual_seed(3)
    points = torch.randn(6, 5, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1, 1, 0])
    loss, _, _ = group_constraint_loss(points, labels, 2, alpha=0.7, beta=0.0)
    (ours,) = torch.autograd.grad(loss, points)

    def formula(detached: bool) -> torch.Tensor:
        x = points
        cents = [x[labels == g].mean(0) for g in range(2)]
        cents = [c.detach() for c in cents] if detached else cents
        cos = [torch.nn.functional.cosine_similarity(x[i], cents[int(labels[i])], dim=0) for i in range(6)]
        return -0.7 * torch.stack(cos).mean()

    (through,) = torch.autograd.grad(formula(False), points)
    (detached,) = torch.autograd.grad(formula(True), points)
    assert torch.allclose(ours, through, atol=1e-6)
    assert not torch.allclose(ours, detached, atol=1e-4)


def test_fixed_heads_init_clusters_as_the_official_call_whatever_came_before() -> None:
    """kmeans_init=fixed_heads: every update starts Lloyd from the points of the same C heads (numpy's choice under
    seed 0, [6, 2] for 8 heads and 2 groups) — the previous partition plays no part, unlike the warm start."""
    from zoo.ght.options import GHTOptions
    from zoo.ght.procedure import GHTProcedure, official_init_heads

    assert official_init_heads(8, 2) == [6, 2]
    torch.manual_seed(1)
    points = torch.randn(3, 8, 16)  # [M, H, F]
    proc = GHTProcedure(GHTOptions(groups=2, kmeans_init="fixed_heads"))
    previous = torch.tensor([[0, 1] * 4] * 3)
    labels = proc._cluster_training(points, previous)
    assert torch.equal(labels, proc._cluster_training(points, None))  # the previous groups do not matter
    for m in range(3):  # Lloyd from points 6 and 2, written out
        centres = points[m, [6, 2]]
        for _ in range(50):
            assign = torch.cdist(points[m], centres).argmin(1)
            centres = torch.stack([points[m][assign == g].mean(0) for g in range(2)])
        assert torch.equal(canonical_labels(labels[m]), canonical_labels(assign))
    with pytest.raises(ValueError, match="kmeans_init"):
        GHTOptions.from_config({"kmeans_init": "random"})


def test_probe_measures_the_partition_the_loss_trained(tmp_path) -> None:
    """The probe's compactness is that of the trained partition (the groups the loss used at the last update),
    computed on the probe batch's maps — equal to a direct computation from the captured maps and those labels;
    the probe batch's own k-means stays a second, labelled view, and the check records the update's
    gc_homogeneity / gc_diversity and how often the trained partition changed since the last check."""
    from zoo.data.batching import collate
    from zoo.ght.features import head_points
    from zoo.ght.options import GHTOptions
    from zoo.ght.procedure import GHTProcedure

    model = _tiny_ght_model()
    train_batch = collate([([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14, 15, 16, 17, 18])], 0, 1, 2)
    valid = [([20, 21, 22], [23, 24]), ([25, 26, 27, 28, 29], [30, 31, 32])]
    tok = SimpleNamespace(pad_id=0, bos_id=1, eos_id=2)
    trainer = SimpleNamespace(
        bare=model, tokenizer=tok, valid_pairs=valid, device=torch.device("cpu"), run_dir=tmp_path
    )
    proc = GHTProcedure(GHTOptions(groups=2, alpha=0.7, beta=0.5, probe_sentences=2, feature_map="V"))
    proc.modules = dict(model.attention_modules())
    first = proc._probe(trainer)  # before any update: no trained partition yet, and it says so
    assert all(m["partition"].startswith("probe") for m in first["modules"].values())
    logs = []
    for _ in range(3):
        proc._set_capture(True)
        model(train_batch.src, train_batch.tgt_in)
        _, logged = proc.aux_loss(trainer, train_batch)
        logs.append(logged)
        proc.step += 1
    report = proc._probe(trainer)

    probe_batch = collate(valid, 0, 1, 2)
    proc._set_capture(True)
    model(probe_batch.src, probe_batch.tgt_in)
    masks = {"src": probe_batch.src.ne(0), "tgt": probe_batch.tgt_out.ne(0)}
    for name, module in proc.modules.items():
        q, k = ("src", "src") if name.startswith("encoder") else ("tgt", "src" if "cross" in name else "tgt")
        x = head_points(module, "V", masks[q], masks[k]).detach().float()  # [H, F]
        trained = proc.labels[name]
        row = report["modules"][name]
        assert row["partition"] == "trained" and row["groups"] == trained.tolist()
        centres = {g: x[trained == g].mean(0) for g in trained.unique().tolist()}
        intra = torch.stack(
            [torch.nn.functional.cosine_similarity(x[i], centres[int(trained[i])], dim=0) for i in range(4)]
        )
        assert row["intra_cos"] == pytest.approx(float(intra.mean()), abs=1e-4)
        assert row["silhouette"] == pytest.approx(silhouette(x, trained), abs=1e-4)
        assert row["changes"] == 0  # one batch, warm-started: the partition stays
        assert set(row["probe"]) == {"groups", "intra_cos", "inter_cos", "silhouette"}
    mean_hom = sum(r["gc_homogeneity"] for r in report["modules"].values()) / len(report["modules"])
    assert mean_hom == pytest.approx(sum(logged["gc_homogeneity"] for logged in logs) / 3, abs=1e-3)
    lines = (tmp_path / "ght" / "compactness.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 3]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"selection": "random"}, "random_in_group"),
        ({"selection": "best"}, "selection"),
        ({"vote_maps": []}, "vote_maps"),
        ({"vote_maps": ["V", "Q"]}, "vote_maps"),
        ({"vote_batches": -1}, "vote_batches"),
    ],
)
def test_bad_voting_options_are_refused_with_the_fix(option, message) -> None:
    from zoo.ght.options import GHTOptions

    with pytest.raises(ValueError, match=message):
        GHTOptions.from_config(option)


def test_compactness_metrics_on_constructed_groups() -> None:
    points = torch.tensor([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]])
    labels = torch.tensor([0, 0, 1, 1])
    # silhouette: a = 1, b = mean(10, √101) for every point
    b = (10 + 101**0.5) / 2
    assert silhouette(points, labels) == pytest.approx((b - 1) / b, rel=1e-5)
    assert dunn_index(points, labels) == pytest.approx(10.0, rel=1e-5)  # min inter 10 / max diameter 1
    assert silhouette(points, torch.tensor([0, 1, 0, 1])) < 0  # a bad grouping scores negative


def test_voting_rules_on_known_nearest_heads() -> None:
    points, _ = _blobs()
    res = kmeans(points, 3, seed=0)
    centres = res.centres
    expected = []
    for g in range(3):
        members = (res.labels == g).nonzero().flatten()
        expected.append(int(members[(points[members] - centres[g]).norm(dim=1).argmin()]))
    assert nearest_heads(points, res) == expected
    votes = [5, 2, 7, 5, 9, 0, 1, 9]
    groups = [0, 1, 2, 0, 1, 2, 0, 1]
    assert select_heads(votes, groups, 3, "per_group") == [0, 2, 4]  # tie 0/3 → lower index; 4/7 → 4
    assert select_heads(votes, groups, 3, "top_c") == [2, 4, 7]
    rnd = select_heads(votes, groups, 3, "random_in_group", seed=1)  # the paper's "w/o PS stay"
    assert rnd == select_heads(votes, groups, 3, "random_in_group", seed=1) and len(rnd) == 3
    assert sorted({groups[h] for h in rnd}) == [0, 1, 2]  # one head per group
    # the paper's "w/o HUDS": as many heads kept, drawn ignoring the groups (over seeds, some draw misses a group)
    draws = [select_heads(votes, groups, 3, "random_heads", seed=s) for s in range(20)]
    assert all(len(d) == 3 == len(set(d)) for d in draws)
    assert any(len({groups[h] for h in d}) < 3 for d in draws)
    with pytest.raises(ValueError, match="random_in_group"):
        select_heads(votes, groups, 3, "random")


def test_fixed_groups_give_each_group_its_mean_as_centre() -> None:
    points, truth = _blobs()
    labels = [int(v) for v in truth]
    res = fixed_groups(points, labels, 3)
    assert res.labels.tolist() == labels
    for g in range(3):
        assert torch.allclose(res.centres[g], points[truth == g].mean(0))


GHT_FAST = [
    "trainer.max_updates=30",
    "trainer.validate_every=10",
    "model.ght.check_every=10",
    "model.ght.vote_batches=6",
    "model.ght.vote_at=12",
    "evaluate_test=false",
]


def _ckpt(path: Path) -> CheckpointPayload:
    return load_checkpoint(path)


@pytest.fixture(scope="module")
def ght_ps_fast(tmp_path_factory, smoke_corpus) -> dict:
    """The summary of one GHT_FAST GHT-PS run, trained in this process: inspected stage by stage below, and the
    uninterrupted reference the killed-and-resumed run must equal bit for bit."""
    return train(compose_train(smoke_overrides("ght_ps", smoke_corpus, tmp_path_factory.mktemp("ght_fast")) + GHT_FAST))


def test_ght_ps_runs_all_stages_and_freezes_pruned_heads(ght_ps_fast) -> None:
    summary = ght_ps_fast
    run = Path(summary["run_dir"])
    plan = summary["head_plan"]
    assert plan and all(len(heads) == 2 for heads in plan.values())  # C = 2 → one head per group
    assert summary["pruned_size"]["params"] < summary["size"]["params"]
    votes = json.loads((run / "ght" / "votes.json").read_text())
    assert votes["plan"] == plan and (run / "ght" / "votes.png").is_file()
    # Algorithm 1: each voting batch casts, per module and per map (V, A, O), one vote per group
    assert votes["vote_maps"] == ["V", "A", "O"] and votes["voting_batches"] == 6
    assert all(sum(v) == 6 * 3 * 2 for v in votes["votes"].values())
    assert votes["trigger"] == "reached vote_at=12" and votes["voting_seconds"] > 0
    checks = [json.loads(line) for line in (run / "ght" / "compactness.jsonl").read_text().splitlines()]
    assert len(checks) >= 2
    # the record holds the trained partition at every check after update 0, and that partition voted
    for check in checks[1:]:
        for row in check["modules"].values():
            assert row["partition"] == "trained" and {"groups", "changes", "gc_homogeneity", "probe"} <= set(row)
    assert votes["groups_source"] == "trained"
    assert votes["final_groups"] == {name: row["groups"] for name, row in checks[-1]["modules"].items()}
    voted, last = _ckpt(run / "checkpoints" / "voted.pt"), _ckpt(run / "checkpoints" / "last.pt")
    assert last["model_config"]["head_plan"] == plan and not last["model_config"]["heads_removed"]
    assert last["train_state"]["step"] == 30 and last["procedure"]["stage"] == "finetune"
    for name, kept in plan.items():
        gate = last["model"][f"{name}.head_gate"]
        assert gate.tolist() == [1.0 if h in kept else 0.0 for h in range(8)]
        dh = last["model"][f"{name}.q_proj.weight"].shape[0] // 8
        dropped = [h for h in range(8) if h not in kept]
        for key in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
            for h in dropped:
                sl = slice(h * dh, (h + 1) * dh)
                assert torch.equal(voted["model"][f"{name}.{key}"][sl], last["model"][f"{name}.{key}"][sl])
        kept_rows = slice(kept[0] * dh, (kept[0] + 1) * dh)
        assert not torch.equal(
            voted["model"][f"{name}.q_proj.weight"][kept_rows], last["model"][f"{name}.q_proj.weight"][kept_rows]
        )  # kept heads still train


def test_ght_ps_resume_across_stage_boundary_is_exact(ght_ps_fast, tmp_path, smoke_corpus) -> None:
    reference = Path(ght_ps_fast["run_dir"])
    root = tmp_path / "b"
    cmd = [sys.executable, "-m", "zoo.train", *smoke_overrides("ght_ps", smoke_corpus, root), *GHT_FAST]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not list(root.glob("*/*/checkpoints/last.pt")):
        time.sleep(0.02)
    assert proc.poll() is None, "finished before it could be killed"
    proc.kill()
    proc.wait()
    run = next(p for p in root.glob("*/*") if p.is_dir())
    assert _ckpt(run / "checkpoints" / "last.pt")["procedure"]["stage"] == "gct"  # killed before voting
    done = subprocess.run(cmd + ["resume=latest"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    a, b = _ckpt(reference / "checkpoints" / "last.pt"), _ckpt(run / "checkpoints" / "last.pt")
    assert a["model_config"]["head_plan"] == b["model_config"]["head_plan"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# the vote at a probe and validation update, after one validation (best.pt) and with the pre-vote interval
# checkpoint among those the end averages: every piece of state the branch point must carry is exercised
BRANCHED = [
    "trainer.max_updates=30",
    "trainer.validate_every=10",
    "trainer.average_last=3",
    "model.ght.check_every=10",
    "model.ght.vote_at=20",
    "evaluate_test=false",
]
GHT_AS_GHT_PS = ["model.ght.alpha=0.5", "model.ght.beta=0.7", "model.ght.feature_map=O"]  # ght_ps.yaml's GCT options


@pytest.fixture(scope="module")
def ght_at_ps_options(tmp_path_factory, smoke_corpus) -> Path:
    """A GHT run with GHT-PS's GCT options, past the update where that GHT-PS votes (its branch point)."""
    root = tmp_path_factory.mktemp("ght_branch")
    return Path(train(compose_train(smoke_overrides("ght", smoke_corpus, root) + BRANCHED + GHT_AS_GHT_PS))["run_dir"])


def test_ght_ps_branched_from_a_ght_run_equals_ght_ps_trained_from_scratch(ght_at_ps_options, tmp_path, smoke_corpus):
    """Issue 85: GHT-PS's first vote_at of updates are GHT's, so a GHT-PS started at a GHT run's branch point must
    be the GHT-PS trained from scratch, bit for bit: the head plan, every checkpoint's weights, and every validation
    row of metrics.csv (the vote falls on a probe and validation update here)."""
    scratch = train(compose_train(smoke_overrides("ght_ps", smoke_corpus, tmp_path / "scratch") + BRANCHED))
    branch = f"branch_from={ght_at_ps_options}"
    branched = train(compose_train([*smoke_overrides("ght_ps", smoke_corpus, tmp_path / "branch"), *BRANCHED, branch]))
    assert branched["head_plan"] == scratch["head_plan"] and branched["updates"] == scratch["updates"] == 30
    a, b = Path(scratch["run_dir"]) / "checkpoints", Path(branched["run_dir"]) / "checkpoints"
    files = sorted(p.name for p in a.glob("*.pt"))
    assert files == sorted(p.name for p in b.glob("*.pt")) and {"avg.pt", "best.pt", "voted.pt"} <= set(files)
    for name in files:
        x, y = _ckpt(a / name), _ckpt(b / name)
        assert all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"]), name

    def validations(run: dict) -> list[tuple[str, str]]:
        rows = (Path(run["run_dir"]) / "metrics.csv").read_text().splitlines()
        header = rows[0].split(",")
        at = header.index("valid_loss")
        return [(r.split(",")[0], r.split(",")[at]) for r in rows[1:] if r.split(",")[at]]

    assert validations(branched) == validations(scratch) and len(validations(scratch)) == 3


def test_branch_from_refuses_a_ght_run_of_other_settings(ght_at_ps_options, tmp_path, smoke_corpus) -> None:
    from zoo.train import UsageError

    overrides = smoke_overrides("ght_ps", smoke_corpus, tmp_path) + BRANCHED + [f"branch_from={ght_at_ps_options}"]
    with pytest.raises(UsageError, match=r"model\.ght\.beta: 0\.7 there, 0\.5 here"):
        train(compose_train([*overrides, "model.ght.beta=0.5"]))
    with pytest.raises(UsageError, match="not a run directory"):
        train(compose_train([*overrides[:-1], f"branch_from={tmp_path}"]))
    assert not list(tmp_path.glob("*/*/metrics.csv"))  # refused before a run directory was written


def test_init_from_ght_starts_at_voting(tmp_path, smoke_corpus) -> None:
    ght = train(
        compose_train(
            smoke_overrides("ght", smoke_corpus, tmp_path / "ght")
            + ["trainer.max_updates=10", "trainer.validate_every=10", "model.ght.check_every=5", "evaluate_test=false"]
        )
    )
    assert "head_plan" not in ght  # GHT keeps every head
    ps = train(
        compose_train(
            smoke_overrides("ght_ps", smoke_corpus, tmp_path / "ps")
            + [
                f"init_from={ght['run_dir']}",
                "trainer.max_updates=6",
                "trainer.validate_every=3",
                "model.ght.vote_batches=4",
                "evaluate_test=false",
            ]
        )
    )
    run = Path(ps["run_dir"])
    votes = json.loads((run / "ght" / "votes.json").read_text())
    assert votes["step"] == 0  # voted before any fine-tuning update
    assert ps["head_plan"] == votes["plan"]


@pytest.mark.parametrize(
    "ablation",
    [
        "model.ght.diversify=false",
        "model.ght.homogenize=false",
        "model.ght.selection=random_in_group",
        "model.ght.selection=random_heads",
        "model.ght.selection=top_c",
        "model.ght.vote_maps=[O]",
    ],
)
def test_ablation_switches_run(tmp_path, smoke_corpus, ablation: str) -> None:
    summary = train(
        compose_train(
            smoke_overrides("ght_ps", smoke_corpus, tmp_path)
            + [
                "trainer.max_updates=8",
                "trainer.validate_every=4",
                "model.ght.vote_at=4",
                "model.ght.vote_batches=3",
                "model.ght.check_every=4",
                "evaluate_test=false",
                ablation,
            ]
        )
    )
    assert all(len(h) == 2 for h in summary["head_plan"].values())


def test_fractional_vote_at_is_a_fraction_of_the_time_budget_too(tmp_path, smoke_corpus) -> None:
    """The CPU preset ends training by max_minutes long before max_updates: GHT-PS must still vote and
    fine-tune rather than stay in group-constrained training to the end."""
    summary = train(
        compose_train(
            smoke_overrides("ght_ps", smoke_corpus, tmp_path)
            + [
                "trainer.max_updates=100000",
                "trainer.max_minutes=0.15",
                "trainer.validate_every=5",
                "model.ght.vote_at=0.5",
                "model.ght.vote_batches=3",
                "model.ght.check_every=1000",
                "model.ght.finetune_patience=0",
                "evaluate_test=false",
            ]
        )
    )
    votes = json.loads((Path(summary["run_dir"]) / "ght" / "votes.json").read_text())
    assert 0 < votes["step"] < summary["updates"]
    assert all(len(h) == 2 for h in summary["head_plan"].values())


def test_hydra_multirun_sweep_over_alpha(tmp_path, smoke_corpus) -> None:
    overrides = smoke_overrides("ght", smoke_corpus, tmp_path) + [
        "trainer.max_updates=2",
        "trainer.validate_every=2",
        "evaluate_test=false",
        "trainer.valid_quality_sentences=2",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.train", "-m", *overrides, "model.ght.alpha=0.3,0.7"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    configs = sorted((tmp_path / "ght-smoke").glob("*/config.yaml"))
    assert len(configs) == 2
    alphas = sorted(float(c.read_text().split("alpha: ")[1].split()[0]) for c in configs)
    assert alphas == [0.3, 0.7]


def test_bad_ght_option_is_a_clear_error(tmp_path, smoke_corpus) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.train", *smoke_overrides("ght", smoke_corpus, tmp_path), "model.ght.feature_map=Q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "feature_map" in proc.stderr
