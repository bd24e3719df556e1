"""The exporter: every export signature exported, physically pruned and verified against PyTorch; head plans
from JSON, importance and checkpoints; INT8; the manifest schema; bad checkpoints, plans and outputs.

Every export here runs with one thread (`runtime.threads=1`): the two cores are shared.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import export
from export import runtime as rt
from export.exporter import export_checkpoint
from export.graph import ExportError
from export.pruning import active_heads, head_importance, plan_from_importance, prune, validate_plan
from export.verify import encode_pairs
from tests.conftest import UNTRAINED_VERIFY
from tests.export_testing import (
    PLAN,
    REPRESENTATIVES,
    TRAINED_ENTRIES,
    ExportSignature,
    export_config,
    export_signature,
    pruning_overrides,
)
from tests.zoo_testing import ENTRIES, REPO, random_batch, tiny_model
from zoo.attention import HeadPruningUnsupported
from zoo.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint, resolve_checkpoint
from zoo.data import Tokenizer


def onnx_weights(out: Path) -> list[np.ndarray]:
    """Every initializer of both graphs as an array (cross-attention k/v live in the encoder graph)."""
    return [
        numpy_helper.to_array(init)
        for name in ("encoder.onnx", "decoder.onnx")
        for init in onnx.load(str(out / name)).graph.initializer
    ]


def holds(weights: list[np.ndarray], w: torch.Tensor) -> bool:
    """Whether the graphs hold weight `w` exactly, as stored or transposed (MatMul takes [in, out]), alone or as one
    block of a fused q/k/v weight ([3I, D] or its MatMul form: export/fused_attention.py, the default export)."""
    a = w.detach().numpy()
    for x in weights:
        for b in (a, a.T):
            if x.ndim != 2 or b.ndim != 2:
                continue
            rows, cols = b.shape
            if x.shape[1] == cols and x.shape[0] % rows == 0:  # b alone, or a block of rows
                if any(np.array_equal(x[i : i + rows], b) for i in range(0, x.shape[0], rows)):
                    return True
            if x.shape[0] == rows and x.shape[1] % cols == 0:  # a block of columns
                if any(np.array_equal(x[:, j : j + cols], b) for j in range(0, x.shape[1], cols)):
                    return True
    return False


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


def test_every_entry_has_an_export_signature_that_the_parity_test_covers() -> None:
    """The parity test below exports one representative per export signature; an entry whose signature none of
    them has (a new mechanism, option or head layout) fails here until a representative of it is added."""
    covered = {export_signature(entry): entry for entry in REPRESENTATIVES}
    assert len(covered) == len(REPRESENTATIVES), "two representatives share a signature: drop one"
    uncovered = {entry: export_signature(entry) for entry in ENTRIES if export_signature(entry) not in covered}
    assert not uncovered, f"add a representative of each to tests/export_testing.py REPRESENTATIVES: {uncovered}"
    assert set(TRAINED_ENTRIES) <= set(REPRESENTATIVES)  # trained checkpoints are exported once, for both uses
    # the signatures tell apart what the export does differently (spot checks of the mapping)
    assert export_signature("transformer_lite_width") == export_signature("ght") == export_signature("transformer")
    assert export_signature("ght_ps_no_huds") == export_signature("ght_ps") != export_signature("transformer")
    assert (
        export_signature("fixhead_matched").free_head_size and not export_signature("transformer_32head").free_head_size
    )
    assert export_signature("smgk_4head") == ExportSignature("mgk", True, "", True, False)


@pytest.mark.parametrize("entry", REPRESENTATIVES)
def test_export_with_pruning_verifies_for_every_signature(entry: str, exported, checkpoint_run, tmp_path) -> None:
    """Each export signature, physically pruned (gated where removal is inexact), exported and verified: logits,
    caches and beam search equal PyTorch's, removed heads absent from the weights, caches of each layer's own head
    count. Random-init checkpoints except for the trained entries (a structural check needs no training)."""
    out, manifest = exported(entry)
    overrides, plan = pruning_overrides(checkpoint_run(entry), tmp_path)
    v = manifest["verification"]
    assert v["passed"], v
    assert v["max_abs_logits_diff"] <= 1e-4 and v["pruned_vs_gated"] <= 1e-4
    assert v["beam"]["identical"] == v["beam"]["total"] == v["sentences"]
    # word alignments: the decoder's `alignment` output, verified against torch; none where attention is linear
    alignment, outputs = manifest["alignment"], manifest["graphs"]["decoder"]["outputs"]
    if manifest["attention"] in ("linear", "mlk"):
        assert alignment["output"] is None and "running sums" in alignment["reason"] and "alignment" not in outputs
    else:
        assert alignment["output"] == "alignment" in outputs and v["max_abs_alignment_diff"] <= 1e-4
    assert {f.name for f in out.iterdir()} == {
        "encoder.onnx",
        "encoder.onnx.data",
        "decoder.onnx",
        "decoder.onnx.data",
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
        assert_removed_heads_absent(out, manifest, load_checkpoint(checkpoint_run(entry)))
    # cache tensors follow each layer's own head count; the decoder's ONNX inputs carry the same layout
    decoder = onnx.load(str(out / "decoder.onnx"))
    inputs = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in decoder.graph.input}
    for cache in manifest["caches"]:
        module = f"decoder.layers.{cache['layer']}.{'self_attn' if cache['kind'] == 'self' else 'cross_attn'}"
        # self caches: a row per hypothesis; cross caches: a row per source, shared by its beams
        assert cache["shape"][0] == ("batch" if cache["kind"] == "self" else "sources")
        shared = manifest["model_config"]["attention_options"].get("kv_heads")  # GQA / MQA: the key/value heads
        assert cache["shape"][1] == (shared or manifest["heads"][module]["num_heads"]), cache
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


def test_a_pre_norm_model_exports_pruned_and_verified(untrained_run, tmp_path) -> None:
    """The norm before each sublayer (model.pre_norm, with a final norm on each stack; what probe_summ_recipe found
    summ needs) exports like the default post-norm: pruned, its logits, caches and beam search equal PyTorch's."""
    run = untrained_run("transformer", "model.pre_norm=true")
    overrides, plan = pruning_overrides(run, tmp_path)
    manifest = export_checkpoint(export_config(run, tmp_path / "export", *overrides, UNTRAINED_VERIFY))
    assert manifest["model_config"]["pre_norm"] is True and manifest["head_plan"] == plan
    v = manifest["verification"]
    assert v["passed"] and v["max_abs_logits_diff"] <= 1e-4, v
    assert v["beam"]["identical"] == v["beam"]["total"] == v["sentences"]


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
    assert ("MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops) and "Gemm" not in ops  # the projection too
    assert manifest["verification"]["passed"]  # fp32 graphs verified strictly before quantising
    assert "max_abs_logits_diff" in manifest["verification_int8"]  # int8 drift reported, not failed
    q = manifest["int8_quality"]  # its BLEU cost, measured on the (smoke) test split
    assert q["split"].startswith("test (") and 0 <= q["bleu_int8"] <= 100 and 0 <= q["p_value"] <= 1
    assert all(isinstance(s, str) for s in export.load(out).translate(payload["heldout"]["src"][:4]))


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


@pytest.mark.parametrize(
    "overrides",
    [(), ("keep_heads=2", "quantize=true"), ("precision=fp16", "fp16.min_agreement=0.75")],
    ids=["fp32", "int8", "fp16"],
)
def test_manifest_follows_the_schema(exported, overrides) -> None:
    """manifest.json has the keys of export.runtime.Manifest in its order, each of its declared type, and the
    exporter returns the same document (+ out)."""
    out, manifest = exported("transformer", *overrides)
    written = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    int8, fp16 = {"verification_int8", "int8_quality"}, {"verification_fp16"}
    optional = (
        {"shortlist"} | (fp16 if "precision=fp16" not in overrides else int8) | (int8 if not overrides else set())
    )
    assert list(written) == [k for k in rt.MANIFEST_KEYS if k not in optional]
    assert _conforms(written, rt.Manifest)
    assert manifest == {**written, "out": str(out)}


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


def test_existing_output_and_failed_verification_leave_nothing_half_written(ght_ps_unpruned) -> None:
    root, out, manifest = ght_ps_unpruned
    assert manifest["verification"]["passed"] and not (out / "keep.txt").exists()
    assert sorted(p.name for p in root.iterdir()) == ["existing"]
    # remove_heads=false keeps the gated-off heads in the graph: every module computes all its heads
    assert not manifest["heads_removed"] and manifest["head_plan"]
    assert all(h["num_heads"] == manifest["model_config"]["num_heads"] for h in manifest["heads"].values())
    assert manifest["size"]["flops_ratio"] == 1.0


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
