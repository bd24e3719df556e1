"""ONNX export: physical pruning, ORT vs PyTorch parity, torch-free runtime with identical search,
dynamic shapes, head plans from JSON and from importance, bad inputs (DESIGN.md §3b, §6).

Every export here runs with one thread (`runtime.threads=1`): the test machine's two cores are
shared, and torch's OpenMP pool degrades badly when oversubscribed.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from onnx import TensorProto, helper, numpy_helper

import export
from export import bench
from export import graph as export_graph
from export import runtime as rt
from export.exporter import export_checkpoint
from export.graph import CacheSpec, ExportError
from export.pruning import active_heads, head_importance, plan_from_importance, prune, validate_plan
from export.rewrites import (
    consecutive_reshapes_merged,
    drop_multiplications_by_one,
    drop_unread,
    layout_preserving_transposes_to_reshapes,
    outputs_from_their_producers,
)
from export.verify import encode_pairs, graph_parity
from tests.zoo_testing import ENTRIES, REPO, random_batch, tiny_model
from zoo import evaluation
from zoo.attention import HeadPruningUnsupported
from zoo.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint, resolve_checkpoint
from zoo.data import Tokenizer
from zoo.entries import CONF_DIR
from zoo.evaluation import score_ids, translate_texts, translate_texts_nbest
from zoo.generate import Scored, SearchConfig, _max_lengths, generate

PLAN = {
    "decoder.layers.0.self_attn": [1, 6],
    "encoder.layers.1.self_attn": [0, 2, 5],
    "decoder.layers.1.cross_attn": [7],
}  # what plan_for(8) gives: the transformer's plan


# entries whose ORT search is checked against torch's on the smoke test split (one per mechanism family)
BEAM_ENTRIES = ["transformer", "ght_ps", "mgk_4head", "mixhead_b", "fixhead"]


def plan_for(num_heads: int) -> dict[str, list[int]]:
    """A head plan valid for any head count ≥ 4: 2, 3 and 1 kept heads in three different modules."""
    h = num_heads
    return {
        "decoder.layers.0.self_attn": [1, h - 2],
        "encoder.layers.1.self_attn": sorted({0, 2, h - 3}),
        "decoder.layers.1.cross_attn": [h - 1],
    }


def export_config(checkpoint: Path | str, out: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            config_name="export", overrides=[f"checkpoint={checkpoint}", f"out={out}", "runtime.threads=1", *overrides]
        )


def pruning_overrides(run_dir: Path, root: Path) -> tuple[list[str], dict[str, list[int]]]:
    """How every entry is exported in these tests: with a head plan, so physical pruning is exercised
    for every mechanism — the checkpoint's own (GHT-PS), else `plan_for(H)`; mechanisms whose head
    removal is inexact (Mixhead) keep the planned-away heads gated (remove_heads=false)."""
    model = model_from_checkpoint(load_checkpoint(run_dir))
    if model.cfg.head_plan:
        return [], {name: sorted(heads) for name, heads in model.cfg.head_plan.items()}
    plan = plan_for(model.cfg.num_heads)
    path = root / f"plan-{run_dir.parent.name}.json"
    path.write_text(json.dumps(plan))
    overrides = [f"head_plan={path}"]
    try:
        model.attention_modules()["decoder.layers.0.self_attn"].check_head_removal()
    except HeadPruningUnsupported:
        overrides.append("remove_heads=false")
    return overrides, plan


@pytest.fixture(scope="module")
def exported(smoke_run, tmp_path_factory) -> Callable[..., tuple[Path, dict]]:
    """(entry, *overrides) → (export dir, manifest), each done once per module. Without overrides
    the entry is exported with its test head plan (`pruning_overrides`)."""
    root = tmp_path_factory.mktemp("exports")
    done: dict[tuple, tuple[Path, dict]] = {}

    def get(entry: str, *overrides: str) -> tuple[Path, dict]:
        key = (entry, *overrides)
        if key not in done:
            run = smoke_run(entry)
            out = root / f"{entry}-{len(done)}"
            extra = list(overrides) if overrides else pruning_overrides(run, root)[0]
            done[key] = (out, export_checkpoint(export_config(run, out, *extra)))
        return done[key]

    return get


def _heldout_batch(run_dir: Path, n: int = 32) -> tuple[torch.Tensor, list[str], Tokenizer, dict]:
    payload = load_checkpoint(run_dir)
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    texts = payload["heldout"]["src"][:n]
    src_ids, _ = encode_pairs(tok, texts, texts, payload["model_config"]["max_positions"], 8)
    width = max(map(len, src_ids))
    src = torch.zeros(len(src_ids), width, dtype=torch.long)
    for i, row in enumerate(src_ids):
        src[i, : len(row)] = torch.tensor(row)
    return src, texts, tok, payload


def onnx_weights(out: Path) -> list[np.ndarray]:
    """Every initializer of both graphs as an array (cross-attention k/v live in the encoder graph)."""
    return [
        numpy_helper.to_array(init)
        for name in ("encoder.onnx", "decoder.onnx")
        for init in onnx.load(str(out / name)).graph.initializer
    ]


def holds(weights: list[np.ndarray], w: torch.Tensor) -> bool:
    """Whether the graphs hold weight `w` exactly, as stored or transposed (MatMul takes [in, out])."""
    a = w.detach().numpy()
    return any(
        (x.shape == a.shape and np.array_equal(x, a)) or (x.shape == a.T.shape and np.array_equal(x, a.T))
        for x in weights
    )


def assert_removed_heads_absent(out: Path, manifest: dict, payload: dict) -> None:
    """For every pruned module: the graphs hold its sliced q/k/v/out projections (kept heads × head_dim
    rows, resp. columns) and none of the checkpoint's full-width ones — read off the ONNX weights."""
    weights = onnx_weights(out)
    original = model_from_checkpoint(payload).attention_modules()
    pruned = prune(model_from_checkpoint(payload), manifest["head_plan"])[0].attention_modules()
    d = manifest["model_config"]["d_model"]
    for name, kept in manifest["head_plan"].items():
        module, full = pruned[name], original[name]
        width = len(kept) * module.head_dim
        assert module.num_heads == len(kept) < full.num_heads, name
        for proj in ("q_proj", *module.key_projections):
            assert tuple(getattr(module, proj).weight.shape) == (width, d), (name, proj)
            assert holds(weights, getattr(module, proj).weight), f"{name}.{proj}: sliced weight not in the graphs"
            assert not holds(weights, getattr(full, proj).weight), f"{name}.{proj}: full weight still in the graphs"
        assert tuple(module.out_proj.weight.shape) == (d, width)
        assert holds(weights, module.out_proj.weight) and not holds(weights, full.out_proj.weight), name


# ------------------------------------------------------------------------------------------- every entry
@pytest.mark.parametrize("entry", ENTRIES)
def test_export_with_pruning_verifies_for_every_entry(entry: str, exported, smoke_run, tmp_path) -> None:
    out, manifest = exported(entry)
    overrides, plan = pruning_overrides(smoke_run(entry), tmp_path)
    v = manifest["verification"]
    assert v["passed"], v
    assert v["max_abs_logits_diff"] <= 1e-4 and v["pruned_vs_gated"] <= 1e-4
    assert v["beam"]["identical"] == v["beam"]["total"] == v["sentences"]
    assert {f.name for f in out.iterdir()} == {
        "encoder.onnx",
        "decoder.onnx",
        "tokenizer.model",
        "manifest.json",
        "heldout.json",
    }
    removed = "remove_heads=false" not in overrides
    assert manifest["heads_removed"] == removed and manifest["head_plan"] == plan
    num_heads = manifest["model_config"]["num_heads"]
    for name, heads in manifest["heads"].items():
        assert heads["kept"] == plan.get(name, list(range(num_heads)))
        assert heads["num_heads"] == (len(heads["kept"]) if removed else num_heads), name
    if removed:
        assert manifest["size"]["flops_ratio"] < 1 and manifest["size"]["params_ratio"] < 1
        assert_removed_heads_absent(out, manifest, load_checkpoint(smoke_run(entry)))
    # cache tensors follow each layer's own head count; the decoder's ONNX inputs carry the same layout
    decoder = onnx.load(str(out / "decoder.onnx"))
    inputs = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in decoder.graph.input}
    for cache in manifest["caches"]:
        module = f"decoder.layers.{cache['layer']}.{'self_attn' if cache['kind'] == 'self' else 'cross_attn'}"
        # self caches: a row per hypothesis; cross caches: a row per source, shared by its beams
        assert cache["shape"][0] == ("batch" if cache["kind"] == "self" else "sources")
        assert cache["shape"][1] == manifest["heads"][module]["num_heads"], cache
        # growing self caches come as the host's store: [cells·a, b], b the sizes after the position axis
        store = cache["kind"] == "self" and "steps" in cache["shape"]
        after = cache["shape"][cache["shape"].index("steps") + 1 :] if store else []
        expected = [math.prod(after)] if store else cache["shape"][1:]
        assert [d if isinstance(d, int) else None for d in inputs[cache["name"]][1:]] == [
            d if isinstance(d, int) else None for d in expected
        ]
    assert manifest["name"] == f"{manifest['entry']}-smoke" and manifest["entry"] == entry
    assert all(
        isinstance(manifest["graphs"][g][k], int) for g in ("encoder", "decoder") for k in ("opset", "ir_version")
    )


# ------------------------------------------------------------------------------------------- pruning
def test_removed_heads_are_absent_from_the_onnx_weights(exported, smoke_run) -> None:
    out, manifest = exported("transformer")
    d, dh = manifest["model_config"]["d_model"], manifest["heads"]["encoder.layers.0.self_attn"]["head_dim"]
    assert manifest["head_plan"] == PLAN and manifest["head_plan_source"].startswith("json:")
    assert manifest["heads"]["decoder.layers.0.self_attn"]["num_heads"] == 2
    shapes = [x.shape for x in onnx_weights(out)]
    # a module that kept 2 of 8 heads of size dh has q/k/v of 2·dh rows (stored [d, 2·dh] for MatMul)
    assert (d, 2 * dh) in shapes or (2 * dh, d) in shapes
    assert (d, 3 * dh) in shapes or (3 * dh, d) in shapes
    assert (d, dh) in shapes or (dh, d) in shapes
    assert_removed_heads_absent(out, manifest, load_checkpoint(smoke_run("transformer")))
    caches = {c["name"]: c["shape"] for c in manifest["caches"]}
    assert caches["L0.self.k"] == ["batch", 2, "steps", dh] and caches["L1.cross.v"] == ["sources", 1, "src_len", dh]
    size = manifest["size"]
    assert size["after"]["params"] < size["before"]["params"] and 0 < size["flops_ratio"] < 1
    assert manifest["verification"]["passed"]


def test_physical_pruning_of_an_already_pruned_model(smoke_run) -> None:
    model = model_from_checkpoint(load_checkpoint(smoke_run("transformer")))
    pruned, gated = prune(model, validate_plan(PLAN, model))
    assert pruned.cfg.heads_removed and active_heads(pruned)["decoder.layers.0.self_attn"] == [1, 6]
    # a plan for the pruned model names original heads; a removed one is refused
    with pytest.raises(ExportError, match=r"not active"):
        validate_plan({"decoder.layers.0.self_attn": [0, 1]}, pruned)
    again, _ = prune(pruned, validate_plan({"decoder.layers.0.self_attn": [6]}, pruned))
    _, reference = prune(model, validate_plan({**PLAN, "decoder.layers.0.self_attn": [6]}, model))
    src, tgt = torch.randint(4, 100, (3, 9)), torch.randint(4, 100, (3, 6))
    with torch.no_grad():
        assert torch.allclose(again(src, tgt), reference(src, tgt), atol=1e-5)
        assert torch.allclose(pruned(src, tgt), gated(src, tgt), atol=1e-5)
    assert again.cfg.head_plan["decoder.layers.0.self_attn"] == [6]
    assert again.attention_modules()["decoder.layers.0.self_attn"].num_heads == 1


@pytest.mark.parametrize("entry", ENTRIES)
def test_inexact_head_removal_is_refused_with_a_way_out(entry: str) -> None:
    """Mechanisms whose head removal would change the kept heads (Mixhead) refuse a plan clearly and
    can still be exported gated (remove_heads=false); the others remove heads exactly."""
    model = tiny_model(entry)
    plan = {"decoder.layers.0.self_attn": [0]}
    try:
        model.attention_modules()["decoder.layers.0.self_attn"].check_head_removal()
    except HeadPruningUnsupported:
        with pytest.raises(ExportError, match="remove_heads=false"):
            prune(model, plan)
        exported_model, gated = prune(model, plan, remove=False)
        gate = gated.attention_modules()["decoder.layers.0.self_attn"].head_gate
        assert exported_model is gated and gate.tolist() == [1.0] + [0.0] * (len(gate) - 1)
        return
    pruned, gated = prune(model, plan)
    src, tgt = random_batch()
    with torch.no_grad():
        assert torch.allclose(pruned(src, tgt), gated(src, tgt), atol=1e-5)
    assert pruned.attention_modules()["decoder.layers.0.self_attn"].num_heads == 1


def test_head_importance_plan_and_int8_export(exported, smoke_run) -> None:
    payload = load_checkpoint(smoke_run("transformer"))
    model = model_from_checkpoint(payload)
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    src, tgt = encode_pairs(tok, payload["heldout"]["src"], payload["heldout"]["tgt"], 256, 10**9)
    scores = head_importance(model, list(zip(src, tgt, strict=True)))
    assert set(scores) == set(model.attention_modules())
    assert all(len(s) == 8 and min(s.values()) >= 0 for s in scores.values())
    assert all(len(set(s.values())) > 1 for s in scores.values())  # real gradients, not a constant
    plan = plan_from_importance(scores, 2)
    for name, kept in plan.items():
        ranked = sorted(scores[name], key=lambda h: -scores[name][h])
        assert set(kept) == set(ranked[:2])
    # a per-module budget: by module kind, a full module name wins; unnamed modules keep every head
    budget = plan_from_importance(scores, {"decoder_self": 1, "encoder_self": 4, "encoder.layers.0.self_attn": 3})
    assert {n: len(h) for n, h in budget.items()} == {
        "encoder.layers.0.self_attn": 3,
        "encoder.layers.1.self_attn": 4,
        "decoder.layers.0.self_attn": 1,
        "decoder.layers.1.self_attn": 1,
    }
    with pytest.raises(ExportError, match="module kinds"):
        plan_from_importance(scores, {"decoder_ffn": 2})
    # gated-off heads (GHT-PS style) are never ranked
    model.apply_head_plan({"decoder.layers.0.self_attn": [0, 1, 2]}, remove=False)
    gated_scores = head_importance(model, list(zip(src[:4], tgt[:4], strict=True)), batch_size=2)
    assert sorted(gated_scores["decoder.layers.0.self_attn"]) == [0, 1, 2]

    out, manifest = exported("transformer", "keep_heads=2", "quantize=true")
    assert manifest["head_plan"] == plan and manifest["head_plan_source"].startswith("importance:heldout")
    assert manifest["name"] == "transformer-smoke-int8" and manifest["quantized"]
    ops = {n.op_type for n in onnx.load(str(out / "decoder.onnx")).graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops
    assert manifest["verification"]["passed"]  # fp32 graphs verified strictly before quantising
    assert "max_abs_logits_diff" in manifest["verification_int8"]  # int8 drift reported, not failed
    q = manifest["int8_quality"]  # its BLEU cost, measured on the (smoke) test split
    assert q["split"].startswith("test (") and 0 <= q["bleu_int8"] <= 100 and 0 <= q["p_value"] <= 1
    assert all(isinstance(s, str) for s in export.load(out).translate(payload["heldout"]["src"][:4]))


# ------------------------------------------------------------------------------------------- runtime
def test_ort_search_equals_torch_search(exported, smoke_run) -> None:
    out, _ = exported("transformer")
    src, texts, tok, payload = _heldout_batch(smoke_run("transformer"))
    model = model_from_checkpoint(payload)
    model.apply_head_plan(PLAN, remove=False)  # the gated original: what the pruned export must equal
    runtime = export.load(out, threads=1)
    for search in (
        SearchConfig(beam_size=4, len_penalty=0.6),
        SearchConfig(beam_size=2, len_penalty=1.3, min_len=3),
        SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=5, min_len=5),
        SearchConfig(beam_size=5, max_len_a=0.0, max_len_b=4, min_len=4),
    ):  # fixed length
        mine = rt.Search(
            **{k: getattr(search, k) for k in ("beam_size", "len_penalty", "max_len_a", "max_len_b", "min_len")}
        )
        assert runtime.generate(src.numpy(), mine) == generate(model, src, search), search
    reference = translate_texts(model, tok, texts, SearchConfig(beam_size=5))
    assert runtime.translate(texts, beam_size=5) == reference
    assert runtime.translate(texts[0]) == reference[:1]  # a single string, the manifest's defaults (beam 5)
    assert len({*reference}) > len(reference) // 3  # the (pruned) smoke model is not degenerate


@pytest.mark.parametrize("entry", BEAM_ENTRIES)
def test_ort_beam_equals_torch_beam_on_the_test_split(entry: str, exported, smoke_run, smoke_corpus) -> None:
    """The acceptance check: ORT beam search (beam 5) returns zoo.generate's hypotheses on the smoke test split."""
    out, manifest = exported(entry)
    payload = load_checkpoint(smoke_run(entry))
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    # the checkpoint's model with the export's plan gated: what the (pruned) export must equal
    _, reference = prune(model_from_checkpoint(payload), manifest["head_plan"], remove=False)
    texts = (smoke_corpus / "test.de").read_text(encoding="utf-8").splitlines()
    runtime = export.load(out, threads=1)
    src = torch.from_numpy(runtime.pad(runtime.encode_texts(texts)))
    ids = generate(reference, src, SearchConfig(beam_size=5))
    assert runtime.generate(src.numpy(), rt.Search(beam_size=5)) == ids
    assert runtime.translate(texts, beam_size=5) == translate_texts(reference, tok, texts, SearchConfig(beam_size=5))
    if entry == "transformer":  # non-degeneracy is checked on the baseline smoke checkpoint (DESIGN.md §3c);
        assert len({tuple(h) for h in ids}) > len(ids) // 3  # pruned 300-update variants repeat more


@pytest.mark.parametrize("entry", BEAM_ENTRIES)
def test_ort_nbest_and_scores_equal_torch(entry: str, exported, smoke_run, smoke_corpus) -> None:
    """n-best lists with scores and forced-decoding scores (issue 22): ORT returns torch's hypotheses with scores
    equal to 1e-4, led by the plain output; teacher-forced scores agree per token; and scoring a hypothesis gives
    back its search score — where the search forced eos at the length limit, with that eos counted as 0."""
    out, manifest = exported(entry)
    payload = load_checkpoint(smoke_run(entry))
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    _, reference = prune(model_from_checkpoint(payload), manifest["head_plan"], remove=False)
    texts = (smoke_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:24]
    runtime = export.load(out, threads=1)
    src_ids = runtime.encode_texts(texts)
    pairs = []  # (source row, hypothesis, search) of every hypothesis ORT returned
    for search in (SearchConfig(beam_size=5, len_penalty=0.8), SearchConfig(beam_size=1)):
        settings = {"beam_size": search.beam_size, "len_penalty": search.len_penalty}
        ours = runtime.translate(texts, **settings, num_hypotheses=search.beam_size)
        theirs = translate_texts_nbest(reference, tok, texts, search, search.beam_size)
        assert [hyps[0].text for hyps in ours] == runtime.translate(texts, **settings)
        for a, b in zip(ours, theirs, strict=True):
            assert a[0].tokens == b[0].tokens and len(a) == len(b) == search.beam_size
            assert all(x.score >= y.score for x, y in itertools.pairwise(a))
            # the same hypotheses with the same scores (compared as a mapping: near-ties may swap places)
            mine, ref = {tuple(h.tokens): h.score for h in a}, {tuple(h.tokens): h.score for h in b}
            assert mine.keys() == ref.keys()
            assert max(abs(mine[k] - ref[k]) for k in mine) <= 1e-4
        pairs += [(row, h, search) for row, hyps in enumerate(ours) for h in hyps]

    for len_penalty in (0.8, 1.0):
        chosen = [(row, h) for row, h, s in pairs if s.len_penalty == len_penalty]
        sources, targets = [src_ids[r] for r, _ in chosen], [h.tokens for _, h in chosen]
        got = runtime.score_encoded(sources, targets, len_penalty=len_penalty)
        ref = score_ids(reference, sources, targets, len_penalty=len_penalty)
        for g, r in zip(got, ref, strict=True):
            assert g.tokens == r.tokens and abs(g.score - r.score) <= 1e-4
            assert np.abs(np.subtract(g.token_logprobs, r.token_logprobs)).max() <= 1e-4
        limits = rt.max_lengths(
            np.array([len(s) for s in sources]), rt.Search(len_penalty=len_penalty), runtime.max_positions
        )
        for (_, hyp), g, limit in zip(chosen, got, limits, strict=True):
            counted = g.token_logprobs if len(g.tokens) < limit else g.token_logprobs[:-1]  # forced eos: 0
            assert abs(sum(counted) / len(g.tokens) ** len_penalty - hyp.score) <= 1e-4, hyp
    # the text API re-tokenises the hypotheses; it scores what score_encoded scores when the ids come back
    best = [hyps[0] for hyps in runtime.translate(texts, beam_size=5, len_penalty=0.8, num_hypotheses=1)]
    by_text = runtime.score(texts, [h.text for h in best], len_penalty=0.8)
    by_ids = runtime.score_encoded(src_ids, [h.tokens for h in best], len_penalty=0.8)
    pairs = list(zip(by_text, by_ids, strict=True))
    for text_scored, id_scored in pairs:  # how many texts re-tokenise to the search's ids depends on the model
        if text_scored.tokens == id_scored.tokens:
            assert abs(text_scored.score - id_scored.score) <= 1e-5
    assert any(a.tokens == b.tokens for a, b in pairs)


def test_runtime_nbest_and_score_refuse_bad_values(exported) -> None:
    """Bad num_hypotheses, mismatched counts, unscorable targets: refused before anything runs, naming the
    allowed values; the results have the same fields in both engines."""
    out, _ = exported("transformer")
    runtime = export.load(out, threads=1)
    for bad in (0, 6, 2.5, "two", True, None, float("inf")):
        with pytest.raises(export.SearchError, match=r"num_hypotheses=.* allowed: an integer in \[1, 5\]"):
            rt.check_num_hypotheses(bad, 5)
    with pytest.raises(export.SearchError, match=r"num_hypotheses=6 is out of range; .*at most beam_size=5"):
        runtime.translate(["Guten Morgen."], beam_size=5, num_hypotheses=6)
    with pytest.raises(export.SearchError, match=r"num_hypotheses=2 is out of range; .*\[1, 1\]"):
        runtime.translate_encoded_nbest([], runtime.search_settings(beam_size=1), 2)
    one = runtime.translate(["Guten Morgen.", ""], beam_size=2, return_scores=True)
    assert [len(h) for h in one] == [1, 1] and isinstance(one[0][0], rt.Translation)
    with pytest.raises(rt.ScoreError, match="got 2 sources but 1 targets"):
        runtime.score(["Guten Morgen.", "Danke."], ["Good morning."])
    with pytest.raises(rt.ScoreError, match="got 1 sources but 0 targets"):
        runtime.score_encoded([[5]], [])
    with pytest.raises(rt.ScoreError, match=r"outside the vocabulary \[0, 1000\)"):
        runtime.score_encoded([[5]], [[1000]])
    with pytest.raises(rt.ScoreError, match="at most 254"):
        runtime.score_encoded([[5]], [[5] * 255])
    with pytest.raises(export.SearchError, match="len_penalty"):
        runtime.score("Guten Morgen.", "Good morning.", len_penalty=-1)
    (empty,) = runtime.score("Guten Morgen.", "")
    assert empty.tokens == [runtime.eos_id] and empty.score == pytest.approx(empty.token_logprobs[0])
    assert runtime.score([], []) == [] and len(runtime.encode_targets(["Haus " * 400])[0]) == 254
    assert rt.Translation._fields == evaluation.Translation._fields and rt.Scored._fields == Scored._fields


def test_dynamic_batch_and_length(exported, smoke_run) -> None:
    out, _ = exported("transformer")
    src, _, _, payload = _heldout_batch(smoke_run("transformer"))
    pruned = prune(model_from_checkpoint(payload), PLAN)[0]
    runtime = export.load(out, threads=1)
    g = torch.Generator().manual_seed(0)
    for batch, extra_pad, steps in ((1, 0, 3), (2, 5, 9), (7, 1, 14), (45, 3, 6)):
        rows = torch.arange(batch) % src.shape[0]
        s = torch.nn.functional.pad(src[rows], (0, extra_pad))
        tgt = torch.randint(4, pruned.cfg.vocab_size, (batch, steps), generator=g)
        tgt[:, 0] = pruned.cfg.bos_id
        diffs = graph_parity(runtime, pruned, s, tgt)
        assert max(diffs.values()) < 1e-4, (batch, diffs)


def test_max_lengths_match_torch() -> None:
    lengths = torch.arange(0, 400).repeat(2)
    src = (torch.arange(400)[None, :] < lengths[:, None]).long() * 5  # rows with 0…399 non-pad tokens
    for a in (0.0, 0.5, 1.1, 1.2, 1.5, 2.0):
        for b in (0, 3, 10):
            for limit in (64, 256, 1024):
                search = SearchConfig(max_len_a=a, max_len_b=b)
                ref = _max_lengths(src, 0, search, limit).numpy()
                got = rt.max_lengths(src.ne(0).sum(1).numpy(), rt.Search(max_len_a=a, max_len_b=b), limit)
                assert np.array_equal(ref, got), (a, b, limit)


def test_runtime_imports_no_torch_and_stays_self_contained(exported) -> None:
    out, _ = exported("transformer")
    code = (
        "import sys, export, export.runtime as r\n"
        f"m = r.load({str(out)!r}, threads=1)\n"
        "assert all(isinstance(t, str) for t in m.translate(['Guten Morgen.', 'Das Haus ist klein.']))\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'zoo', 'hydra', 'omegaconf', 'onnx'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # one file, standard library + numpy + onnxruntime + sentencepiece: copied as is into a Triton model
    tree = ast.parse((REPO / "export" / "runtime.py").read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert imported <= {
        "__future__",
        "ctypes",  # glibc's malloc_trim after loading (a no-op elsewhere)
        "hashlib",
        "json",
        "math",
        "mmap",  # the self-attention stores' own mappings
        "os",
        "threading",  # the store pool's lock
        "weakref",  # a freed SelfCache gives its buffers back
        "collections",
        "dataclasses",
        "pathlib",
        "typing",
        "numpy",
        "onnxruntime",
        "sentencepiece",
    }, imported


def test_self_cache_store_and_history_are_concatenation_then_index_select() -> None:
    """The host-owned self cache against its definition: each step appends the graph's new position and
    `select` picks rows (beam reordering, finished sentences leaving). What the decoder graph gathers from
    `feeds()` (export.graph.past, the graph's own code) must be that cache, over 40 steps with duplicate rows,
    shrinking and growing batches (wider than the store: renumbered cells) and store growth from 2 positions;
    running sums (no position axis) are replaced, then reordered."""
    rng = np.random.default_rng(0)
    dicts = [
        {"name": "k", "kind": "self", "layer": 0, "key": "k", "shape": ["batch", 2, "steps", 3], "dtype": "float32"},
        {"name": "s", "kind": "self", "layer": 0, "key": "s", "shape": ["batch", 2, 3], "dtype": "float32"},
    ]
    specs = [CacheSpec(**{**d, "shape": tuple(d["shape"])}) for d in dicts]
    rows = 6
    cache = rt.SelfCache(dicts, rows, steps=2)
    ref_k, ref_sums = np.zeros((rows, 2, 0, 3), np.float32), np.zeros((rows, 2, 3), np.float32)
    for t in range(40):
        feeds = cache.feeds()
        assert all(v.flags.c_contiguous for v in feeds.values())  # fed to onnxruntime without a copy
        history = torch.from_numpy(feeds["history"])
        got = export_graph.past(specs[0], torch.from_numpy(feeds["k"]), history).numpy()
        assert np.array_equal(got, ref_k) and np.array_equal(feeds["s"], ref_sums), t
        n = len(ref_k)
        new_k = rng.standard_normal((n, 2, 1, 3)).astype(np.float32)
        sums = rng.standard_normal((n, 2, 3)).astype(np.float32)
        cache.update([new_k, sums])
        ref_k, ref_sums = np.concatenate([ref_k, new_k], axis=2), sums
        for _ in range(t % 3):  # none, one or two selections between steps
            size = rows + 3 if t == 20 else max(1, len(ref_k) - (t % 7 == 3))  # step 20: more rows than ever
            keep = rng.integers(0, len(ref_k), size=size)
            cache.select(keep)
            ref_k, ref_sums = ref_k[keep], ref_sums[keep]
    assert cache.width > rows and cache.capacity >= 40


def test_decoder_gathers_the_past_and_returns_only_new_positions(exported, tmp_path) -> None:
    """The decoder graph reads the growing self caches from the host's store through `history` (no
    beam_order), returns only what a step adds — each new position straight from where it is computed, so
    no grown cache is built (MHA attends to the past and the new position apart) — and the runtime refuses an
    export made for the old format with a one-line message naming the fix."""
    out, manifest = exported("transformer")
    graph = onnx.load(str(out / manifest["graphs"]["decoder"]["file"])).graph
    inputs = {i.name for i in graph.input}
    assert "history" in inputs and "beam_order" not in inputs and manifest["runtime_format"] == rt.RUNTIME_FORMAT
    producer = {o: n for n in graph.node for o in n.output}
    for spec in (c for c in manifest["caches"] if c["kind"] == "self"):
        node = producer[rt._NEXT + spec["name"]]  # the new position as computed, never cut off a grown cache
        assert node.op_type not in ("Concat", "Slice", "Identity"), (spec["name"], node.op_type)
    assert not [n for n in graph.node if n.op_type == "Concat" and any(".self." in i for i in n.input)]
    runtime = export.load(out, threads=1)
    src = runtime.pad(runtime.encode_texts(["Guten Morgen.", "Das Haus ist klein."]))
    step = runtime.stepper(runtime.encode(src), np.repeat(np.arange(2), 3), steps=4)
    step(np.full(6, runtime.bos_id), 0, 4)
    step.select(np.array([2, 2, 0, 5, 4, 3]))
    step(np.full(6, 5), 1, 4)
    assert step.cache.history.shape == (6, 2) and step.cache.width == 6
    old = _tampered(out, tmp_path, lambda m: m.update(runtime_format=1))
    with pytest.raises(rt.ExportedModelError, match=r"re-export it with `python -m export") as err:
        export.load(old)
    assert "\n" not in str(err.value)


def test_graph_rewrites_drop_multiplications_by_one_and_output_identities_exactly() -> None:
    """export/rewrites.py on a hand-built graph: a Mul by ones that keeps its operand's shape is gone, one that
    widens it (broadcast) or multiplies by something else stays, an output Identity of a computed value becomes
    that value's producer — and onnxruntime computes the same outputs before and after (inf and NaN included)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 5])
    narrow = helper.make_tensor_value_info("narrow", TensorProto.FLOAT, [2, 1, 3, 5])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "wide", "twice", "copy")]
    inits = [
        numpy_helper.from_array(np.ones((1, 4, 1, 1), np.float32), "gate"),
        numpy_helper.from_array(np.full((1, 4, 1, 1), 2.0, np.float32), "two"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "gate"], ["gated"]),  # a head gate of ones: the operand itself
        helper.make_node("Relu", ["gated"], ["y"]),
        helper.make_node("Mul", ["gate", "narrow"], ["wide"]),  # broadcasts [2,1,3,5] to [2,4,3,5]: kept
        helper.make_node("Mul", ["x", "two"], ["twice"]),  # not ones: kept
        helper.make_node("Neg", ["x"], ["negated"]),
        helper.make_node("Identity", ["negated"], ["copy"]),  # an output copy of a computed value
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x, narrow], outs, inits),
        opset_imports=[helper.make_opsetid("", 20)],
        ir_version=10,
    )
    feeds = {"x": np.random.default_rng(0).normal(size=(2, 4, 3, 5)).astype(np.float32)}
    feeds["narrow"] = feeds["x"][:, :1].copy()
    feeds["x"][0, 0, 0, :2] = [np.inf, np.nan]

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    before = run(model)
    drop_multiplications_by_one(model)
    outputs_from_their_producers(model)
    drop_unread(model)
    ops = [(n.op_type, list(n.input)) for n in model.graph.node]
    assert (
        ("Identity", ["x"]) in ops and ["x", "two"] in [i for _, i in ops] and ["gate", "narrow"] in [i for _, i in ops]
    )
    producer = {o: n for n in model.graph.node for o in n.output}
    assert producer["copy"].op_type == "Neg" and producer["copy"].input[0] == "x"
    for a, b in zip(before, run(model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_transposes_that_move_only_unit_axes_become_reshapes_exactly() -> None:
    """A Transpose that moves only size-1 axes keeps memory order: it becomes a Reshape (which onnxruntime runs
    without a copy) with the batch axis left dynamic; Transposes that move data, or whose target shape would need
    two unknown sizes, stay. onnxruntime computes the same outputs before and after, at several batch sizes."""
    n = "n"
    specs = {  # input name: (shape, perm, becomes a Reshape)
        "heads_split": ([n, 1, 8, 4], [0, 2, 1, 3], True),  # [N, 1, H, dh] -> [N, H, 1, dh]: one query position
        "key_t": ([n, 8, 1, 4], [0, 1, 3, 2], True),  # [N, H, 1, dh] -> [N, H, dh, 1]
        "moves_data": ([n, 3, 8, 4], [0, 2, 1, 3], False),
        "two_unknowns": ([1, n, "m"], [1, 2, 0], False),  # [1, N, M] -> [N, M, 1]: order kept, two -1 sizes
    }
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, shape) for k, (shape, _, _) in specs.items()]
    outputs = [helper.make_tensor_value_info(f"{k}_out", TensorProto.FLOAT, None) for k in specs]
    nodes = [helper.make_node("Transpose", [k], [f"{k}_out"], perm=perm) for k, (_, perm, _) in specs.items()]
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 20)], ir_version=10
    )
    rng = np.random.default_rng(0)

    def run(m: onnx.ModelProto, batch: int) -> list[np.ndarray]:
        sizes = {n: batch, "m": 3}
        feeds = {
            k: rng.standard_normal([sizes.get(d, d) for d in shape]).astype(np.float32)
            for k, (shape, _, _) in specs.items()
        }
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return [feeds, *session.run(None, feeds)]

    before = [run(model, batch) for batch in (1, 5)]
    layout_preserving_transposes_to_reshapes(model)
    ops = {node.input[0]: node.op_type for node in model.graph.node}
    assert ops == {k: "Reshape" if reshape else "Transpose" for k, (_, _, reshape) in specs.items()}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds, *expected in before:
        for a, b in zip(expected, session.run(None, feeds), strict=True):
            np.testing.assert_array_equal(a, b)
    layout_preserving_transposes_to_reshapes(model)  # idempotent: nothing left to rewrite
    assert [node.op_type for node in model.graph.node].count("Reshape") == 2


def test_consecutive_reshapes_merge_into_the_last_exactly() -> None:
    """Reshape(Reshape(x, s1), s2) reads x directly when nothing else reads the inner result and every 0 in s2
    names an axis x has the same size on; a Reshape whose 0 would then mean another size, and one whose inner
    result has a second reader, stay. onnxruntime computes the same outputs before and after, at several
    batch sizes."""
    inputs = [
        helper.make_tensor_value_info("heads", TensorProto.FLOAT, ["n", 1, 8]),
        helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["n", 6]),
    ]
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        for name in ("moved", "shared_moved", "split", "regrouped")
    ]
    inits = [
        numpy_helper.from_array(np.array(shape, dtype=np.int64), name)
        for name, shape in {
            "to_heads": [0, 1, 2, 4],
            "to_positions": [0, 2, 1, 4],
            "to_pairs": [2, -1],
            "to_groups": [0, 3, -1],
        }.items()
    ]
    nodes = [
        helper.make_node("Reshape", ["heads", "to_heads"], ["split"]),  # [N, 1, 2, 4]; also read below
        helper.make_node("Reshape", ["split", "to_positions"], ["shared_moved"]),  # kept: "split" has 2 readers
        helper.make_node("Reshape", ["heads", "to_heads"], ["split_once"]),
        helper.make_node("Reshape", ["split_once", "to_positions"], ["moved"]),  # merged: reads "heads"
        helper.make_node("Reshape", ["flat", "to_pairs"], ["pairs"]),  # [2, 3N]
        helper.make_node("Reshape", ["pairs", "to_groups"], ["regrouped"]),  # its 0 is 2, not N: kept
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", 20)],
        ir_version=10,
    )
    rng = np.random.default_rng(0)
    cases = [
        {
            "heads": rng.standard_normal((batch, 1, 8)).astype(np.float32),
            "flat": rng.standard_normal((batch, 6)).astype(np.float32),
        }
        for batch in (1, 4)
    ]

    def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    before = [run(model, feeds) for feeds in cases]
    consecutive_reshapes_merged(model)
    drop_unread(model)
    reads = {node.output[0]: node.input[0] for node in model.graph.node}
    assert reads["moved"] == "heads" and reads["shared_moved"] == "split" and reads["regrouped"] == "pairs"
    assert "split_once" not in reads
    for feeds, expected in zip(cases, before, strict=True):
        for a, b in zip(expected, run(model, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def test_beam_search_runs_its_first_step_on_one_row_per_sentence(exported, monkeypatch) -> None:
    """All beams of a sentence start as the same bos hypothesis, so the runtime's first beam step decodes one row
    per sentence and the next ones beam-size rows (the search itself is checked against zoo.generate by the
    beam-equality tests); the self-attention store is sized for the full width from the start."""
    out, _ = exported("transformer")
    runtime = export.load(out, threads=1)
    src = runtime.pad(runtime.encode_texts(["Guten Morgen.", "Das Haus ist klein.", "Ja."]))
    rows: list[int] = []
    widths: list[int] = []
    decode = rt._Stepper._decode

    def spy(self, outputs, inputs):
        rows.append(len(inputs["tokens"]))
        widths.append(self.cache.width)
        return decode(self, outputs, inputs)

    monkeypatch.setattr(rt._Stepper, "_decode", spy)
    hyps = runtime.generate_nbest(src, rt.Search(beam_size=4, max_len_a=0.0, max_len_b=6, min_len=6), 4)
    assert rows[:3] == [3, 12, 12] and set(widths) == {12}
    assert all(len(h) == 4 and all(len(x.tokens) == 5 for x in h) for h in hyps)


def test_a_step_where_every_hypothesis_must_end_is_not_decoded(exported, monkeypatch) -> None:
    """At its length limit a hypothesis may only end (eos at log-prob 0, as zoo.generate), so the runtime does not
    run the decoder on a step where every live row is there: a fixed-length search of n tokens (eos included)
    decodes n - 1 steps, and sentences with different limits keep decoding until the longest limit's last step.
    The hypotheses and scores are checked against zoo.generate by the search-equality tests, fixed lengths included."""
    out, _ = exported("transformer")
    runtime = export.load(out, threads=1)
    src = runtime.pad(runtime.encode_texts(["Ja.", "Das Haus ist klein und alt, aber es hat einen Garten."]))
    steps: list[int] = []
    decode = rt._Stepper._decode

    def spy(self, outputs, inputs):
        steps.append(int(inputs["step"][0]))
        return decode(self, outputs, inputs)

    monkeypatch.setattr(rt._Stepper, "_decode", spy)
    for beam in (1, 4):
        steps.clear()
        hyps = runtime.generate_nbest(src, rt.Search(beam_size=beam, max_len_a=0.0, max_len_b=6, min_len=6), beam)
        assert steps == [0, 1, 2, 3, 4], beam
        assert all(len(h) == beam and all(len(x.tokens) == 5 for x in h) for h in hyps)
        # every sentence to its own limit (eos banned before it): the short one's last step is decoded for the other
        search = rt.Search(beam_size=beam, max_len_a=0.5, max_len_b=1, min_len=200)
        limits = rt.max_lengths((src != runtime.pad_id).sum(1), search, runtime.max_positions)
        assert limits[0] < limits[1]
        steps.clear()
        hyps = runtime.generate_nbest(src, search, beam)
        assert steps == list(range(int(limits[1]) - 1)), beam
        assert [len(h[0].tokens) for h in hyps] == [int(n) - 1 for n in limits]


def test_mapped_zeros_are_writable_zeros_that_the_store_uses() -> None:
    zeros = rt.mapped_zeros((3, 5), np.float32)
    assert zeros.shape == (3, 5) and zeros.dtype == np.float32 and not zeros.any() and zeros.flags.writeable
    zeros[1, 2] = 7.0
    assert zeros.sum() == 7.0
    spec = {"name": "k", "kind": "self", "layer": 0, "key": "k", "shape": ["batch", 2, "steps", 3], "dtype": "float32"}
    cache = rt.SelfCache([spec], rows=2, steps=4, slots=5)
    assert cache.width == 5 and cache.stores[0].shape == (4 * 5 * 2, 3) and not cache.stores[0].any()


def test_store_pool_hands_a_finished_search_buffers_to_the_next() -> None:
    """A freed SelfCache gives its store buffers back to the model's pool; the next search of the same size takes
    those very buffers (no new memory), a larger one makes new ones and drops the smaller free ones instead of
    piling them up, and a store grown or widened mid-search gives its old buffer back at once."""
    spec = {"name": "k", "kind": "self", "layer": 0, "key": "k", "shape": ["batch", 2, "steps", 3], "dtype": "float32"}
    pool = rt.StorePool()
    cache = rt.SelfCache([spec, {**spec, "name": "v"}], rows=4, steps=5, pool=pool)
    first = [id(b) for b in cache.buffers]
    del cache
    assert pool.free_bytes == 2 * 5 * 4 * 2 * 3 * 4
    cache = rt.SelfCache([spec, {**spec, "name": "v"}], rows=4, steps=5, pool=pool)
    assert sorted(id(b) for b in cache.buffers) == sorted(first) and pool.free_bytes == 0
    del cache
    big = rt.SelfCache([spec, {**spec, "name": "v"}], rows=8, steps=5, pool=pool)
    assert pool.free_bytes == 0 and all(b.nbytes == 5 * 8 * 2 * 3 * 4 for b in big.buffers)
    before = id(big.buffers[0])
    for _ in range(6):  # a sixth position: the stores grow, their old buffers go back
        big.update([np.ones((8, 2, 1, 3), np.float32)] * 2)
    assert id(big.buffers[0]) != before and pool.free_bytes > 0
    np.testing.assert_array_equal(big.feeds()["k"], 1.0)


def test_runtime_refuses_a_corrupt_export(exported, tmp_path) -> None:
    out, _ = exported("transformer")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "decoder.onnx", "r+b") as fh:
        fh.seek(1000)
        fh.write(b"\0\0\0\0")
    with pytest.raises(rt.ExportedModelError, match="sha256"):
        export.load(copy)
    with pytest.raises(rt.ExportedModelError, match=r"no manifest\.json"):
        export.load(tmp_path)


def test_shared_weights_are_read_once_for_both_sessions(exported, tmp_path) -> None:
    """The weights both graphs hold (tied embedding, positions) are located in the encoder file and given to both
    sessions from one array; decoding is bit-identical to each session keeping its own copy."""
    out, manifest = exported("transformer")
    shared = {w["name"]: w for w in manifest["shared_weights"]}
    assert "positions" in shared
    graphs = [{i.name: i for i in onnx.load(str(out / f"{g}.onnx")).graph.initializer} for g in ("encoder", "decoder")]
    for name, w in shared.items():
        in_file = np.fromfile(out / w["file"], np.dtype(w["dtype"]), math.prod(w["shape"]), offset=w["offset"])
        for g in graphs:
            np.testing.assert_array_equal(in_file.reshape(w["shape"]), numpy_helper.to_array(g[name]))
    model = export.load(out)
    assert model.shared.keys() == shared.keys()
    own = _tampered(out, tmp_path, lambda m: m.pop("shared_weights"))
    alone = export.load(own)
    assert alone.shared == {}
    src = model.pad(model.encode_texts(["ein kleiner Test .", "noch ein Satz"]))
    one, two = model.encode(src, with_memory=True), alone.encode(src, with_memory=True)
    for name in one:
        np.testing.assert_array_equal(one[name], two[name])
    assert model.generate(src) == alone.generate(src)


def test_runtime_providers_name_the_fix(exported) -> None:
    """provider=cpu is the default; provider=cuda asks for CUDA with TF32 off (the export's parity), and where
    this onnxruntime has no CUDA provider, loading says to install onnxruntime-gpu instead of falling back."""
    out, _ = exported("transformer")
    assert export.load(out, provider="cpu").decoder.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(rt.ExportRuntimeError, match=r"provider='tpu': choose one of \['cpu', 'cuda'\]"):
        export.load(out, provider="tpu")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        cuda = rt.execution_providers("cuda", device_id=1)[0]
        assert cuda == ("CUDAExecutionProvider", {"device_id": 1, "use_tf32": "0"})
    else:
        with pytest.raises(rt.ExportRuntimeError, match="install onnxruntime-gpu"):
            export.load(out, provider="cuda")


def _tampered(out: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "tampered"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _add_file(name: str):
    def edit(m: dict) -> None:
        m["files"][name] = "0" * 64

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_add_file("../../escaped.txt"), "not a plain file name"),
        (_add_file("/etc/passwd"), "not a plain file name"),
        (_add_file("sub/x"), "not a plain file name"),
        (lambda m: m.update(tokenizer="../tokenizer.model"), "not a plain file name"),
        (lambda m: m["graphs"]["decoder"].update(file="/tmp/other.onnx"), "graphs.decoder.file"),
        (lambda m: m["files"].pop("decoder.onnx"), "not listed"),
        (lambda m: m.pop("vocab"), "missing key 'vocab.pad_id'"),
        (lambda m: m.update(max_positions="512"), "'max_positions' has the wrong type"),
        (lambda m: m.update(caches=[{"name": "x"}]), r"caches\[0\]"),
        (lambda m: m["shared_weights"][0].update(offset=10**12), "reaches past the end"),
        (lambda m: m["shared_weights"][0].update(file="../encoder.onnx"), "not a plain file name"),
        (lambda m: m["shared_weights"][0].update(dtype="object"), "has dtype 'object'"),
        (lambda m: m["shared_weights"].append({"name": "x"}), r"shared_weights\[\d+\] needs name"),
    ],
)
def test_runtime_refuses_a_manifest_that_points_outside_or_lacks_keys(exported, tmp_path, edit, message) -> None:
    """An export directory is untrusted input: every file it names must be a plain, listed, checksummed name
    inside it, and a malformed manifest gives one line naming the key."""
    out, _ = exported("transformer")
    copy = _tampered(out, tmp_path, edit)
    with pytest.raises(rt.ExportedModelError, match=message) as err:
        export.load(copy)
    assert "\n" not in str(err.value) and "manifest.json" in str(err.value)
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(rt.ExportedModelError, match="cannot read"):
        export.load(copy)


def _conforms(value, hint) -> bool:
    """Whether a JSON value has the type a schema annotation declares (TypedDicts: their keys, recursively)."""
    if hint is Any:
        return True
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint)
        return (
            isinstance(value, dict)
            and hint.__required_keys__ <= value.keys() <= hints.keys()
            and all(_conforms(v, hints[k]) for k, v in value.items())
        )
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()
        )
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


@pytest.mark.parametrize("overrides", [(), ("keep_heads=2", "quantize=true")], ids=["fp32", "int8"])
def test_manifest_follows_the_schema(exported, overrides) -> None:
    """manifest.json has the keys of export.runtime.Manifest in its order, each of its declared type, and the
    exporter returns the same document (+ out)."""
    out, manifest = exported("transformer", *overrides)
    written = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    optional = {"verification_int8", "int8_quality"} if not overrides else set()
    assert list(written) == [k for k in rt.MANIFEST_KEYS if k not in optional]
    assert _conforms(written, rt.Manifest)
    assert manifest == {**written, "out": str(out)}


# ------------------------------------------------------------------------------------------- bad input
def test_bad_checkpoints_fail_clearly(smoke_run, tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match="does not exist"):
        export_checkpoint(export_config(tmp_path / "missing.pt", out))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="cannot read"):
        export_checkpoint(export_config(garbage, out))
    real = resolve_checkpoint(smoke_run("transformer"))
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cannot read"):
        export_checkpoint(export_config(truncated, out))
    payload = torch.load(real, weights_only=True)
    payload["model_config"]["attention"] = "nonesuch"
    torch.save(payload, tmp_path / "unknown_attention.pt")
    with pytest.raises(CheckpointError, match="nonesuch"):
        export_checkpoint(export_config(tmp_path / "unknown_attention.pt", out))
    payload = torch.load(real, weights_only=True)
    payload["entry"] = "nonesuch"
    torch.save(payload, tmp_path / "unknown_entry.pt")
    with pytest.raises(ExportError, match="not a model entry"):
        export_checkpoint(export_config(tmp_path / "unknown_entry.pt", out))
    assert not out.exists()


def test_bad_head_plans_fail_before_exporting(smoke_run, tmp_path) -> None:
    run = smoke_run("transformer")
    cases = {
        '{"decoder.layers.9.self_attn": [0]}': "unknown attention modules",
        '{"decoder.layers.0.self_attn": [0, 8]}': "not active",
        '{"decoder.layers.0.self_attn": [1, 1]}': "repeats",
        '{"decoder.layers.0.self_attn": []}': "keeps no head",
        '{"decoder.layers.0.self_attn": "0,1"}': "must be a JSON object",
        "{not json": "not valid JSON",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"plan{i}.json"
        path.write_text(text)
        with pytest.raises(ExportError, match=message):
            export_checkpoint(export_config(run, tmp_path / "out", f"head_plan={path}"))
    with pytest.raises(ExportError, match="not both"):
        export_checkpoint(export_config(run, tmp_path / "out", f"head_plan={path}", "keep_heads=2"))
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def ght_ps_unpruned(smoke_run, tmp_path_factory) -> tuple[Path, Path, dict]:
    """(export root, export dir, manifest) of the smoke GHT-PS checkpoint exported with every head kept
    (remove_heads=false), written over an existing directory: on the way it checks that an existing
    directory is refused without overwrite=true, and that a failed verification (a real export checked at
    an impossible tolerance) leaves the old directory untouched and no temporary directory behind."""
    root = tmp_path_factory.mktemp("overwrite")
    run = smoke_run("ght_ps")
    existing = root / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"already exists.*overwrite=true"):
        export_checkpoint(export_config(run, existing, "remove_heads=false"))
    assert (existing / "keep.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="verification failed"):  # logits differ by ~1e-6 > 1e-12
        export_checkpoint(
            export_config(run, existing, "remove_heads=false", "overwrite=true", "verify.tolerance=1e-12")
        )
    assert (existing / "keep.txt").read_text() == "mine"  # the old export survives a failed one
    assert [p.name for p in root.iterdir()] == ["existing"]  # no temporary directory left behind
    manifest = export_checkpoint(export_config(run, existing, "remove_heads=false", "overwrite=true"))
    return root, existing, manifest


def test_existing_output_and_failed_verification_leave_nothing_half_written(ght_ps_unpruned) -> None:
    root, out, manifest = ght_ps_unpruned
    assert manifest["verification"]["passed"] and not (out / "keep.txt").exists()
    assert sorted(p.name for p in root.iterdir()) == ["existing"]
    # remove_heads=false keeps the gated-off heads in the graph: every module computes all its heads
    assert not manifest["heads_removed"] and manifest["head_plan"]
    assert all(h["num_heads"] == manifest["model_config"]["num_heads"] for h in manifest["heads"].values())
    assert manifest["size"]["flops_ratio"] == 1.0


def test_bench_runs_side_by_side(ght_ps_unpruned, exported, smoke_run, tmp_path, capsys) -> None:
    """`python -m export.bench` end to end on smoke checkpoints with tiny settings (numbers meaningless here)."""
    _, unpruned, _ = ght_ps_unpruned
    pruned, _ = exported("ght_ps")
    report_path = tmp_path / "bench.json"
    bench.main(
        [
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
    assert report["headline"]["rounds"] == 3 and report["baseline_runtime"] is None
    assert report["matmul_roofline_gflops"] > 0
    assert set(report["memory"]) >= {"fp32"} and set(report["memory"]["fp32"]["engines"]) == {"ort"}
    pruning = report["pruning"]
    assert 0 < pruning["analytic_flops_ratio"] < 1 and pruning["torch"]["speedup"] > 0 and pruning["ort"]["speedup"] > 0
    assert "ratio" in text and "analytic FLOP ratio" in text and "roofline" in text


def test_bench_against_a_baseline_runtime_without_torch(exported, tmp_path, capsys) -> None:
    """--baseline-runtime: another runtime.py (here the same file, so the same hypotheses) timed against
    export.runtime on the same fp32 and INT8 exports, no torch engine, no checkpoint; the fresh-process
    memory probe reports positive peaks without importing torch, next to the graphs' weight bytes."""
    fp32, manifest = exported("transformer")
    int8, _ = exported("transformer", "keep_heads=2", "quantize=true")
    runtime_file = (REPO / "export" / "runtime.py").resolve()
    report_path = tmp_path / "bench.json"
    bench.main(
        [
            *("--export", str(fp32), "--int8-export", str(int8), "--baseline-runtime", str(runtime_file)),
            *("--no-torch", "--threads", "1", "--repeats", "1", "--modes", "fixed", "--searches", "beam5"),
            *("--batches", "4", "--paper-batch", "4", "--fixed-len", "4", "--json", str(report_path)),
        ]
    )
    text = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert report["baseline_runtime"] == {
        "path": str(runtime_file),
        "sha256": hashlib.sha256(runtime_file.read_bytes()).hexdigest(),
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
    runtime_file = REPO / "export" / "runtime.py"
    with pytest.raises(SystemExit) as exc:
        bench.main(
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
            bench.main(["--export", str(tmp_path / "export"), "--no-torch", "--baseline-runtime", str(path)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert message in err and "export/runtime.py" in err, err
    checkout = tmp_path / "checkout"  # what `git worktree add /tmp/checkout <commit>` leaves
    (checkout / "export").mkdir(parents=True)
    shutil.copy(REPO / "export" / "runtime.py", checkout / "export" / "runtime.py")
    assert bench.resolve_runtime_file(checkout) == (checkout / "export" / "runtime.py").resolve()
    path, module = bench.load_baseline_runtime(checkout / "export")
    assert path == (checkout / "export" / "runtime.py").resolve() and module.load is not rt.load
    with pytest.raises(SystemExit) as exc:  # torch compared without a checkpoint
        bench.main(["--export", str(tmp_path / "export")])
    assert exc.value.code == 2 and "--checkpoint is required unless --no-torch" in capsys.readouterr().err


def test_cli_exit_codes(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "export", f"checkpoint={tmp_path / 'missing.pt'}", f"out={tmp_path / 'out'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "error:" in proc.stderr and "does not exist" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "export"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "no checkpoint given" in proc.stderr, proc.stderr
