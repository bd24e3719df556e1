"""`python -m zoo.evaluate checkpoint=… split=test` (or `src=… ref=…`): BLEU/chrF or ROUGE with beam
search, per data source, sentences/s, model size — printed and written as JSON + hypotheses; with `nbest=N`
also the N best hypotheses per source with their scores, as `<split>_nbest.txt` in the Moses/fairseq
format `i ||| hypothesis ||| score` (i counts sources from 0; best first; the score is zoo.decoding.generate's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig

from export.runtime.search import Search, SearchError
from zoo.checkpoint import CheckpointPayload, load_checkpoint, model_from_checkpoint
from zoo.data import DataError, Example, build_splits, load_tokenizer
from zoo.decoding.evaluation import Translation, evaluate_examples
from zoo.errors import one_line_errors
from zoo.flops import format_size_summary, size_summary


def _read_lines(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass existing files as src=… ref=…")
    try:
        return p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{p} is not valid UTF-8 ({exc}); re-encode it as UTF-8") from exc


def _examples(cfg: DictConfig, payload: CheckpointPayload) -> tuple[list[Example], str]:
    if cfg.src or cfg.ref:
        if not (cfg.src and cfg.ref):
            raise DataError("give both src=FILE and ref=FILE (or neither, to use split=…)")
        srcs, refs = _read_lines(cfg.src), _read_lines(cfg.ref)
        if len(srcs) != len(refs):
            raise DataError(f"{cfg.src} has {len(srcs)} lines but {cfg.ref} has {len(refs)}; they must align")
        return [Example(s, r, "files") for s, r in zip(srcs, refs, strict=True)], Path(cfg.src).stem
    if cfg.split not in ("test", "valid"):
        raise DataError(f"split={cfg.split!r}: use test or valid")
    if "converted_from" in payload:  # zoo.convert: no corpus of ours made it
        raise DataError(f"{payload['path']} is a converted pretrained model with no corpus; pass src=FILE ref=FILE")
    splits = build_splits(payload["data_config"])
    return list(getattr(splits, cfg.split)), cfg.split


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    payload = load_checkpoint(cfg.checkpoint)
    model = model_from_checkpoint(payload).to(cfg.device)
    tokenizer = load_tokenizer(payload["tokenizer"])
    examples, name = _examples(cfg, payload)
    if cfg.limit:
        examples = examples[: int(cfg.limit)]
    g = cfg.generation
    search = Search.from_generation(g)
    nbest = cfg.nbest  # checked once, before decoding anything, by translate_texts_nbest
    task = payload.get("task", "translation")
    result = evaluate_examples(
        model,
        tokenizer,
        examples,
        task,
        search,
        remove_bpe=payload["data_config"].get("remove_bpe"),
        progress=sys.stderr.isatty(),
        nbest=nbest,
        max_tokens=g.max_tokens,
        max_sentences=g.max_sentences,
    )
    size = size_summary(model)
    metrics = {
        "entry": payload.get("entry"),
        "checkpoint": payload["path"],
        "split": name,
        **result["metrics"],
        "size": size,
    }
    ckpt_path = Path(payload["path"])
    out = (
        Path(cfg.out)
        if cfg.out
        else (ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else ckpt_path.parent) / "eval"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}_metrics.json").write_text(json.dumps(metrics, indent=2))
    (out / f"{name}_hypotheses.txt").write_text("\n".join(result["hypotheses"]) + "\n")
    if nbest is not None:
        (out / f"{name}_nbest.txt").write_text(nbest_lines(result["nbest"]), encoding="utf-8")
    _print(metrics, task, out)
    return metrics


def nbest_lines(nbest: list[list[Translation]]) -> str:
    """The Moses/fairseq n-best format: `i ||| hypothesis ||| score` per hypothesis, sources in order from 0,
    each source's hypotheses best first."""
    return "".join(f"{i} ||| {h.text} ||| {h.score:.6f}\n" for i, hyps in enumerate(nbest) for h in hyps)


def _print(m: dict[str, Any], task: str, out: Path) -> None:
    keys = ("bleu", "chrf", "tokenized_bleu") if task == "translation" else ("rouge1", "rouge2", "rougeL")
    line = " ".join(f"{k} {m[k]:.2f}" for k in keys if k in m)
    print(
        f"[{m['entry']}] {m['split']}: {line} · {m['sentences']} sentences, beam {m['beam_size']}, "
        f"{m['sentences_per_s']:.1f} sent/s"
    )
    for origin, sub in sorted(m.get("per_source", {}).items()):
        print(f"    {origin:>12}: " + " ".join(f"{k} {v:.2f}" for k, v in sub.items() if k != "n") + f" (n={sub['n']})")
    print(f"    {format_size_summary(m['size'])}")
    print(f"    written to {out}")


@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(SearchError):
        evaluate(cfg)


if __name__ == "__main__":
    main()
