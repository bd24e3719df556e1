"""`python -m zoo.train +model=<entry>`: build data, train, average, evaluate on test.

`train(cfg)` is the testable core; `main` is the thin Hydra entry point. `_train` reads as its steps:
  check    the trainer's settings (a TrainerConfig), procedure and generation options, rejected before a run
           directory exists
  run      a new run directory (config.yaml, provenance), or the resumed one with its saved config and settings
  data     the splits, the run's tokenizer (trained once per run, or init='s), the encoded training and validation
           pairs
  model    built from the entry and the tokenizer's vocabulary (or init='s architecture), its size printed
  trainer  the entry's procedure on init='s or init_from's weights or last.pt's state; fit, then average checkpoints
  test     beam search on the test split with the checkpoint evaluation picks
  summary  summary.json and the done marker
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from export.runtime.search import Search, SearchError
from zoo.attention import pool_key_value_heads
from zoo.checkpoint import load_checkpoint, model_from_checkpoint, resolve_checkpoint
from zoo.data import Splits, TextTokenizer, build_splits, load_tokenizer, train_run_tokenizer
from zoo.data.batching import encode_examples
from zoo.decoding.evaluation import evaluate_examples
from zoo.entries import entry_model_config, missing_model_message
from zoo.errors import ZooError, one_line_errors
from zoo.flops import format_size_summary, size_summary
from zoo.ght.branch import check_branch, point_of
from zoo.ght.options import GHTOptions
from zoo.ght.procedure import GHTProcedure
from zoo.model import ModelConfig, Transformer, build_model
from zoo.pretrained import Pretrained, load_pretrained, read_init, write_init
from zoo.runs import DONE_MARKER, RunBusyError, lock_run_dir, new_run_dir, resolve_resume, write_provenance
from zoo.training import branch_point
from zoo.training import distributed as dist
from zoo.training.allocator import cpu_allocator
from zoo.training.config import TrainerConfig
from zoo.training.threads import ThreadChoice, choose_threads, describe, torch_threads
from zoo.training.trainer import Trainer

log = logging.getLogger("zoo.train")

HELDOUT_SENTENCES = 32  # test sources stored in checkpoints for export verification away from the data


class UsageError(ZooError):
    """A configuration the user must change; printed without a traceback."""


def model_config_from(cfg: DictConfig, tokenizer: TextTokenizer) -> ModelConfig:
    """ModelConfig from the composed `model` node (entry + size) and the tokenizer's vocabulary."""
    try:
        return entry_model_config(
            cfg.model,
            vocab_size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"model entry {cfg.model.name!r} is invalid: {exc}") from exc


def trainer_config_from(node: DictConfig, where: str = "") -> TrainerConfig:
    """TrainerConfig from a `trainer` node (this command's, or `where`: a resumed run's saved config)."""
    try:
        return TrainerConfig.from_node(node)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}{exc}") from exc


def _effective_max_len(cfg: DictConfig, positions: int) -> int:
    """The training length filter: data.max_len, but never more than the model has `positions` for.

    Summaries at `data=summ` (max_len 512) with `size=tiny` (256 positions) would otherwise crash
    mid-epoch on the first long document instead of being filtered and counted up front.
    """
    max_len = int(cfg.data.max_len)
    if positions < max_len:
        log.warning(
            "data.max_len=%d exceeds the model's max_positions=%d; training on pairs of at most %d tokens "
            "(raise model.max_positions to keep longer ones)",
            max_len,
            positions,
            positions,
        )
    return min(max_len, positions)


def search_config(cfg: DictConfig) -> Search:
    return Search.from_generation(cfg.generation)


def _pick_device(name: str) -> torch.device:
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda":
        # SDPA without its cuDNN backend: cuDNN builds an execution plan per input shape, and our batches change
        # shape every update; memory-efficient attention (no per-shape set-up) was the fastest backend for a
        # training step on the H200 (results/h200/train_step*.json).
        torch.backends.cuda.enable_cudnn_sdp(False)
    return device


def _attach_log_file(run_dir: Path) -> None:
    handler = logging.FileHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)


def _prepare_run(cfg: DictConfig) -> tuple[DictConfig, Path, bool, IO[str] | None]:
    """Return (config to use, run dir, resuming?, the run dir's lock on the main rank). A resumed run uses its own
    saved config; a run another process is training is refused before anything in it is read or written."""
    resume_dir = None
    if cfg.resume not in (None, False):
        if str(cfg.resume) in ("latest", "true", "True") and "name" not in cfg.model:
            raise UsageError("resume=latest needs the entry: python -m zoo.train +model=<entry> resume=latest")
        entry = cfg.model.get("name", "")
        try:
            resume_dir = resolve_resume(cfg.resume, cfg.runs_root, entry, cfg.data.name)
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from exc
    if resume_dir is not None:
        lock = None
        if dist.is_main():
            try:
                lock = lock_run_dir(resume_dir)
            except RunBusyError as exc:
                raise UsageError(str(exc)) from exc
        saved = OmegaConf.load(resume_dir / "config.yaml")
        assert isinstance(saved, DictConfig)
        return saved, resume_dir, True, lock
    if "name" not in cfg.model:
        raise UsageError(missing_model_message())
    run_dir, lock = None, None
    if dist.is_main():
        run_dir = new_run_dir(cfg.runs_root, cfg.model.name, cfg.data.name)
        lock = lock_run_dir(run_dir)
        write_provenance(run_dir, cfg)
    return cfg, Path(dist.broadcast_object(str(run_dir))), False, lock


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train one entry end to end; returns a summary (run dir, size, test metrics).

    Runs with `trainer.threads` torch threads and `trainer.cpu_allocator`, taken from this command's config (also
    when resuming: they describe this machine now, not the saved run) and restored afterwards for an in-process
    caller.
    """
    settings = trainer_config_from(cfg.trainer)
    try:
        threads = choose_threads(settings.threads)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    with torch_threads(threads.threads), cpu_allocator(settings.cpu_allocator):
        return _train(cfg, settings, threads)


def _train(cfg: DictConfig, settings: TrainerConfig, threads: ThreadChoice) -> dict[str, Any]:
    device = _pick_device(cfg.device)
    dist.init_distributed(device)
    pretrained = _check_options(cfg)
    cfg, run_dir, resuming, lock = _prepare_run(cfg)
    try:
        return _train_run(cfg, settings, threads, device, run_dir, resuming, pretrained)
    finally:
        if lock is not None:
            lock.close()


def _train_run(
    cfg: DictConfig,
    settings: TrainerConfig,
    threads: ThreadChoice,
    device: torch.device,
    run_dir: Path,
    resuming: bool,
    pretrained: Pretrained | None,
) -> dict[str, Any]:
    """Train, evaluate and mark done one prepared (new or resumed) run directory; `pretrained` is init='s
    checkpoint on a new run (a resumed one reads its tokenizer and architecture from the run directory)."""
    if resuming:  # a resumed run goes on with the settings it was started with
        settings = trainer_config_from(cfg.trainer, where=f"{run_dir / 'config.yaml'}: ")
    if dist.is_main():
        _attach_log_file(run_dir)
    log.info("run directory: %s%s", run_dir, " (resuming)" if resuming else "")
    log.info("%s", describe(threads))
    torch.manual_seed(settings.seed)
    data = prepare_data(cfg, run_dir, settings.seed, pretrained)
    init = read_init(run_dir)
    model = build_model(init[0] if init else model_config_from(cfg, data.tokenizer)).to(device)
    if pretrained is not None:  # a new run: init='s weights (a resumed one loads last.pt's below)
        model.load_state_dict(pretrained.weights)
        log.info("initialised from %s (entry %s): its tokenizer, architecture and weights", *_origin(pretrained))
        if pretrained.replaced:
            log.info("init=: the checkpoint's architecture replaces the entry's %s", "; ".join(pretrained.replaced))
    size = size_summary(model)
    print(f"[{cfg.model.name}] {format_size_summary(size)}", flush=True)
    payload = _payload(cfg, data, size, init[1] if init else None)
    trainer = _trainer(cfg, settings, model, data, payload, run_dir, device, resuming)
    state = trainer.fit()
    trainer.average()
    summary: dict[str, Any] = {
        "run_dir": str(run_dir),
        "entry": cfg.model.name,
        "data": cfg.data.name,
        "updates": state.step,
        "train_minutes": round(state.elapsed_s / 60, 2),
        "stop_reason": state.stop_reason,
        "size": size,
    }
    if model.cfg.head_plan:
        summary["head_plan"] = model.cfg.head_plan
        summary["pruned_size"] = _report_pruned(model, cfg.model.name)
    if dist.is_main() and cfg.evaluate_test and data.splits.test:
        summary["test"] = _evaluate_test(cfg, run_dir, data, device, settings.progress)
    if dist.is_main():
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        (run_dir / DONE_MARKER).write_text(state.stop_reason + "\n")
    dist.cleanup()
    return summary


@dataclass
class RunData:
    """The splits, the run's tokenizer and the encoded training and validation pairs (the data step)."""

    splits: Splits
    tokenizer: TextTokenizer
    train_pairs: list[tuple[list[int], list[int]]]
    valid_pairs: list[tuple[list[int], list[int]]]


def _check_options(cfg: DictConfig) -> Pretrained | None:
    """Reject bad procedure, generation and init= options before a run directory is created (the trainer's
    settings are checked by TrainerConfig before this); returns init='s checkpoint for a new run."""
    if "name" in cfg.model:
        entry_procedure(cfg, started_from_weights=False)
    if cfg.get("branch_from") and cfg.resume in (None, False):
        try:
            check_branch(cfg)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    search_config(cfg)  # bad generation settings (SearchError), which only the test evaluation reads
    if not cfg.get("init") or cfg.resume not in (None, False):  # a resumed run goes on from its own directory
        return None
    if cfg.get("init_from"):
        raise UsageError(
            "init= and init_from= both given: init= fine-tunes a pretrained checkpoint from the entry's first "
            "stage, init_from= starts from a run's weights (GHT-PS at voting on a GHT; GQA/MQA uptrained from a "
            "transformer) — choose one"
        )
    if "name" not in cfg.model:
        raise UsageError(missing_model_message())
    return load_pretrained(str(cfg.init), cfg.model)


def _origin(pretrained: Pretrained) -> tuple[str, str]:
    return pretrained.origin["path"], pretrained.origin.get("entry") or "?"


def prepare_data(cfg: DictConfig, run_dir: Path, seed: int, pretrained: Pretrained | None) -> RunData:
    """Splits, tokenizer (trained once per run, or init='s with its architecture, written into the run directory
    so a resumed run reads the same) and encoded pairs; rank 0 builds the data cache and the tokenizer first, the
    other ranks then read them."""
    if dist.is_main():
        splits = build_splits(cfg.data)
    dist.barrier()
    if not dist.is_main():
        splits = build_splits(cfg.data)
    tok_path = run_dir / "tokenizer.model"
    if dist.is_main() and pretrained is not None:
        tok_path.write_bytes(pretrained.tokenizer)
        write_init(run_dir, pretrained)
    if dist.is_main() and not tok_path.exists():
        tok_path.write_bytes(train_run_tokenizer(splits.train, cfg.data, seed).model_bytes)
    dist.barrier()
    tokenizer = load_tokenizer(tok_path.read_bytes())
    init = read_init(run_dir)
    max_len = _effective_max_len(cfg, init[0].max_positions if init else int(cfg.model.max_positions))
    train_pairs, filtered = encode_examples(splits.train, tokenizer, max_len)
    valid_pairs, _ = encode_examples(splits.valid, tokenizer, max_len)
    log.info(
        "train pairs %d (filtered %d longer than %d tokens), valid %d, test %d",
        len(train_pairs),
        filtered,
        max_len,
        len(valid_pairs),
        len(splits.test),
    )
    return RunData(splits, tokenizer, train_pairs, valid_pairs)


def target_lengths(pairs: list[tuple[list[int], list[int]]]) -> dict[str, int]:
    """Median, 99th percentile and longest training target, in pieces (no eos): what an export of a summarizer
    bounds its summaries by (zoo.api.task_length_defaults), with no corpus at hand."""
    lengths = sorted(len(t) for _, t in pairs) or [0]
    pick = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": lengths[-1]}


def _payload(cfg: DictConfig, data: RunData, size: dict[str, Any], origin: dict[str, Any] | None) -> dict[str, Any]:
    """What every checkpoint carries besides weights, so export and evaluation need neither the corpus nor the
    config: entry, task, tokenizer, data config and statistics, held-out test pairs, size, and init='s origin."""
    payload = {
        "entry": cfg.model.name,
        "task": cfg.data.task,
        "tokenizer": data.tokenizer.to_bytes(),
        "data_config": OmegaConf.to_container(cfg.data, resolve=True),
        "data_stats": data.splits.stats,
        "heldout": {
            "src": [e.src for e in data.splits.test[:HELDOUT_SENTENCES]],
            "tgt": [e.tgt for e in data.splits.test[:HELDOUT_SENTENCES]],
        },
        "size": size,
        "target_lengths": target_lengths(data.train_pairs),
    }
    if origin:
        payload["initialised_from"] = origin
        if origin.get("generation"):  # a fine-tuned converted model keeps its author's search defaults
            payload["generation"] = origin["generation"]
    return payload


def _trainer(
    cfg: DictConfig,
    settings: TrainerConfig,
    model: Transformer,
    data: RunData,
    payload: dict[str, Any],
    run_dir: Path,
    device: torch.device,
    resuming: bool,
) -> Trainer:
    """The trainer with the entry's procedure, from init_from's weights on a fresh run, or at last.pt's update
    when resuming."""
    if cfg.get("init_from") and not resuming:
        _init_weights(model, cfg.init_from, data.tokenizer)
    procedure = entry_procedure(cfg, started_from_weights=bool(cfg.get("init_from")))
    trainer = Trainer(
        model,
        data.tokenizer,
        data.train_pairs,
        data.splits.valid,
        data.valid_pairs,
        settings,
        run_dir,
        payload,
        cfg.data.task,
        device,
        procedure=procedure,
    )
    if resuming:
        trainer.load_resume(run_dir / "checkpoints" / "last.pt")
    elif cfg.get("branch_from"):  # checked by _check_options before the run directory was made
        try:
            branch_point.load(trainer, point_of(Path(str(cfg.branch_from))))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        log.info("branched from %s at update %d", cfg.branch_from, trainer.state.step)
    return trainer


def _evaluate_test(
    cfg: DictConfig, run_dir: Path, data: RunData, device: torch.device, progress: bool
) -> dict[str, Any]:
    """Beam search on the test split with the checkpoint evaluation picks (avg.pt, else best.pt); hypotheses and
    metrics written to the run directory."""
    ckpt = resolve_checkpoint(run_dir)
    best = model_from_checkpoint(load_checkpoint(ckpt)).to(device)
    g = cfg.generation
    result = evaluate_examples(
        best,
        data.tokenizer,
        data.splits.test,
        cfg.data.task,
        search_config(cfg),
        remove_bpe=cfg.data.get("remove_bpe"),
        progress=progress,
        max_tokens=g.max_tokens,
        max_sentences=g.max_sentences,
    )
    metrics = {**result["metrics"], "checkpoint": ckpt.name}
    (run_dir / "test_hypotheses.txt").write_text("\n".join(result["hypotheses"]) + "\n")
    (run_dir / "test_metrics.json").write_text(json.dumps(metrics, indent=2))
    print(_format_test_line(cfg.model.name, cfg.data.task, metrics), flush=True)
    return metrics


def entry_procedure(cfg: DictConfig, started_from_weights: bool) -> GHTProcedure | None:
    """The entry's training procedure: GHT/GHT-PS when the entry has a `ght` block, else plain."""
    if "ght" not in cfg.model:
        if started_from_weights:
            log.info("init_from: starting plain training from the given weights")
        return None
    try:
        options = GHTOptions.from_config(OmegaConf.to_container(cfg.model.ght, resolve=True))
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    return GHTProcedure(options, started_from_weights=started_from_weights)


def _init_weights(model, location: str, tokenizer: TextTokenizer) -> None:
    """Start from another run's weights (same architecture), e.g. GHT-PS voting on a trained GHT; a grouped-query
    entry takes a multi-head run's weights with each group's key/value heads mean-pooled (uptraining). The weights'
    embedding rows must mean this run's tokens: the run that wrote them must have trained the same tokenizer."""
    payload = load_checkpoint(location)
    stored = payload.get("tokenizer")
    if stored is not None and bytes(stored) != tokenizer.to_bytes():
        raise UsageError(
            f"init_from={location}: that run's tokenizer differs from this run's (another seed, corpus or "
            "vocab_size), so its embeddings would mean other tokens; start from the run of the same seed and data"
        )
    state = dict(payload["model"])
    if pool_key_value_heads(model.attention_modules(), state):
        log.info("init_from: key/value heads mean-pooled per group into the grouped-query modules (uptraining)")
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise UsageError(f"init_from={location}: weights do not fit this entry's architecture ({exc})") from exc
    log.info("initialised weights from %s (entry %s)", payload["path"], payload.get("entry"))


def _report_pruned(model, entry: str) -> dict[str, Any]:
    """Print kept heads per module and the size of the physically pruned model."""
    pruned = build_model(ModelConfig.from_dict(model.cfg.to_dict()))
    pruned.load_state_dict(model.state_dict())
    pruned.apply_head_plan(model.cfg.head_plan, remove=True)
    for name, heads in model.cfg.head_plan.items():
        print(f"[{entry}] kept heads {name}: {heads}", flush=True)
    size = size_summary(pruned)
    print(f"[{entry}] pruned model: {format_size_summary(size)}", flush=True)
    return size


def _format_test_line(entry: str, task: str, m: dict[str, Any]) -> str:
    if task == "translation":
        head = f"test BLEU {m['bleu']:.2f} chrF {m['chrf']:.2f}"
        if "tokenized_bleu" in m:
            head += f" (tokenized BLEU {m['tokenized_bleu']:.2f})"
    else:
        head = f"test ROUGE-1 {m['rouge1']:.2f} ROUGE-2 {m['rouge2']:.2f} ROUGE-L {m['rougeL']:.2f}"
    return (
        f"[{entry}] {head} · {m['sentences']} sentences, beam {m['beam_size']}, "
        f"{m['sentences_per_s']:.1f} sent/s ({m['checkpoint']})"
    )


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(SearchError):
        train(cfg)


if __name__ == "__main__":
    main()
