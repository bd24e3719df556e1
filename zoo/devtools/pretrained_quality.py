"""BLEU before and after pruning a converted translator that was fine-tuned here (issue 39).

    python -m zoo.devtools.pretrained_quality --work /tmp/pq    # build, convert, fine-tune, export, score (resumable)
    python -m zoo.devtools.pretrained_quality --render          # results/pretrained/README.md's block

No model hub is reachable here, and a model of OPUS-MT's size (6+6, d512, FFN 2048) costs about 8× the zoo's CPU
size per update, so the "pretrained" translator is a random-init MarianMTModel with OPUS-MT's architecture (swish,
scaled and tied embeddings, a final logits bias, Marian's position table, pad as the decoder's start, source and
target sentencepiece models sharing one vocabulary) at the zoo's CPU size (3+3, d256, 8 heads, FFN 1024), trained
here. It takes the README's path: `zoo.convert --from marian`, `zoo.train +model=transformer init=<converted>` on
deen for --updates updates (one thread; a stopped run is resumed), then `python -m export` of the trained checkpoint
unpruned and with each `keep_heads=K` (Michel et al. importance on the run's held-out pairs: the first 32 test
pairs). Every export translates the rest of the test split with its own search (beam 5); BLEU and chrF, and
sacreBLEU's paired bootstrap of each pruned export against the unpruned one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from tqdm import tqdm

import export
from zoo.checkpoint import load_checkpoint
from zoo.convert.__main__ import main as convert_main
from zoo.data import build_splits
from zoo.devtools.pretrained_speed import build_marian_directory
from zoo.entries import CONF_DIR
from zoo.machine import describe_machine
from zoo.metrics import corpus_chrf, paired_bootstrap
from zoo.report.speed_results import machine_slug
from zoo.runs import DONE_MARKER, git_sha

REPO = CONF_DIR.parent
RESULTS = REPO / "results" / "pretrained"
README = RESULTS / "README.md"
BLOCK = re.compile(r"(^<!-- pretrained:quality -->\n)(.*?)(^<!-- /pretrained:quality -->$)", re.DOTALL | re.MULTILINE)
SHAPE = {"d_model": 256, "encoder_layers": 3, "decoder_layers": 3, "heads": 8, "ffn_dim": 1024}  # conf/size/small
PIECES = 8_000  # each sentencepiece model's, as data.vocab_size of the zoo's own models
ENTRY = "transformer"  # the entry whose procedure fine-tunes the converted model (plain training)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, cwd=REPO, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} … failed (exit {proc.returncode}); its output is above")


def prepare(work: Path, splits: Any) -> Path:
    """The converted checkpoint of a random-init Marian model with our corpus's tokenizers (built once)."""
    marian, checkpoint = work / "marian", work / "converted.pt"
    if not (marian / "config.json").is_file():
        print("[pretrained_quality] training the tokenizers and building the model …", flush=True)
        build_marian_directory(
            marian, [e.src for e in splits.train], [e.tgt for e in splits.train], shape=SHAPE, pieces=PIECES
        )
    if not checkpoint.is_file():
        heldout = work / "heldout"
        heldout.mkdir(parents=True, exist_ok=True)
        (heldout / "src").write_text("".join(e.src + "\n" for e in splits.valid[:32]), encoding="utf-8")
        (heldout / "tgt").write_text("".join(e.tgt + "\n" for e in splits.valid[:32]), encoding="utf-8")
        convert_main(
            ["--from", "marian", str(marian), "--out", str(checkpoint), "--name", "marian-small", "--heldout"]
            + [str(heldout / "src"), str(heldout / "tgt")]
        )
    return checkpoint


def fine_tune(work: Path, checkpoint: Path, updates: int) -> Path:
    """The finished run directory of `zoo.train +model=transformer init=<checkpoint>` (one thread), resuming a
    stopped one."""
    runs = work / "runs"
    base = runs / f"{ENTRY}-deen"
    finished = sorted(d for d in base.glob("*") if (d / DONE_MARKER).exists()) if base.is_dir() else []
    if finished:
        return finished[-1]
    started = base.is_dir() and any((d / "checkpoints" / "last.pt").is_file() for d in base.iterdir())
    cmd = [sys.executable, "-m", "zoo.train", f"+model={ENTRY}", f"runs_root={runs}", "trainer.threads=1"]
    cmd += [f"trainer.max_updates={updates}", "trainer.max_minutes=0", "trainer.seed=1"]
    cmd += ["resume=latest"] if started else [f"init={checkpoint}"]
    _run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finished = sorted(d for d in base.glob("*") if (d / DONE_MARKER).exists())
    if not finished:
        raise SystemExit(f"zoo.train ended without finishing a run under {base}")
    return finished[-1]


def _heldout_count(run_dir: Path, splits: Any) -> int:
    """How many test pairs the run's checkpoint holds as held-out pairs (keep_heads= scores heads on them): the
    first ones of the test split, which the BLEU comparison leaves out."""
    checkpoint = json.loads((run_dir / "test_metrics.json").read_text())["checkpoint"]
    heldout = load_checkpoint(run_dir / "checkpoints" / checkpoint)["heldout"]["src"]
    if heldout != [e.src for e in splits.test[: len(heldout)]]:
        raise SystemExit(f"{run_dir}: the checkpoint's held-out pairs are not the first test pairs; retrain the run")
    return len(heldout)


def _export(run_dir: Path, out: Path, keep_heads: int | None, threads: int) -> Path:
    if (out / "manifest.json").is_file():
        return out
    checkpoint = json.loads((run_dir / "test_metrics.json").read_text())["checkpoint"]  # what the run evaluated
    cmd = [sys.executable, "-m", "export", f"checkpoint={run_dir / 'checkpoints' / checkpoint}", f"out={out}"]
    cmd += [f"name={out.name}", "overwrite=true", f"runtime.threads={threads}"]
    if keep_heads:
        cmd.append(f"keep_heads={keep_heads}")
    _run(cmd)
    return out


def score(directory: Path, sources: list[str], refs: list[str], threads: int) -> dict[str, Any]:
    """The export's translations of the test split with its own search, BLEU-scored."""
    model = export.load(directory, threads=threads)
    hyps = model.translate(sources)
    manifest = json.loads((directory / "manifest.json").read_text())
    return {
        "hypotheses": hyps,
        "beam_size": model.search.beam_size,
        "params": manifest["size"]["after"]["params"],
        "heads": {m: len(h["kept"]) for m, h in manifest["heads"].items()},
    }


def measure(args: argparse.Namespace) -> Path:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        data = compose("train", [f"+model={ENTRY}"]).data
    splits = build_splits(data)
    checkpoint = prepare(work, splits)
    run_dir = fine_tune(work, checkpoint, args.updates)
    variants = {"unpruned": None, **{f"keep_heads={k}": k for k in args.keep_heads}}
    skipped = _heldout_count(run_dir, splits)
    scored_on = splits.test[skipped:]  # not the pairs keep_heads= ranks the heads on
    sources, refs = [e.src for e in scored_on], [e.tgt for e in scored_on]
    scored = {
        name: score(_export(run_dir, work / f"export_{name.replace('=', '')}", k, args.threads), sources, refs, 2)
        for name, k in tqdm(variants.items(), desc="export and translate", unit="export")
    }
    base = scored["unpruned"]["hypotheses"]
    run_metrics = json.loads((run_dir / "test_metrics.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    machine = describe_machine()
    result = {
        "what": "random-init MarianMTModel (OPUS-MT's architecture, the zoo's CPU size), converted, fine-tuned here, "
        "exported unpruned and pruned",
        "measured": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "machine": machine,
        "shape": SHAPE,
        "pieces": PIECES,
        "training": {
            "entry": ENTRY,
            "updates": summary.get("updates", args.updates),
            "checkpoint": run_metrics["checkpoint"],
            "pytorch_test_bleu": run_metrics.get("bleu"),
            "run": str(run_dir.relative_to(work)),
        },
        "test_sentences": len(sources),
        "test_sentences_skipped": skipped,
        "variants": {},
    }
    for name, s in scored.items():
        entry = {"params": s["params"], "heads": s["heads"], "beam_size": s["beam_size"]}
        entry["chrf"] = round(corpus_chrf(s["hypotheses"], refs), 2)
        test = paired_bootstrap(base, s["hypotheses"], refs)
        entry["bleu"] = round(test["system"]["bleu"], 2)
        if name != "unpruned":
            entry["p_value"] = round(test["p_value"], 4)
            entry["changed"] = sum(a != b for a, b in zip(base, s["hypotheses"], strict=True))
        result["variants"][name] = entry
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"marian_small_quality-{machine_slug(machine['class'])}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"[pretrained_quality] wrote {out}", flush=True)
    return out


def render(result: dict[str, Any], source: str) -> str:
    """The README block: one row per export, BLEU/chrF and the paired bootstrap against the unpruned export."""
    m, t, shape = result["machine"], result["training"], result["shape"]
    head = (
        f"Rendered by `python -m zoo.devtools.pretrained_quality --render` from `{source}` ({m['cpu_model']}"
        + (f", {m['cpu_signature']}" if m.get("cpu_signature") else "")
        + f"). A random-init MarianMTModel with OPUS-MT's architecture at the zoo's CPU size "
        f"({shape['encoder_layers']}+{shape['decoder_layers']}, d{shape['d_model']}, {shape['heads']} heads, "
        f"FFN {shape['ffn_dim']}), converted, then trained here with `zoo.train +model={t['entry']} init=<converted>` "
        f"for {t['updates']:,} updates on deen (checkpoint {t['checkpoint']}; its PyTorch test BLEU "
        f"{t['pytorch_test_bleu']:.2f} on the whole test split) — a model trained here, not a real OPUS-MT checkpoint. "
        f"Each export translates the {result['test_sentences']:,} test sentences after the first "
        f"{result['test_sentences_skipped']} (the held-out pairs keep_heads= ranks the heads on) with its own search "
        f"(beam {result['variants']['unpruned']['beam_size']}); p: sacreBLEU's paired bootstrap against the unpruned "
        "export.\n"
    )
    rows = [
        "| export | heads kept | params | BLEU | chrF | Δ BLEU | p | outputs changed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = result["variants"]["unpruned"]
    for name, v in result["variants"].items():
        kept = "/".join(map(str, sorted(set(v["heads"].values()))))
        delta = "—" if name == "unpruned" else f"{v['bleu'] - base['bleu']:+.2f}"
        p = "—" if name == "unpruned" else f"{v['p_value']:.3f}"
        changed = "—" if name == "unpruned" else f"{v['changed']:,} of {result['test_sentences']:,}"
        rows.append(
            f"| {name} | {kept} of {shape['heads']} per module | {v['params'] / 1e6:.2f}M | {v['bleu']:.2f} | "
            f"{v['chrf']:.2f} | {delta} | {p} | {changed} |"
        )
    return head + "\n" + "\n".join(rows) + "\n"


def latest_result() -> Path:
    found = sorted(RESULTS.glob("marian_small_quality-*.json"))
    if not found:
        raise SystemExit(
            f"no stored measurement in {RESULTS}: run python -m zoo.devtools.pretrained_quality --work DIR"
        )
    return found[-1]


def readme_block() -> str:
    path = latest_result()
    return render(json.loads(path.read_text()), str(path.relative_to(REPO)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zoo.devtools.pretrained_quality", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--work", help="working directory (model, checkpoint, run, exports; resumable)")
    parser.add_argument("--updates", type=int, default=2400, help="fine-tuning updates of the converted model")
    parser.add_argument("--keep-heads", type=int, nargs="+", default=[4, 2], help="heads kept per module, per export")
    parser.add_argument("--threads", type=int, default=2, help="threads of the exports' verification")
    parser.add_argument("--render", action="store_true", help="rewrite results/pretrained/README.md's block")
    args = parser.parse_args(argv)
    if not args.render:
        if not args.work:
            parser.error("--work DIR is needed to measure (or give --render)")
        measure(args)
    text = README.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        raise SystemExit(f"{README} has no <!-- pretrained:quality --> … <!-- /pretrained:quality --> block")
    README.write_text(BLOCK.sub(lambda m: m.group(1) + readme_block() + m.group(3), text, count=1), encoding="utf-8")
    print(f"[pretrained_quality] {README}: pretrained:quality block rewritten", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
