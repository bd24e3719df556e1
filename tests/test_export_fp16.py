"""float16 exports (`precision=fp16`, export/fp16.py): the graphs' interface as designed (integer inputs unchanged,
caches float16, the search's outputs float32), the manifest's precision and cache dtypes, the verification against
the fp32 model that onnxruntime's CPU provider runs, the runtime decoding them, and what is refused up front.

Every export here runs with one thread (`runtime.threads=1`): the two cores are shared. The smoke transformer (d64,
300 updates) has near-tied beams that float16's ~0.004 in log-probs may reorder (30 of its 32 held-out beam outputs
equal fp32's on this machine): its export asks for 75 % agreement rather than the default 90 %, so that another
CPU's rounding cannot fail it.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import export
import zoo
from export.exporter import export_checkpoint
from export.fp16 import FP32_OPS
from export.graph import ExportError
from export.precision import fp16_verdict, half_export
from export.runtime.search import Search
from tests.export_testing import export_config

FLOAT, HALF, INT64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL
FP16 = ("precision=fp16", "fp16.min_agreement=0.75")  # the overrides of the fp16 export every test here shares
SEARCH_OUTPUTS = {"logits", "log_probs", "top_log_probs", "alignment", "memory"}  # float32 in an fp16 export


def _io_types(path: Path) -> dict[str, int]:
    graph = onnx.load(str(path)).graph
    return {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}


def test_an_fp16_export_keeps_the_interface_and_verifies_against_fp32(exported, checkpoint_run) -> None:
    out, manifest = exported("transformer", *FP16)
    fp32_out, fp32_manifest = exported("transformer")  # another head plan: the same graph interface
    assert manifest["precision"] == "fp16" and fp32_manifest["precision"] == "fp32"
    assert manifest["name"] == "transformer-smoke-fp16"
    assert manifest["verification"]["passed"]  # the fp32 graphs verified strictly against torch first
    for graph in ("encoder", "decoder"):
        new, old = _io_types(out / f"{graph}.onnx"), _io_types(fp32_out / f"{graph}.onnx")
        assert list(new) == list(old) == [*manifest["graphs"][graph]["inputs"], *manifest["graphs"][graph]["outputs"]]
        for name, kind in old.items():
            if kind != FLOAT:
                assert new[name] == kind, name  # integer and boolean inputs/outputs unchanged
            else:  # the caches float16, what the search reads float32
                assert new[name] == (FLOAT if name in SEARCH_OUTPUTS else HALF), name
    assert {c["dtype"] for c in manifest["caches"]} == {"float16"}
    assert {c["dtype"] for c in fp32_manifest["caches"]} == {"float32"}
    assert {w["dtype"] for w in manifest["shared_weights"]} == {"float16"}
    decoder = onnx.shape_inference.infer_shapes(onnx.load(str(out / "decoder.onnx"))).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*decoder.value_info, *decoder.input, *decoder.output]}
    floats = [t for n in decoder.node for t in (types.get(i) for i in n.input) if t in (FLOAT, HALF)]
    assert floats.count(HALF) > 10 * floats.count(FLOAT)  # the graph computes in float16 …
    for node in decoder.node:
        if node.op_type in FP32_OPS:  # … but the vocabulary's log-softmax and top-k in float32
            assert all(types[i] != HALF for i in node.input if i in types), node.op_type
    assert {init.data_type for init in decoder.initializer} <= {HALF, INT64}

    v = manifest["verification_fp16"]
    assert v["passed"] and v["provider"] == "cpu" and not v["problems"]
    assert 0 < v["max_abs_log_probs_diff"] <= v["tolerance"] == 0.05
    assert v["agreement"] >= v["min_agreement"] == 0.75
    assert v["beam"]["total"] == v["sentences"] == len(json.loads((out / "heldout.json").read_text())["src"])

    # the runtime decodes it with float16 stores and float32 scores, as the fp32 model (torch) does
    model, reference = export.load(out, threads=1), zoo.load(str(checkpoint_run("transformer")))
    step = model.stepper(model.encode(np.array([[5, 6, 7, model.eos_id]], dtype=np.int64)), steps=2)
    assert {s.dtype for s in step.state.cache.stores if s is not None} == {np.dtype(np.float16)}  # half the memory
    lp, _ = step(np.array([model.bos_id]), 0, 3)
    assert lp.dtype == np.float32
    sources = json.loads((out / "heldout.json").read_text())["src"][:8]
    texts = model.translate(sources, beam_size=4)
    assert sum(a == b for a, b in zip(texts, reference.translate(sources, beam_size=4), strict=True)) >= 7
    got, want = model.score(sources, texts), reference.score(sources, texts)
    assert max(abs(a.score - b.score) for a, b in zip(got, want, strict=True)) <= v["tolerance"]


def test_a_shortlist_decoder_converts_with_its_branches(exported, tmp_path) -> None:
    """The shortlist decoder's If (export/graph.py) holds the output projection: both branches float16 (as are those
    of each self-attention's If on the rows: export/self_attention_by_rows.py), the logits they return cast once and
    normalised in float32; a shortlisted search decodes as the fp32 export's does."""
    source, manifest = exported("transformer", "shortlist.build=true")
    out = tmp_path / "fp16"
    shutil.copytree(source, out)
    manifest = json.loads((out / "manifest.json").read_text())
    half_export(out, manifest)
    decoder = onnx.load(str(out / "decoder.onnx")).graph
    branching = [n for n in decoder.node if n.op_type == "If"]  # the shortlist's, and each self-attention's by rows
    assert sum(not n.name.startswith("self_attention.") for n in branching) == 1
    for branch in (attribute for n in branching for attribute in n.attribute):
        assert [o.type.tensor_type.elem_type for o in branch.g.output] == [HALF]
    assert _io_types(out / "decoder.onnx")["logits"] == FLOAT
    model, reference = export.load(out, threads=1), export.load(source, threads=1)
    sources = json.loads((out / "heldout.json").read_text())["src"][:6]
    for search in (Search(beam_size=4, shortlist=1), Search(beam_size=1, shortlist=1)):
        got, want = model.translate(sources, search), reference.translate(sources, search)
        assert sum(a == b for a, b in zip(got, want, strict=True)) >= 5


def test_the_fp16_verdict_fails_outside_its_tolerance_and_agreement(exported) -> None:
    _, manifest = exported("transformer", *FP16)
    report = manifest["verification_fp16"]
    assert fp16_verdict(report, 0.9, "cpu")["passed"]
    tight = fp16_verdict({**report, "tolerance": report["max_abs_log_probs_diff"] / 2}, 0.9, "cpu")
    assert not tight["passed"] and "fp16.tolerance" in tight["problems"][0]
    overflow = fp16_verdict({**report, "max_abs_log_probs_diff": math.nan}, 0.9, "cpu")
    assert not overflow["passed"]  # NaN (an overflow somewhere) is no pass
    beam = {**report["beam"], "identical": report["beam"]["total"] // 2}
    disagreeing = fp16_verdict({**report, "beam": beam}, 0.9, "cpu")
    assert not disagreeing["passed"] and "fp16.min_agreement" in disagreeing["problems"][0]


def test_what_fp16_refuses_before_any_work(tmp_path) -> None:
    """Refused from the configuration alone: the checkpoint named here does not exist, and is never opened."""
    import onnxruntime

    missing = tmp_path / "no.pt"
    cases = {
        ("precision=fp8",): "precision='fp8': use one of fp32, fp16",
        ("precision=fp16", "quantize=true"): "INT8 quantisation works on fp32 graphs",
        ("precision=fp16", "fp16.provider=tpu"): "fp16.provider='tpu'",
        ("precision=fp16", "fp16.tolerance=0"): "give a tolerance > 0",
        ("precision=fp16", "fp16.min_agreement=1.5"): "agreement share in",
    }
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():  # this machine: CPU-only onnxruntime
        cases[("precision=fp16", "fp16.provider=cuda")] = (
            r"has no CUDAExecutionProvider to verify the fp16 graphs on; install onnxruntime-gpu .*fp16.provider=cpu"
        )
    for overrides, message in cases.items():
        with pytest.raises(ExportError, match=message):
            export_checkpoint(export_config(missing, tmp_path / "out", *overrides))
    assert not (tmp_path / "out").exists()
