"""Issue 67: the manifest is built from one export spec (export.manifest.ExportSpec) in place of 19 keywords, and
the spec is validated once, before anything is written down: values that disagree with each other or with the
exported model are an ExportError naming them. Tiny random models: no training, no ONNX."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from export.graph import ExportError, discover_caches
from export.manifest import ExportSpec
from export.pruning import prune
from export.runtime import AlignmentInfo, Search
from zoo.flops import size_summary
from zoo.model import ModelConfig, build_model

MODULE = "decoder.layers.0.self_attn"


def _spec(tmp_path: Path) -> ExportSpec:
    cfg = ModelConfig(vocab_size=32, d_model=16, encoder_layers=1, decoder_layers=1, num_heads=4, ffn_dim=32)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    pruned, _ = prune(model, {MODULE: [0, 2]})
    checkpoint = {"path": str(tmp_path / "model.pt"), "entry": "transformer", "task": "translation"}
    (tmp_path / "model.pt").write_bytes(b"only checksummed")
    return ExportSpec(
        name="tiny",
        checkpoint=checkpoint,  # type: ignore[arg-type]  # the keys the manifest reads
        tokenizer=None,  # type: ignore[arg-type]  # not read by validate
        size_before=size_summary(model),
        model=pruned,
        head_plan=pruned.cfg.head_plan,
        head_plan_source="json:plan.json",
        heads_removed=True,
        head_importance=None,
        caches=discover_caches(pruned),
        size_after=size_summary(pruned),
        graphs={"decoder": {"outputs": ["top_tokens", "alignment"]}},  # type: ignore[typeddict-item]  # what validate reads
        quantized=False,
        alignment=AlignmentInfo(output="alignment", layer=0, heads=[0, 1, 2, 3], reason=None),
        search=Search(),
        max_tokens=6000,
        max_sentences=128,
        graph_optimization_level="all",
        threads=None,
    )


def test_a_consistent_spec_validates(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec.validate() is spec and spec.head_plan == {MODULE: [0, 2]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"head_plan": {MODULE: [0, 1, 2]}}, "has 2 heads in the exported model, but the plan keeps 3"),
        ({"head_plan": {"decoder.layers.7.self_attn": [0]}}, "modules the exported model lacks"),
        ({"head_plan": {MODULE: [0, 0]}}, "is not a set of heads"),
        ({"head_plan": {MODULE: [0, 9]}}, "is not a set of heads"),
        ({"size_after": {"params": 1}}, "size_after lacks"),
        ({"caches": []}, "caches must be named once each"),
        (
            {"alignment": AlignmentInfo(output="alignment", layer=1, heads=[0], reason=None)},
            r"alignment.layer=1 is not",
        ),
        ({"graphs": {"decoder": {"outputs": ["top_tokens"]}}}, "alignment names output 'alignment', the decoder has"),
        ({"alignment": AlignmentInfo(output=None, layer=None, heads=[], reason=None)}, "needs the reason"),
    ],
)
def test_an_inconsistent_spec_is_refused_naming_the_value(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(ExportError, match=message):
        replace(_spec(tmp_path), **change).validate()


def test_a_spec_is_frozen(tmp_path: Path) -> None:
    with pytest.raises(AttributeError):
        _spec(tmp_path).name = "other"  # type: ignore[misc]
