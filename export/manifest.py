"""manifest.json of an export directory: built from the export's spec, written in the schema's key order, and
summarised for the console.

The keys and their types are written down once, as `export.runtime.Manifest` (a TypedDict in the runtime package,
because the Triton models get a copy of that package alone and read manifests with it). What the exporter's steps
decided is one `ExportSpec` (CTranslate2's converter: spec → validate → save); `build_manifest` validates it and
fills every key the schema requires; the export adds the optional ones (verification, INT8 results, timings) as it
proceeds and
`write_manifest` writes whatever it has in the schema's order — so the file's bytes do not depend on the order in
which the exporter filled the dictionary.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import onnx
import onnxruntime
import onnxscript
import sentencepiece
import torch

from export.graph import CacheSpec, ExportError
from export.runtime import (
    ALIGNMENT_OUTPUT,
    MANIFEST,
    MANIFEST_KEYS,
    NEXT_PREFIX,
    RUNTIME_FORMAT,
    AlignmentInfo,
    CheckpointRef,
    GenerationDefaults,
    Graphs,
    HeadsInfo,
    Manifest,
    RuntimeDefaults,
    Search,
    SharedWeight,
    SizeInfo,
    Vocab,
    sha256_file,
)
from export.runtime.shortlist import SHORTLIST_FILE
from zoo.checkpoint import CheckpointPayload
from zoo.data import TextTokenizer
from zoo.model import Transformer

MANIFEST_FORMAT = 1
# the tokenizer's one file, whatever its kind (a sentencepiece model or a shared-vocabulary document: the runtime's
# load_tokenizer tells them apart by content), under the name the export format fixes (EXPORT_FILES)
TOKENIZER_FILE = "tokenizer.model"
HELDOUT_FILE = "heldout.json"  # the held-out sample the export was verified on


def versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxscript": onnxscript.__version__,
        "sentencepiece": sentencepiece.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def heads_info(model: Transformer, plan: dict[str, list[int]]) -> dict[str, HeadsInfo]:
    """Per attention module of the exported model: heads in the graph, head size, the original indices kept and
    those the plan prunes."""
    every = list(range(model.cfg.num_heads))
    return {
        name: HeadsInfo(
            num_heads=module.num_heads,
            head_dim=module.head_dim,
            kept=plan.get(name, every),
            pruned=[h for h in every if h not in plan.get(name, every)],
        )
        for name, module in model.attention_modules().items()
    }


def size_info(before: dict[str, Any], after: dict[str, Any]) -> SizeInfo:
    return SizeInfo(
        before=before,
        after=after,
        params_ratio=after["params"] / before["params"],
        params_excl_emb_ratio=after["params_excl_emb"] / max(before["params_excl_emb"], 1),
        flops_ratio=after["flops"] / before["flops"],
    )


def checksums(directory: Path, graphs: Graphs) -> dict[str, str]:
    """sha256 of every file of the export but the manifest: the graphs and their weights, the tokenizer, the
    held-out sample, the vocabulary shortlist where there is one."""
    names = tuple(g[key] for g in (graphs["encoder"], graphs["decoder"]) for key in ("file", "data")) + (
        TOKENIZER_FILE,
        HELDOUT_FILE,
    )
    if (directory / SHORTLIST_FILE).exists():
        names += (SHORTLIST_FILE,)
    return {name: sha256_file(directory / name) for name in names}


SHARED_MIN_BYTES = 4096  # smaller tensors are not worth a separate copy


def shared_weights(directory: Path, graphs: Graphs) -> list[SharedWeight]:
    """The initializers the encoder and decoder graphs both hold, same name and same bytes (the tied embedding,
    the positions table), each located in the encoder's weights file, where the runtime reads one copy for both
    sessions without an ONNX parser."""
    encoder, decoder = (_weights_apart(directory, graphs[g]["file"]) for g in ("encoder", "decoder"))
    shared = []
    for name, (init, place) in encoder.items():
        twin = decoder.get(name)
        if twin is None or place[2] < SHARED_MIN_BYTES:
            continue
        other, other_place = twin
        same_kind = other.data_type == init.data_type and other.dims == init.dims
        if not same_kind or _read(directory, place) != _read(directory, other_place):
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        shared.append(SharedWeight(name=name, dtype=dtype.name, shape=list(init.dims), file=place[0], offset=place[1]))
    return shared


def _weights_apart(directory: Path, graph_file: str) -> dict[str, tuple[onnx.TensorProto, tuple[str, int, int]]]:
    """A graph's initializers kept in its weights file, by name: each with its (file, offset, length) there."""
    graph = onnx.load(str(directory / graph_file), load_external_data=False).graph
    apart = {}
    for init in graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in init.external_data}
            apart[init.name] = (init, (info["location"], int(info.get("offset", 0)), int(info["length"])))
    return apart


def _read(directory: Path, place: tuple[str, int, int]) -> bytes:
    with (directory / place[0]).open("rb") as fh:
        fh.seek(place[1])
        return fh.read(place[2])


SIZE_KEYS = ("params", "params_excl_emb", "flops", "src_len")  # of a size_summary the manifest's `size` reads


@dataclass(frozen=True)
class ExportSpec:
    """One export as the exporter's steps made it, each value once: what `build_manifest` writes down with the
    files of the export directory. Grouped by the step that decides them (export/exporter.py)."""

    # load
    name: str  # the public model name
    checkpoint: CheckpointPayload  # what the export is made from (manifest entry, data, task, checkpoint)
    tokenizer: TextTokenizer
    size_before: dict[str, Any]  # size_summary of the model as trained
    # plan and prune
    model: Transformer  # the exported model: heads removed physically (or gated, heads_removed=False)
    head_plan: dict[str, list[int]]  # the plan `model` realises, in original head indices
    head_plan_source: str  # where it came from: checkpoint, json:<file>, importance:…
    heads_removed: bool
    head_importance: dict[str, dict[int, float]] | None  # the scores, when the plan was computed from them
    caches: list[CacheSpec]  # the decoder's cache layout
    size_after: dict[str, Any]  # size_summary of `model`
    # graphs
    graphs: Graphs
    quantized: bool
    alignment: AlignmentInfo  # the decoder's `alignment` output: its layer and heads, or why there is none
    # the defaults the export is served with
    search: Search
    max_tokens: int
    max_sentences: int
    graph_optimization_level: str
    threads: int | None

    def validate(self) -> ExportSpec:
        """ExportError unless the values agree with each other and the exported model: what no reader of the
        manifest can check, lacking the model. Ranges of the serving defaults are the runtime's to check, once
        (export.runtime.manifest_checks), when the exporter loads the export it wrote."""
        modules = self.model.attention_modules()
        every = list(range(self.model.cfg.num_heads))
        unknown = sorted(set(self.head_plan) - set(modules))
        if unknown:
            raise ExportError(f"export spec: head_plan names modules the exported model lacks: {unknown}")
        for name, kept in self.head_plan.items():
            if not kept or len(set(kept)) != len(kept) or not set(kept) <= set(every):
                raise ExportError(f"export spec: head_plan[{name!r}]={kept} is not a set of heads of {every}")
        if self.heads_removed:
            for name, module in modules.items():
                kept = self.head_plan.get(name, every)
                if module.num_heads != len(kept):
                    raise ExportError(
                        f"export spec: {name} has {module.num_heads} heads in the exported model, but the plan keeps "
                        f"{len(kept)} ({kept})"
                    )
        for label, size in (("size_before", self.size_before), ("size_after", self.size_after)):
            missing = [key for key in SIZE_KEYS if key not in size]
            if missing:
                raise ExportError(f"export spec: {label} lacks {missing}; it must be a zoo.flops.size_summary")
        if self.size_before["params"] <= 0 or self.size_before["flops"] <= 0:
            raise ExportError(f"export spec: size_before has no params or FLOPs ({self.size_before})")
        names = [spec.name for spec in self.caches]
        if not names or len(set(names)) != len(names):
            raise ExportError(f"export spec: the decoder's caches must be named once each, got {names}")
        outputs = self.graphs["decoder"]["outputs"]
        align = self.alignment
        if align["output"] is not None:
            layers = self.model.cfg.decoder_layers
            if align["output"] != ALIGNMENT_OUTPUT or align["output"] not in outputs:
                raise ExportError(f"export spec: alignment names output {align['output']!r}, the decoder has {outputs}")
            if not isinstance(align["layer"], int) or not 0 <= align["layer"] < layers:
                raise ExportError(f"export spec: alignment.layer={align['layer']!r} is not one of {layers} layers")
        elif ALIGNMENT_OUTPUT in outputs or not align["reason"]:
            raise ExportError("export spec: a decoder without an alignment output needs the reason, and no output")
        if not Path(self.checkpoint["path"]).is_file():
            raise ExportError(f"export spec: the checkpoint {self.checkpoint['path']} is not a file to checksum")
        return self


def build_manifest(directory: Path, spec: ExportSpec) -> Manifest:
    """The manifest of the export in `directory` (its files already written there): every required key of
    `export.runtime.Manifest`, from `spec` once validated and from the files (checksums, shared weights)."""
    spec.validate()
    mcfg = spec.model.cfg
    graphs, payload, importance = spec.graphs, spec.checkpoint, spec.head_importance
    return Manifest(
        format_version=MANIFEST_FORMAT,
        runtime_format=RUNTIME_FORMAT,  # the oldest runtime that reads it: weights apart (graphs.*.data) need 4
        name=spec.name,
        entry=str(payload.get("entry")),
        data=(payload.get("data_config") or {}).get("name"),
        task=payload.get("task", "translation"),
        attention=mcfg.attention,
        attention_options=dict(mcfg.attention_options),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        checkpoint=CheckpointRef(path=payload["path"], sha256=sha256_file(Path(payload["path"]))),
        head_plan=spec.head_plan,
        head_plan_source=spec.head_plan_source,
        heads_removed=spec.heads_removed,
        head_importance={n: {str(h): v for h, v in s.items()} for n, s in importance.items()} if importance else None,
        heads=heads_info(spec.model, spec.head_plan),
        model_config=mcfg.to_dict(),
        vocab=Vocab(
            size=mcfg.vocab_size,
            pad_id=mcfg.pad_id,
            unk_id=spec.tokenizer.unk_id,
            bos_id=mcfg.bos_id,
            eos_id=mcfg.eos_id,
        ),
        max_positions=mcfg.max_positions,
        tokenizer=TOKENIZER_FILE,
        heldout=HELDOUT_FILE,
        graphs=graphs,
        caches=[c.to_dict() for c in spec.caches],  # type: ignore[misc]  # CacheSpec.to_dict is a CacheEntry
        next_prefix=NEXT_PREFIX,
        quantized=spec.quantized,
        precision="fp32",  # the graphs as written: the exporter's fp16 step converts them and says so
        size=size_info(spec.size_before, spec.size_after),
        generation=GenerationDefaults(
            **spec.search.settings(), max_tokens=spec.max_tokens, max_sentences=spec.max_sentences
        ),
        runtime=RuntimeDefaults(graph_optimization_level=spec.graph_optimization_level, threads=spec.threads),
        versions=versions(),
        files=checksums(directory, graphs),
        shared_weights=shared_weights(directory, graphs),
        alignment=spec.alignment,
    )


def manifest_dict(manifest: Manifest) -> dict[str, Any]:
    """The manifest as written: its keys in the schema's order (an unknown key is a bug, not data)."""
    unknown = sorted(set(manifest) - set(MANIFEST_KEYS))
    if unknown:
        raise KeyError(f"manifest keys {unknown} are not in the schema (export.runtime.Manifest)")
    return {key: manifest[key] for key in MANIFEST_KEYS if key in manifest}  # type: ignore[literal-required]


def write_manifest(directory: Path, manifest: Manifest) -> None:
    text = json.dumps(manifest_dict(manifest), indent=2, ensure_ascii=False) + "\n"
    (directory / MANIFEST).write_text(text, encoding="utf-8")


def _fmt(n: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def summary_table(m: dict[str, Any], out: Path) -> str:
    """Human-readable export summary: heads per module, sizes before/after, parity, files."""
    lines = [f"exported {m['name']} (entry {m['entry']}, attention {m['attention']}) → {out}"]
    lines.append(f"  {'module':<30} {'heads':>7} {'head_dim':>8}  kept (original head indices)")
    cfg_heads = m["model_config"]["num_heads"]
    for name, h in m["heads"].items():
        lines.append(f"  {name:<30} {h['num_heads']:>3}/{cfg_heads:<3} {h['head_dim']:>8}  {h['kept']}")
    s = m["size"]
    lines.append(f"  {'':<24} {'before':>10} {'after':>10} {'ratio':>7}")
    for label, key, ratio in (
        ("params", "params", "params_ratio"),
        ("params excl. embeddings", "params_excl_emb", "params_excl_emb_ratio"),
        (f"FLOPs @ src {s['before']['src_len']}", "flops", "flops_ratio"),
    ):
        lines.append(f"  {label:<24} {_fmt(s['before'][key]):>10} {_fmt(s['after'][key]):>10} {s[ratio]:>7.3f}")
    for key, label in (("verification", "fp32"), ("verification_int8", "int8")):
        v = m.get(key)
        if not v:
            continue
        lines.append(
            f"  verify {label}: max|Δlogits| ORT vs torch {v['max_abs_logits_diff']:.2e}, encoder "
            f"{v['max_abs_encoder_diff']:.2e}, cross caches (rel.) {v['max_abs_cross_cache_rel_diff']:.2e}, "
            f"pruned vs gated {v['pruned_vs_gated']:.2e} (tol {v['tolerance']:g}); "
            f"beam {v['beam']['beam_size']} {v['beam']['identical']}/{v['beam']['total']} identical, greedy "
            f"{v['greedy']['identical']}/{v['greedy']['total']}, translate {v['translate_identical']}/{v['sentences']}"
            f"; shapes {[(x['batch'], x['src_len']) for x in v['shapes']]}"
        )
    h = m.get("verification_fp16")
    if h:
        lines.append(
            f"  fp16 against fp32 ({h['provider']}): max|Δ log-prob| {h['max_abs_log_probs_diff']:.2e} (tol "
            f"{h['tolerance']:g}), max|Δlogits| {h['max_abs_logits_diff']:.2e}; beam {h['beam']['identical']}/"
            f"{h['beam']['total']} outputs equal (min {h['min_agreement']:.0%}), greedy {h['greedy']['identical']}/"
            f"{h['greedy']['total']}, translate {h['translate_identical']}/{h['sentences']}"
        )
    q = m.get("int8_quality")
    if q:
        lines.append(
            f"  int8 quality on {q['split']}, beam {q['beam_size']}: BLEU {q['bleu_fp32']:.2f} → "
            f"{q['bleu_int8']:.2f}, chrF {q['chrf_fp32']:.2f} → {q['chrf_int8']:.2f} (paired bootstrap "
            f"p={q['p_value']:.3f}: {'significant' if q['significant'] else 'no significant difference'}); "
            f"{q['identical_outputs']} outputs identical"
        )
    if m.get("timings_s"):
        lines.append("  time: " + ", ".join(f"{k} {v:.1f}s" for k, v in m["timings_s"].items()))
    g = m["graphs"]
    lines.append(
        f"  opset {g['decoder']['opset']}, IR {g['decoder']['ir_version']}; caches per layer: "
        + ", ".join(sorted({c["name"].split(".", 1)[1] for c in m["caches"]}))
    )
    kernel_rows = g["decoder"].get("self_attention_kernel_rows")
    if kernel_rows is not None:
        lines.append(
            f"  self-attention: onnxruntime's fused kernel up to {kernel_rows} rows a step, written out beyond"
        )
    for name, digest in m["files"].items():
        size = (out / name).stat().st_size if (out / name).exists() else 0
        lines.append(f"  {name:<17} {_fmt(size):>7}B  sha256 {digest[:16]}…")
    return "\n".join(lines)
