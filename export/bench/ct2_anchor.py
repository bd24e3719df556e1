"""CTranslate2 as an outside anchor for the runtime's speed (issue 88): the same dimensions, the same tokens, the
same number of decoder steps, timed interleaved on this machine.

    python -m export.bench.ct2_anchor --export exports/transformer-deen [--int8-export exports/transformer-deen-int8]
        [--searches greedy,beam5] [--batches 1,32] [--new-tokens 30] [--sentences 64] [--rounds 5] [--threads 1]
        [--src FILE] [--seed 0] [--work DIR] [--json results/runtime/ct2_anchor-<cpu signature slug>.json]

Why this shape. Our other benchmarks compare the runtime with itself (another commit) or with our torch path; an
anchor outside the project says whether our sentences/s are any good. CTranslate2 converts MarianMT, so the command
builds a randomly initialised `transformers` MarianMTModel of the export's dimensions (layers, d_model, heads, FFN,
vocabulary, activation, tied embeddings; seeded) and converts it with ctranslate2's TransformersConverter, fp32 and
with `--int8-export` int8. Weights do not matter for speed; dimensions and the number of decoder steps do, so:

* Only what CTranslate2 can represent: plain `mha`, unpruned heads of d_model / heads each, one source/target
  vocabulary. Anything else is refused in one line (what to anchor instead), never approximated.
* The same tokens: the sources are tokenised once by our runtime and CTranslate2 gets each id's piece from a
  vocabulary that maps the same pieces to the same ids (checked after the conversion; the one `<pad>` piece is
  renamed, since Marian's converter drops a trailing `<pad>` row).
* The same work: `--new-tokens N` is N tokens, i.e. N decoder runs, per sentence for both engines. Ours is forced
  to N tokens and then eos (`forced_limits`; at a step where every row can only be eos it runs no decoder);
  CTranslate2 gets `min_decoding_length = max_decoding_length = N` (eos banned before step N, the loop ends after
  step N, an eos it never emits costs no step: src/decoding.cc). Every output length is checked, and on the warm-up
  batch the decoder runs are counted (ours: decoder graph calls; CTranslate2 greedy: its per-step callback).
* Fair timing: every measurement is a fresh process (load, one untimed warm-up batch, the whole workload in
  length-sorted batches), so its peak RSS (VmHWM) is one engine's alone and neither imports torch; both get the same
  threads (ours `threads`, CTranslate2 `intra_threads`, `inter_threads=1`); rounds are interleaved with the engine
  order alternating, and each point reports the medians and the per-round ratios ours/CT2, whose median is the ratio.
* The strongest anchor (`--ct2-tuning best`, the default): CTranslate2's own CPU defaults can be far from its best
  on a machine (on a 2-vCPU Xeon VM its MKL backend at 2 threads ran greedy batch 1 at a fifth of its speed without
  MKL, and its int8 at 2 threads at a fifth to a ninth of its 1-thread speed). So before the rounds each point times
  CTranslate2 once on the first sentences under every setting it may use with at most `threads` cores — intra_threads
  `threads` or 1, GEMM backend Intel MKL or oneDNN (`CT2_USE_MKL=1/0`) — and the rounds time the fastest; every
  setting's figure is in the report. Ours runs as given: the anchor measures our defaults against CTranslate2 at its
  best. `--ct2-tuning default` times CTranslate2 as it configures itself.

One measurement is export/bench/ct2_worker.py, started by its path so that a CTranslate2 process never loads the
project. The report records the machine (export/bench/table.py `machine`) and the library versions; store it as
results/runtime/ct2_anchor-<cpu signature slug>.json (the machine's zoo.machine cpu_signature, slugged).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().with_name("ct2_worker.py")
REPO = WORKER.parents[2]
ENGINES = ("ours", "ct2")
ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}  # zoo's FFN activation → transformers'
PAD = "<pad>"  # the piece Marian's converter drops from the end of the vocabulary (with its weight rows)
DIMENSIONS = ("encoder_layers", "decoder_layers", "d_model", "num_heads", "ffn_dim", "vocab_size", "activation")
BACKENDS = {"mkl": {"CT2_USE_MKL": "1"}, "onednn": {"CT2_USE_MKL": "0"}}  # CTranslate2's x86 CPU GEMM backends
TUNING_SENTENCES = 16  # the calibration's workload per setting: the first length-sorted batches, at least this many


class AnchorError(Exception):
    """Why an export cannot be anchored, or why a measurement failed: one line."""


# ---------------------------------------------------------------------------------------------- what can be anchored
def check_representable(directory: str | Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The export's model_config where CTranslate2's Marian model has the same dimensions, else AnchorError naming
    what it cannot represent and what to anchor instead."""
    c, name = manifest["model_config"], Path(directory).name
    fix = "anchor a plain unpruned mha export of the same size (python -m export checkpoint=<transformer run>)"
    if manifest.get("attention") != "mha":
        raise AnchorError(
            f"{name}: attention {manifest.get('attention')!r} — CTranslate2 runs plain multi-head attention only; {fix}"
        )
    if manifest.get("heads_removed") and manifest.get("head_plan"):
        raise AnchorError(
            f"{name}: pruned heads in {len(manifest['head_plan'])} modules — CTranslate2 has one head "
            "count per model; export the checkpoint without head_plan/keep_heads to anchor it"
        )
    head_dims = {(h["num_heads"], h["head_dim"]) for h in manifest.get("heads", {}).values()}
    if c.get("head_dim") not in (None, c["d_model"] // c["num_heads"]) or head_dims - {
        (c["num_heads"], c["d_model"] // c["num_heads"])
    }:
        raise AnchorError(
            f"{name}: heads of another size than d_model / num_heads — CTranslate2's attention splits "
            f"d_model evenly; {fix}"
        )
    if c.get("source_vocab_size") not in (None, c["vocab_size"]):
        raise AnchorError(
            f"{name}: separate source and target vocabularies — CTranslate2's Marian model has one; "
            "anchor an export with one shared vocabulary"
        )
    if c.get("activation") not in ACTIVATIONS:
        raise AnchorError(f"{name}: activation {c.get('activation')!r} — not one of Marian's {list(ACTIVATIONS)}")
    if manifest.get("precision", "fp32") != "fp32":
        raise AnchorError(f"{name}: a {manifest['precision']} export is for the CUDA provider; anchor its fp32 export")
    return c


def read_export(directory: str | Path, quantized: bool) -> dict[str, Any]:
    """An export's manifest (the runtime's reader), checked to be anchorable and fp32 (`--export`) or INT8."""
    from export.runtime import ExportRuntimeError, read_manifest

    try:
        manifest = dict(read_manifest(directory, check_files=False))
    except ExportRuntimeError as exc:
        raise AnchorError(str(exc)) from None
    check_representable(directory, manifest)
    if bool(manifest.get("quantized")) != quantized:
        flag = "--int8-export" if manifest.get("quantized") else "--export"
        raise AnchorError(
            f"{Path(directory).name} is {'an INT8' if manifest.get('quantized') else 'an fp32'} "
            f"export: give it as {flag}"
        )
    return manifest


# ---------------------------------------------------------------------------------------------- the CTranslate2 model
def vocabulary(directory: Path, manifest: dict[str, Any]) -> tuple[list[str], bytes, bytes]:
    """id → piece of the export's tokenizer (the `<pad>` piece renamed: see PAD), and the source and target
    sentencepiece models MarianTokenizer reads."""
    from export.runtime.tokenizer import SentencePieceTokenizer, SharedVocabTokenizer, load_tokenizer

    data = (directory / manifest["tokenizer"]).read_bytes()
    tokenizer = load_tokenizer(data)
    if isinstance(tokenizer, SentencePieceTokenizer):
        pieces, models = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)], (data, data)
    elif isinstance(tokenizer, SharedVocabTokenizer):
        doc = json.loads(data)
        pieces = list(tokenizer.vocab)
        models = tuple(base64.b64decode(doc[k]) for k in ("source_model", "target_model"))
    else:
        raise AnchorError(
            f"{directory.name}: a Moses+BPE tokenizer — CTranslate2's Marian model reads one "
            "sentencepiece vocabulary; anchor a sentencepiece export"
        )
    size = manifest["model_config"]["vocab_size"]
    if len(pieces) > size:
        raise AnchorError(f"{directory.name}: the tokenizer has {len(pieces)} pieces for {size} ids; re-export it")
    pieces += [f"<unused{i}>" for i in range(len(pieces), size)]
    for i in [i for i, piece in enumerate(pieces) if piece == PAD]:  # never a source token: any unused name
        pieces[i] = f"<pad@{i}>"
        while pieces.count(pieces[i]) > 1:
            pieces[i] += "_"
    return pieces, models[0], models[1]


def build_marian(directory: Path, manifest: dict[str, Any], out: Path, seed: int) -> list[str]:
    """A seeded random MarianMTModel of the export's dimensions and its MarianTokenizer, saved in `out`
    (save_pretrained); its vocabulary is ours plus a trailing `<pad>` (the decoder start, dropped by the converter)."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    c, vocab = manifest["model_config"], manifest["vocab"]
    pieces, source, target = vocabulary(directory, manifest)
    out.mkdir(parents=True, exist_ok=True)
    (out / "source.spm").write_bytes(source)
    (out / "target.spm").write_bytes(target)
    (out / "vocab.json").write_text(json.dumps({**{p: i for i, p in enumerate(pieces)}, PAD: len(pieces)}))
    tokenizer = MarianTokenizer(
        str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
        eos_token=pieces[vocab["eos_id"]], unk_token=pieces[vocab["unk_id"]], pad_token=PAD,
    )  # fmt: skip
    v = len(pieces) + 1
    config = MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=c["d_model"], encoder_layers=c["encoder_layers"],
        decoder_layers=c["decoder_layers"], encoder_attention_heads=c["num_heads"],
        decoder_attention_heads=c["num_heads"], encoder_ffn_dim=c["ffn_dim"], decoder_ffn_dim=c["ffn_dim"],
        activation_function=ACTIVATIONS[c["activation"]], max_position_embeddings=manifest["max_positions"],
        pad_token_id=v - 1, decoder_start_token_id=v - 1, eos_token_id=vocab["eos_id"],
        scale_embedding=bool(c.get("scale_embedding", True)),
        share_encoder_decoder_embeddings=bool(c.get("share_all_embeddings")),
        tie_word_embeddings=bool(c.get("share_decoder_embeddings", True)), dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    MarianMTModel(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return pieces


def convert(hf_dir: Path, out: Path, quantization: str | None, pieces: list[str]) -> Path:
    """ctranslate2's TransformersConverter (what ct2-transformers-converter runs) on `hf_dir`; checks that the
    converted vocabulary is `pieces` in our id order, so both engines read the same ids."""
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(str(hf_dir)).convert(str(out), quantization=quantization, force=True)
    converted = json.loads((out / "shared_vocabulary.json").read_text(encoding="utf-8"))
    if converted != pieces:
        raise AnchorError(f"{out}: the converted vocabulary differs from the export's ({len(converted)} pieces)")
    return out


# ---------------------------------------------------------------------------------------------- one measurement
def measure(work_file: Path) -> dict[str, Any]:
    """One measurement in a fresh process (ct2_worker.py by its path, the repository on its import path), with the
    work file's `env` (a CTranslate2 backend) added to this process's environment."""
    extra = json.loads(work_file.read_text(encoding="utf-8")).get("env") or {}
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, **extra, "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(work_file)], cwd=REPO, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise AnchorError(f"measurement {work_file.name} failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- the run
def parse_searches(text: str) -> list[tuple[str, int]]:
    """greedy,beam5 → [("greedy", 1), ("beam5", 5)]."""
    out = []
    for name in filter(None, (s.strip() for s in text.split(","))):
        match = re.fullmatch(r"greedy|beam([1-9]\d*)", name)
        if not match:
            raise AnchorError(f"--searches: {name!r} is not greedy or beam<k> (e.g. greedy,beam5)")
        out.append((name, int(match.group(1) or 1)))
    return out


def workload(export_dir: Path, manifest: dict[str, Any], src: str | None, count: int) -> list[list[int]]:
    """`count` source sentences (a file, else the export's held-out sample, repeated) as our runtime's token ids."""
    import export

    path = Path(src) if src else export_dir / manifest["heldout"]
    text = path.read_text(encoding="utf-8")
    texts = [t for t in (text.splitlines() if src else json.loads(text)["src"]) if t.strip()]
    if not texts:
        raise AnchorError(f"{path}: no source sentences")
    return export.load(export_dir, threads=1).encode_texts((texts * (count // len(texts) + 1))[:count])


def sorted_batches(sentences: list[list[int]], batch: int) -> list[list[int]]:
    """Sentence indices in length-sorted batches, longest first (the first is also the warm-up batch)."""
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    return [order[j : j + batch] for j in range(0, len(order), batch)]


def summarise(point: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A point's record: each engine's per-round sentences/s, median and peak RSS; the per-round ratios ours/CT2."""
    ratios = [o["sentences_per_s"] / c["sentences_per_s"] for o, c in zip(runs["ours"], runs["ct2"], strict=True)]
    engines = {
        e: {
            "sentences_per_s": [r["sentences_per_s"] for r in rs],
            "median_sentences_per_s": round(statistics.median(r["sentences_per_s"] for r in rs), 3),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "after_load_mb": max(r["after_load_mb"] for r in rs),
            "runs": rs,
        }
        for e, rs in runs.items()
    }
    return {**point, **engines, "ratios": [round(r, 4) for r in ratios], "ratio": round(statistics.median(ratios), 4)}


def plan(
    args: argparse.Namespace, models: dict[str, dict[str, Path]], sentences: list[list[int]], work: Path
) -> list[tuple[dict[str, Any], dict[str, Path]]]:
    """Every search × batch × precision point and, per engine, the work file of its measurement (ct2_worker.py)."""
    planned = []
    for precision in models["ours"]:
        for search, beam in parse_searches(args.searches):
            for batch in args.batches:
                point = {"search": search, "beam_size": beam, "batch": batch, "precision": precision}
                base = {"sentences": sentences, "batches": sorted_batches(sentences, batch), "beam": beam,
                        "steps": args.new_tokens, "threads": args.threads, "spinning": args.spinning}  # fmt: skip
                files = {e: work / f"{e}-{precision}-{search}-b{batch}.json" for e in ENGINES}
                for engine, path in files.items():
                    path.write_text(json.dumps({**base, "engine": engine, "model": str(models[engine][precision])}))
                planned.append((point, files))
    return planned


def ct2_settings(threads: int) -> list[dict[str, Any]]:
    """The CTranslate2 settings `--ct2-tuning best` tries: every backend at `threads` intra-op threads and at 1."""
    return [{"threads": t, "backend": b} for t in dict.fromkeys((threads, 1)) for b in BACKENDS]


def setting_name(setting: dict[str, Any]) -> str:
    backend = {"mkl": "MKL", "onednn": "oneDNN", None: "its default backend"}[setting["backend"]]
    return f"{setting['threads']} thread{'s' if setting['threads'] > 1 else ''}, {backend}"


def tune_ct2(planned: list[tuple[dict[str, Any], dict[str, Path]]], settings: list[dict[str, Any]]) -> None:
    """Per point, CTranslate2 timed once on its first batches (≥ TUNING_SENTENCES sentences; the first is also the
    warm-up) under each setting; the point's work file then holds the fastest, and the point records every setting's
    sentences/s."""
    for point, files in planned:
        work = json.loads(files["ct2"].read_text(encoding="utf-8"))
        first: list[list[int]] = []
        for batch in work["batches"]:
            first.append(batch)
            if sum(map(len, first)) >= TUNING_SENTENCES:
                break
        trial, tried = files["ct2"].with_name(files["ct2"].stem + "-tuning.json"), []
        for setting in settings:
            env = BACKENDS[setting["backend"]]
            trial.write_text(json.dumps({**work, "batches": first, "threads": setting["threads"], "env": env}))
            tried.append({**setting, "sentences_per_s": measure(trial)["sentences_per_s"]})
        best = max(tried, key=lambda t: t["sentences_per_s"])
        files["ct2"].write_text(json.dumps({**work, "threads": best["threads"], "env": BACKENDS[best["backend"]]}))
        point["ct2_setting"] = {"threads": best["threads"], "backend": best["backend"], "tried": tried}
        figures = ", ".join(f"{setting_name(t)} {t['sentences_per_s']:.1f}" for t in tried)
        print(f"CT2 setting {point_name(point)}: {setting_name(best)} ({figures} sent/s)", flush=True)


def run_points(planned: list[tuple[dict[str, Any], dict[str, Path]]], rounds: int) -> list[dict[str, Any]]:
    """The points' records: rounds interleaved over the points, the engine order alternating per round."""
    runs: list[dict[str, list[dict[str, Any]]]] = [{e: [] for e in ENGINES} for _ in planned]
    for r in range(rounds):
        for (point, files), done in zip(planned, runs, strict=True):
            for engine in ENGINES if r % 2 == 0 else ENGINES[::-1]:
                done[engine].append(measure(files[engine]))
            ratio = done["ours"][-1]["sentences_per_s"] / done["ct2"][-1]["sentences_per_s"]
            print(f"round {r + 1}/{rounds} {point_name(point)}: ours/CT2 {ratio:.3f}", flush=True)
    return [summarise(point, done) for (point, _), done in zip(planned, runs, strict=True)]


def point_name(point: dict[str, Any]) -> str:
    return f"{point['search']} x {point['batch']} {point['precision']}"


def versions() -> dict[str, str | None]:
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {p: version(p) for p in ("ctranslate2", "onnxruntime", "transformers", "torch", "numpy")}


def report_name(signature: str | None) -> str:
    """results/runtime/ct2_anchor-<cpu signature slug>.json, the file a report is stored as."""
    slug = re.sub(r"[^a-z0-9]+", "-", (signature or "unknown-cpu").lower()).strip("-")
    return f"results/runtime/ct2_anchor-{slug}.json"


def table(report: dict[str, Any]) -> str:
    """The report as a markdown table, one row per point."""
    lines = [
        f"CTranslate2 anchor: {report['export']['name']} ({report['dimensions']}), {report['new_tokens']} new "
        f"tokens x {report['sentences']} sentences, {report['threads']} threads, {report['rounds']} rounds, "
        f"{report['machine'].get('cpu')} ({report['machine'].get('signature')})",
        "",
        "ours/CT2: the ratio of sentences/s (> 1: our runtime is faster), per round and its median; CT2 "
        + (
            "at its fastest setting per point (of intra_threads and GEMM backend, timed before the rounds)"
            if report.get("ct2_tuning", "default") == "best"
            else "as it configures itself"
        ),
        "",
        "| search | batch | precision | ours sent/s | CT2 sent/s | ours/CT2 | per round | ours peak MB | CT2 peak MB "
        "| CT2 setting |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for p in report["points"]:
        o, c = p["ours"], p["ct2"]
        setting = setting_name(p.get("ct2_setting") or {"threads": report["threads"], "backend": None})
        lines.append(
            f"| {p['search']} | {p['batch']} | {p['precision']} | {o['median_sentences_per_s']:.1f} | "
            f"{c['median_sentences_per_s']:.1f} | {p['ratio']:.2f} | {', '.join(f'{r:.2f}' for r in p['ratios'])} "
            f"| {o['peak_rss_mb']:.0f} | {c['peak_rss_mb']:.0f} | {setting} |"
        )
    return "\n".join(lines)


def differences(manifest: dict[str, Any]) -> list[str]:
    """Where the Marian model computes otherwise than the export at the same dimensions (a few vectors' work)."""
    out = []
    if manifest["model_config"].get("pre_norm"):
        out.append("ours pre-norm (one more layer norm per stack), CTranslate2's Marian post-norm")
    if manifest.get("head_plan"):
        out.append(f"ours gates heads off in {len(manifest['head_plan'])} modules (computed, then zeroed)")
    return out


def our_exports(export_dir: Path, int8_export: str | None) -> tuple[dict[str, Any], dict[str, Path]]:
    """The fp32 export's manifest, and our export per precision: the INT8 one must be of the same model."""
    manifest = read_export(export_dir, quantized=False)
    if not int8_export:
        return manifest, {"fp32": export_dir}
    int8 = read_export(int8_export, quantized=True)
    dims = [[m["model_config"].get(k) for k in DIMENSIONS] for m in (manifest, int8)]
    tokenizers = [m["files"][m["tokenizer"]] for m in (manifest, int8)]  # the tokenizer file's sha256
    if dims[0] != dims[1] or tokenizers[0] != tokenizers[1]:
        raise AnchorError(
            f"{Path(int8_export).name}: another model or tokenizer than {export_dir.name}; give the INT8 export of "
            "the same checkpoint"
        )
    return manifest, {"fp32": export_dir, "int8": Path(int8_export)}


def anchor(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Check the exports, build and convert the Marian model, time every point; the report."""
    from export.bench.table import machine

    export_dir = Path(args.export)
    manifest, ours = our_exports(export_dir, args.int8_export)
    if not 1 <= args.new_tokens <= manifest["max_positions"] - 2:
        raise AnchorError(f"--new-tokens {args.new_tokens}: give 1 … {manifest['max_positions'] - 2} (positions)")
    sentences = workload(export_dir, manifest, args.src, args.sentences)
    pieces = build_marian(export_dir, manifest, work / "marian", args.seed)
    quantization = {"fp32": None, "int8": "int8"}
    ct2 = {p: convert(work / "marian", work / f"ct2-{p}", quantization[p], pieces) for p in ours}
    c, planned = manifest["model_config"], plan(args, {"ours": ours, "ct2": ct2}, sentences, work)
    if args.ct2_tuning == "best":
        tune_ct2(planned, ct2_settings(args.threads))
    return {
        "kind": "ct2_anchor", "issue": 88, "machine": machine(), "versions": versions(),
        "export": {"name": manifest["name"], "dir": str(export_dir), "checkpoint": manifest["checkpoint"]},
        "int8_export": str(args.int8_export) if args.int8_export else None,
        "dimensions": ", ".join(f"{k} {c[k]}" for k in DIMENSIONS),
        "model_config": {**{k: c[k] for k in DIMENSIONS}, "pre_norm": c.get("pre_norm", False)},
        "differences": differences(manifest),
        "new_tokens": args.new_tokens, "sentences": args.sentences, "rounds": args.rounds, "threads": args.threads,
        "ours_spinning": args.spinning or "the runtime's default",
        "seed": args.seed, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "ct2_tuning": args.ct2_tuning,
        "points": run_points(planned, args.rounds),
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m export.bench.ct2_anchor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--export", required=True, help="fp32 export directory (plain mha, unpruned)")
    ap.add_argument("--int8-export", help="its INT8 export (quantize=true): also times CTranslate2 int8 against it")
    ap.add_argument("--searches", default="greedy,beam5", help="greedy and/or beam<k>, comma-separated")
    ap.add_argument("--batches", default="1,32", type=lambda s: [int(b) for b in s.split(",")], help="batch sizes")
    ap.add_argument("--new-tokens", type=int, default=30, help="tokens (decoder runs) per sentence")
    ap.add_argument("--sentences", type=int, default=64, help="workload: sentences, the held-out sample repeated")
    ap.add_argument("--src", help="source sentences, one per line (default: the export's heldout.json)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each a fresh process per engine)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of both engines")
    ap.add_argument(
        "--spinning",
        choices=["false", "true", "decoder", "shared"],
        help="our runtime's spinning setting (export.load spinning=; default: load's own default)",
    )
    ap.add_argument(
        "--ct2-tuning",
        choices=["best", "default"],
        default="best",
        help="time CTranslate2 at its fastest setting per point (threads ≤ --threads, MKL or oneDNN) or as it "
        "configures itself",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the random Marian weights")
    ap.add_argument("--work", help="keep the Marian and CTranslate2 models here (default: a temporary directory)")
    ap.add_argument(
        "--json", help="write the report here (stored: results/runtime/ct2_anchor-<cpu signature slug>.json)"
    )
    args = ap.parse_args(argv)
    try:
        if min(args.batches) < 1 or args.rounds < 1 or args.sentences < 1 or args.threads < 1:
            ap.error("--batches, --rounds, --sentences and --threads take positive integers")
        with tempfile.TemporaryDirectory(prefix="ct2_anchor-") as tmp:
            work = Path(args.work) if args.work else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            report = anchor(args, work)
    except AnchorError as exc:
        print(f"ct2_anchor: {exc}", file=sys.stderr)
        return 2
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json} (stored reports: {report_name(report['machine'].get('signature'))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
