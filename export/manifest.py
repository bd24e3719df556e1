"""manifest.json of an export directory: built from what the export step knew, written in the schema's key order,
and summarised for the console.

The keys and their types are written down once, as `export.runtime.Manifest` (a TypedDict in the runtime package,
because the Triton models get a copy of that package alone and read manifests with it). `build_manifest` fills every
key the schema requires; the export adds the optional ones (verification, INT8 results, timings) as it proceeds and
`write_manifest` writes whatever it has in the schema's order — so the file's bytes do not depend on the order in
which the exporter filled the dictionary.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy
import onnx
import onnxruntime
import onnxscript
import sentencepiece
import torch

from export.graph import CacheSpec
from export.runtime import (
    MANIFEST,
    MANIFEST_KEYS,
    NEXT_PREFIX,
    OLDEST_RUNTIME_FORMAT,
    RUNTIME_FORMAT,
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
    """sha256 of every file of the export but the manifest: the graphs, the tokenizer, the held-out sample, the
    vocabulary shortlist where there is one."""
    names = (graphs["encoder"]["file"], graphs["decoder"]["file"], TOKENIZER_FILE, HELDOUT_FILE)
    if (directory / SHORTLIST_FILE).exists():
        names += (SHORTLIST_FILE,)
    return {name: sha256_file(directory / name) for name in names}


SHARED_MIN_BYTES = 4096  # smaller tensors are not worth a separate copy (and may occur more than once in a file)


def shared_weights(directory: Path, graphs: Graphs) -> list[SharedWeight]:
    """The initializers the encoder and decoder graphs both hold, same name and same bytes (the tied embedding,
    the positions table), each located in the encoder's file, where the runtime reads one copy for both sessions
    without an ONNX parser. A tensor whose bytes occur more than once in the file is left to each graph."""
    encoder_path = directory / graphs["encoder"]["file"]
    data = encoder_path.read_bytes()
    encoder = onnx.load_from_string(data).graph.initializer
    decoder = onnx.load(str(directory / graphs["decoder"]["file"]), load_external_data=False).graph.initializer
    in_decoder = {init.name: init for init in decoder}
    shared = []
    for init in encoder:
        twin = in_decoder.get(init.name)
        if twin is None or len(init.raw_data) < SHARED_MIN_BYTES:
            continue
        if twin.raw_data != init.raw_data or twin.data_type != init.data_type or twin.dims != init.dims:
            continue
        offset = data.find(init.raw_data)
        if offset < 0 or data.find(init.raw_data, offset + 1) >= 0:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        shared.append(
            SharedWeight(name=init.name, dtype=dtype.name, shape=list(init.dims), file=encoder_path.name, offset=offset)
        )
    return shared


def build_manifest(
    directory: Path,
    *,
    name: str,
    payload: dict[str, Any],
    tokenizer: TextTokenizer,
    model: Transformer,
    plan: dict[str, list[int]],
    plan_source: str,
    heads_removed: bool,
    importance: dict[str, dict[int, float]] | None,
    graphs: Graphs,
    caches: list[CacheSpec],
    quantized: bool,
    size_before: dict[str, Any],
    size_after: dict[str, Any],
    search: Search,
    max_tokens: int,
    max_sentences: int,
    optimization_level: str,
    threads: int | None,
) -> Manifest:
    """The manifest of the export in `directory` (its files already written there): every required key of
    `export.runtime.Manifest`. `model` is the exported (pruned) model, `plan` the head plan it realises."""
    mcfg = model.cfg
    return Manifest(
        format_version=MANIFEST_FORMAT,
        # the oldest runtime that reads it: a decoder with a shortlist input needs format 3
        runtime_format=RUNTIME_FORMAT if "vocab_rows" in graphs["decoder"]["inputs"] else OLDEST_RUNTIME_FORMAT,
        name=name,
        entry=str(payload.get("entry")),
        data=(payload.get("data_config") or {}).get("name"),
        task=payload.get("task", "translation"),
        attention=mcfg.attention,
        attention_options=dict(mcfg.attention_options),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        checkpoint=CheckpointRef(path=payload["path"], sha256=sha256_file(Path(payload["path"]))),
        head_plan=plan,
        head_plan_source=plan_source,
        heads_removed=heads_removed,
        head_importance={n: {str(h): v for h, v in s.items()} for n, s in importance.items()} if importance else None,
        heads=heads_info(model, plan),
        model_config=mcfg.to_dict(),
        vocab=Vocab(
            size=mcfg.vocab_size, pad_id=mcfg.pad_id, unk_id=tokenizer.unk_id, bos_id=mcfg.bos_id, eos_id=mcfg.eos_id
        ),
        max_positions=mcfg.max_positions,
        tokenizer=TOKENIZER_FILE,
        heldout=HELDOUT_FILE,
        graphs=graphs,
        caches=[spec.to_dict() for spec in caches],  # type: ignore[misc]  # CacheSpec.to_dict is a CacheEntry
        next_prefix=NEXT_PREFIX,
        quantized=quantized,
        size=size_info(size_before, size_after),
        generation=GenerationDefaults(**asdict(search), max_tokens=max_tokens, max_sentences=max_sentences),
        runtime=RuntimeDefaults(graph_optimization_level=optimization_level, threads=threads),
        versions=versions(),
        files=checksums(directory, graphs),
        shared_weights=shared_weights(directory, graphs),
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
    for name, digest in m["files"].items():
        size = (out / name).stat().st_size if (out / name).exists() else 0
        lines.append(f"  {name:<16} {_fmt(size):>7}B  sha256 {digest[:16]}…")
    return "\n".join(lines)
