"""Speed of a converted translator of OPUS-MT's size, unpruned and pruned, in process and served (issue 39).

    python -m zoo.devtools.pretrained_speed --work /tmp/opus        # build, convert, export, time; writes the JSON
    python -m zoo.devtools.pretrained_speed --render                # results/pretrained/README.md's block

No model hub is reachable here, so the model is random-init with OPUS-MT's shape (transformers' MarianMTModel: 6+6
layers, d_model 512, 8 heads, FFN 2048, swish, scaled and tied embeddings, a final logits bias, pad as decoder
start) and its tokenizers are source and target SentencePiece models trained on our corpus's training split (32k
pieces asked for each, merged into one vocabulary as OPUS-MT's are). It goes through the user's path — `zoo.convert
--from marian`, `python -m export` with and without `keep_heads` (Michel et al. importance on the held-out pairs),
fp32 and INT8 — and every sentence is decoded to its reference's token count (random weights have no natural
length; the work is what a model of this shape does on this test set). The numbers are of the shape, not of a real
OPUS-MT checkpoint's quality. Rounds are interleaved; medians and per-round ratios to the unpruned fp32 export.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from hydra import compose, initialize_config_dir
from tqdm import tqdm

from export.runtime.tokenizer import SharedVocabTokenizer
from zoo.convert.__main__ import main as convert_main
from zoo.convert.marian import marian_vocabulary
from zoo.data import build_splits
from zoo.entries import CONF_DIR
from zoo.machine import describe_machine
from zoo.report.speed_results import machine_slug
from zoo.runs import git_sha

REPO = CONF_DIR.parent
RESULTS = REPO / "results" / "pretrained"
README = RESULTS / "README.md"  # the block sits beside the result it renders
BLOCK = re.compile(r"(^<!-- pretrained:speed -->\n)(.*?)(^<!-- /pretrained:speed -->$)", re.DOTALL | re.MULTILINE)
SHAPE = {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "heads": 8, "ffn_dim": 2048}
PIECES = 32_000  # asked of each SentencePiece model; OPUS-MT de-en's two models give a 58,101-piece vocabulary
VARIANTS = ("unpruned", "pruned")
PRECISIONS = ("fp32", "int8")
SETTINGS = {"beam5_b32": (5, 32), "greedy_b1": (1, 1)}


def _sentencepiece(texts: list[str], pieces: int) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=pieces,
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=2,
        minloglevel=2,
    )
    return buf.getvalue()


def build_marian_directory(
    out: Path,
    train_src: list[str],
    train_tgt: list[str],
    shape: dict[str, int] = SHAPE,
    pieces: int = PIECES,
) -> None:
    """A save_pretrained directory of a random-init MarianMTModel of `shape` (OPUS-MT's unless told) with
    sentencepiece models of `pieces` trained on our corpus (the measurements of issue 39)."""
    import transformers  # the [hf] extra: only these measurements build a Marian model

    out.mkdir(parents=True, exist_ok=True)
    source, target = _sentencepiece(train_src, pieces), _sentencepiece(train_tgt, pieces)
    vocab = marian_vocabulary(source, target)
    (out / "source.spm").write_bytes(source)
    (out / "target.spm").write_bytes(target)
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(vocab)}, ensure_ascii=False))
    transformers.MarianTokenizer(
        str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json")
    ).save_pretrained(out)
    pad, eos = len(vocab) - 1, 0
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=shape["d_model"],
        encoder_layers=shape["encoder_layers"],
        decoder_layers=shape["decoder_layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn_dim"],
        decoder_ffn_dim=shape["ffn_dim"],
        max_position_embeddings=512,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=pad,
        forced_eos_token_id=eos,
        bad_words_ids=[[pad]],
    )
    torch.manual_seed(0)
    transformers.MarianMTModel(config).save_pretrained(out)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} … failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


def _export(checkpoint: Path, out: Path, keep_heads: int | None, precision: str, threads: int) -> Path:
    if (out / "manifest.json").is_file():
        return out
    cmd = [sys.executable, "-m", "export", f"checkpoint={checkpoint}", f"out={out}", f"name={out.name}"]
    cmd += ["overwrite=true", f"runtime.threads={threads}"]
    if keep_heads:
        cmd.append(f"keep_heads={keep_heads}")
    if precision == "int8":  # its BLEU cost means nothing on random weights: measured on 4 held-out pairs only
        cmd += ["quantize=true", "quantize_eval.split=heldout", "quantize_eval.sentences=4"]
    _run(cmd)
    return out


def measure(args: argparse.Namespace) -> Path | None:
    work = Path(args.work)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        data = compose("train", ["+model=transformer"]).data
    splits = build_splits(data)
    marian = work / "opus-mt-shape"
    if not (marian / "config.json").is_file():
        print("[pretrained_speed] training the tokenizers and building the model …", flush=True)
        build_marian_directory(marian, [e.src for e in splits.train], [e.tgt for e in splits.train])
    checkpoint = work / "opus-mt-shape.pt"
    if not checkpoint.is_file():
        heldout = work / "heldout"
        heldout.mkdir(parents=True, exist_ok=True)
        (heldout / "src").write_text("".join(e.src + "\n" for e in splits.test[:32]))
        (heldout / "tgt").write_text("".join(e.tgt + "\n" for e in splits.test[:32]))
        convert_main(
            ["--from", "marian", str(marian), "--out", str(checkpoint), "--heldout"]
            + [str(heldout / "src"), str(heldout / "tgt")]
        )
    exports = {
        (v, p): _export(checkpoint, work / f"opus_{v}_{p}", args.keep_heads if v == "pruned" else None, p, args.threads)
        for v in tqdm(VARIANTS, desc="export", unit="variant")
        for p in PRECISIONS
    }
    if args.prepare_only:
        print(f"[pretrained_speed] exports ready in {work}; time them with the same command without --prepare-only")
        return None
    tokenizer = SharedVocabTokenizer.from_bytes((exports["unpruned", "fp32"] / "tokenizer.model").read_bytes())
    workloads = {}  # sentences → (texts file, forced lengths file): batch 1 decodes fewer sentences
    for n in {args.sentences, args.sentences_b1}:
        test = splits.test[:n]
        texts, lengths = work / f"texts-{n}.txt", work / f"lengths-{n}.json"
        texts.write_text("".join(e.src + "\n" for e in test))
        lengths.write_text(json.dumps([len(t) for t in tokenizer.encode_targets([e.tgt for e in test])]) + "\n")
        workloads[n] = (texts, lengths)
    points = _rounds(work, exports, workloads, args)
    served = _served(work, exports, *workloads[args.sentences], args)
    manifests = {k: json.loads((d / "manifest.json").read_text()) for k, d in exports.items()}
    machine = describe_machine()
    result = {
        "what": "random-init MarianMTModel of OPUS-MT's shape, converted, exported unpruned and pruned",
        "measured": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "machine": machine,
        "shape": SHAPE,
        "vocab": manifests["unpruned", "fp32"]["vocab"]["size"],
        "keep_heads": args.keep_heads,
        "sentences": {s: args.sentences_b1 if n == 1 else args.sentences for s, (_, n) in SETTINGS.items()},
        "threads": args.threads,
        "rounds": args.rounds,
        "workload": "every test source decoded to its reference's target-token count (forced length)",
        "settings": {name: {"beam_size": b, "batch": n} for name, (b, n) in SETTINGS.items()},
        "served_settings": {"protocol": "grpc", "concurrency": 16, "instance_count": 2, "threads": 1, "beam_size": 5},
        "variants": {
            v: {
                "size": manifests[v, "fp32"]["size"]["after"],
                "heads": {m: len(h["kept"]) for m, h in manifests[v, "fp32"]["heads"].items()},
                "points": {f"{s}/{p}": points[v, p, s] for s in SETTINGS for p in PRECISIONS},
                "served": {p: served.get(f"opus_{v}_{p}") for p in PRECISIONS},
            }
            for v in VARIANTS
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"opus_mt_shape-{machine_slug(machine['class'])}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"[pretrained_speed] wrote {out}", flush=True)
    return out


def _rounds(work: Path, exports: dict, workloads: dict, args: argparse.Namespace) -> dict:
    """Every (round, variant, precision, setting) once in a fresh process, the order rotated per round."""
    keys = [(v, p, s) for v in VARIANTS for p in PRECISIONS for s in SETTINGS]
    plan = [(r, k) for r in range(args.rounds) for k in keys[r % len(keys) :] + keys[: r % len(keys)]]
    for r, (v, p, s) in tqdm(plan, desc="rounds", unit="point"):
        out = work / "rounds" / f"round{r + 1}" / f"{v}-{p}-{s}.json"
        if out.is_file():
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        beam, batch = SETTINGS[s]
        texts, lengths = workloads[args.sentences_b1 if batch == 1 else args.sentences]
        cmd = [sys.executable, "-m", "zoo.report.speed", "--model", str(exports[v, p]), "--texts", str(texts)]
        cmd += ["--lengths", str(lengths), "--batch", str(batch), "--beam-size", str(beam)]
        cmd += ["--threads", str(args.threads), "--out", str(out)]
        _run(cmd)
    taken: dict = {}
    for v, p, s in keys:
        runs = [
            json.loads((work / "rounds" / f"round{r + 1}" / f"{v}-{p}-{s}.json").read_text())
            for r in range(args.rounds)
        ]
        taken[v, p, s] = {
            "sentences_per_s": [t["sentences_per_s"] for t in runs],
            "peak_rss_mb": [t["peak_rss_mb"] for t in runs],
        }
    return taken


def _served(work: Path, exports: dict, texts: Path, lengths: Path, args: argparse.Namespace) -> dict:
    """Served sentences/s per export and round: one real tritonserver over every export (serve.bench)."""
    out = work / "served"
    if not (out / "results.json").is_file():
        dirs = [str(d) for d in exports.values()]
        cmd = [sys.executable, "-m", "serve.bench", f"exports=[{','.join(dirs)}]", f"sentences={texts}"]
        cmd += [f"lengths=[{','.join([str(lengths)] * len(dirs))}]", "client_batch=[1]", "tool=ours"]
        cmd += ["protocols=[grpc]", "concurrency=[16]", "no_batching_concurrency=[]", "baseline=false"]
        cmd += ["duration_s=20", f"repeats={args.rounds}", f"out={out}", "search.beam_size=5"]
        cmd += ["server.instance_count=2", "server.threads=1"]
        _run(cmd)
    results = json.loads((out / "results.json").read_text())
    return {
        point["model"]: {
            "sentences_per_s": point["rounds_sentences_per_s"] or [point["sentences_per_s"]],
            "errors": point["errors"],
        }
        for point in results["points"]
        if point["dynamic_batching"]
    }


def render(result: dict[str, Any], source: str) -> str:
    """The README block: one row per variant, sent/s medians and × the unpruned fp32 export (median per-round ratio)."""
    m = result["machine"]
    base = result["variants"]["unpruned"]

    def cell(values: list[float], reference: list[float]) -> str:
        ratios = [a / b for a, b in zip(values, reference, strict=True)]
        return f"{statistics.median(values):.1f} (×{statistics.median(ratios):.2f})"

    head = (
        f"Rendered by `python -m zoo.devtools.pretrained_speed --render` from `{source}`: {m['cpu_model']} "
        + (f"({m['cpu_signature']}, {m['cores']} cores)," if m.get("cpu_signature") else f"({m['cores']} cores),")
        + f" {result['threads']} ORT threads, the first {result['sentences']['beam5_b32']} "
        f"(batch 1: {result['sentences']['greedy_b1']}) test sources each decoded to its reference's length, "
        f"medians of {result['rounds']} interleaved rounds (× the unpruned fp32 export: median per-round ratio). "
        f"Random-init weights of OPUS-MT's shape (6+6, d512, 8 heads, FFN 2048, "
        f"vocabulary {result['vocab']:,}) — speed, not quality. Served: gRPC, 16 in flight, 2 instances × 1 thread.\n"
    )
    rows = [
        "| export | heads kept | params | beam 5 × 32 fp32 | INT8 | greedy × 1 fp32 | INT8 | served fp32 | INT8 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in result["variants"].items():
        kept = sorted(set(v["heads"].values()))
        cells = [
            cell(v["points"][f"{s}/{p}"]["sentences_per_s"], base["points"][f"{s}/fp32"]["sentences_per_s"])
            for s in SETTINGS
            for p in PRECISIONS
        ]
        cells += [
            cell(v["served"][p]["sentences_per_s"], base["served"]["fp32"]["sentences_per_s"]) for p in PRECISIONS
        ]
        label = name if name == "unpruned" else f"pruned (keep_heads={result['keep_heads']})"
        rows.append(
            f"| {label} | {'/'.join(map(str, kept))} of 8 per module | {v['size']['params'] / 1e6:.1f}M | "
            + " | ".join(cells)
            + " |"
        )
    return head + "\n" + "\n".join(rows) + "\n"


def latest_result() -> Path:
    found = sorted(RESULTS.glob("opus_mt_shape-*.json"))
    if not found:
        raise SystemExit(f"no stored measurement in {RESULTS}: run python -m zoo.devtools.pretrained_speed --work DIR")
    return found[-1]


def readme_block() -> str:
    path = latest_result()
    return render(json.loads(path.read_text()), str(path.relative_to(REPO)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.devtools.pretrained_speed", description=__doc__.split("\n")[0])
    parser.add_argument("--work", help="working directory (model, checkpoint, exports, rounds; resumable)")
    parser.add_argument("--keep-heads", type=int, default=4, help="heads kept per module in the pruned export")
    parser.add_argument("--sentences", type=int, default=200, help="test sources timed at batch 32 and served")
    parser.add_argument("--sentences-b1", type=int, default=40, help="test sources timed at batch 1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads of every timed process")
    parser.add_argument("--render", action="store_true", help="rewrite results/pretrained/README.md's block")
    parser.add_argument("--prepare-only", action="store_true", help="build, convert and export, time nothing")
    args = parser.parse_args(argv)
    if not args.render:
        if not args.work:
            parser.error("--work DIR is needed to measure (or give --render)")
        if measure(args) is None:
            return 0
    text = README.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        raise SystemExit(
            f"{README} has no <!-- pretrained:speed --> … <!-- /pretrained:speed --> block; add the markers"
        )
    README.write_text(BLOCK.sub(lambda m: m.group(1) + readme_block() + m.group(3), text, count=1), encoding="utf-8")
    print(f"[pretrained_speed] {README}: pretrained:speed block rewritten", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
