"""`python -m zoo.step_profile +model=<entry>`: where a training update's time goes, and which trainer settings
make it faster, measured on the real update of `zoo.train` (its data, model, procedure and trainer preset).

Steps:
  build     the entry's trainer exactly as zoo.train builds it (its data, tokenizer, model, procedure), once per
            variant (a variant = trainer overrides, e.g. `variants='{fused: ["trainer.optimizer_kernel=fused"]}'`),
            each in its own process (the allocator, threads and compiled graphs are process-wide), every one from
            the same seed on the same batches; the processes take turns, the idle ones wait on a pipe
  warm up   `warmup_updates` updates each (torch.compile compiles here)
  time      `rounds` rounds of `updates_per_round` updates per variant, the variants' order alternating between
            rounds (so drift hits all alike); per-update wall seconds, medians and per-round ratios to the first
  profile   `profiled_updates` more updates per variant under torch.profiler: milliseconds per update by category
            (zoo/profiling.py) and the matmuls against torch's own speed on their shapes
  write     <out>/<name>.json, then every JSON of <out> rendered into <out>/PROFILE.md (zoo/profile_render.py)

The update is `Trainer.update` followed by the procedure's `after_update` (GHT's probes run every check_every
updates, so a window may or may not hold one: the median is what a typical update costs).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
import shutil
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import hydra
import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from torch.profiler import ProfilerActivity, profile

from zoo.data import build_splits, train_run_tokenizer
from zoo.errors import ZooError, one_line_errors
from zoo.machine import describe_machine
from zoo.model import build_model
from zoo.profile_render import render_profiles, write_profile
from zoo.profiling import median_and_spread, roofline_ms, summarize_profile
from zoo.runs import git_sha
from zoo.train import RunData, entry_procedure, model_config_from, prepare_data, trainer_config_from
from zoo.training.allocator import cpu_allocator
from zoo.training.threads import choose_threads, torch_threads
from zoo.training.trainer import Trainer

log = logging.getLogger("zoo.step_profile")


class ProfileError(ZooError):
    """A profile request that cannot run as given; printed without a traceback."""


def _variant_configs(cfg: DictConfig) -> dict[str, DictConfig]:
    """name → the composed config with that variant's trainer overrides (the first variant is the baseline)."""
    variants = OmegaConf.to_container(cfg.variants) if cfg.variants else {"as configured": []}
    out = {}
    for name, overrides in variants.items():  # type: ignore[union-attr]
        one = copy.deepcopy(cfg)
        for item in overrides:
            key, sep, value = str(item).partition("=")
            if not sep or not key.startswith("trainer.") or key.removeprefix("trainer.") not in cfg.trainer:
                raise ProfileError(
                    f"variants.{name}: {item!r} is not a trainer.<key>=<value> override of a key of the trainer preset"
                )
            OmegaConf.update(one, key, yaml.safe_load(value), merge=False)
        out[str(name)] = one
    return out


def _trainer(cfg: DictConfig, data: RunData, run_dir: Path) -> Trainer:
    settings = trainer_config_from(cfg.trainer)
    torch.manual_seed(settings.seed)
    model = build_model(model_config_from(cfg, data.tokenizer))
    return Trainer(
        model,
        data.tokenizer,
        data.train_pairs,
        data.splits.valid,
        data.valid_pairs,
        settings,
        run_dir,
        {},
        cfg.data.task,
        torch.device("cpu"),
        procedure=entry_procedure(cfg, started_from_weights=False),
    )


def _one_update(trainer: Trainer, group: list[list[int]]) -> tuple[float, float]:
    """Wall seconds and target tokens of one update (the procedure's after_update included)."""
    start = time.perf_counter()
    stats = trainer.update(group)
    trainer.state.step += 1
    trainer.procedure.after_update(trainer)
    return time.perf_counter() - start, stats["tokens"]


def _worker(raw_cfg: dict[str, Any], run_dir: str, conn: Connection) -> None:
    """One variant in its own process (its allocator, threads and compiled graphs are process-wide), driven over
    `conn`: ("updates", first, count) → [(seconds, tokens)], ("profile", first, count) → the profile summary,
    ("stop",)."""
    cfg = OmegaConf.create(raw_cfg)
    settings = trainer_config_from(cfg.trainer)
    threads = choose_threads(settings.threads)
    try:
        with torch_threads(threads.threads), cpu_allocator(settings.cpu_allocator):
            data = prepare_data(cfg, Path(run_dir), settings.seed, None)
            trainer = _trainer(cfg, data, Path(run_dir))
            trainer.procedure.on_start(trainer)
            batches = trainer.sampler.batches(0)
            conn.send(("ready", len(batches)))
            while True:
                command, *args = conn.recv()
                if command == "stop":
                    return
                first, count = args
                window = batches[first : first + count]
                if command == "updates":
                    conn.send(("ok", [_one_update(trainer, [b]) for b in window]))
                    continue
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    start = time.perf_counter()
                    for b in window:
                        _one_update(trainer, [b])
                    wall = time.perf_counter() - start
                summary = summarize_profile(prof.events(), wall, len(window))
                roof, shape_seconds = roofline_ms(summary["matmul"]["shapes"])
                summary["matmul"].update(roofline_ms_per_update=roof, shape_seconds=shape_seconds)
                conn.send(("ok", summary))
    except Exception as exc:  # the parent names the variant and stops the others
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _Variant:
    """The parent's handle on one worker process."""

    def __init__(self, name: str, cfg: DictConfig, run_dir: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child = ctx.Pipe()
        raw = OmegaConf.to_container(cfg, resolve=True)
        self.process = ctx.Process(target=_worker, args=(raw, str(run_dir), child), daemon=True)
        self.process.start()

    def ask(self, *message: Any) -> Any:
        if message:
            self.conn.send(message)
        status, value = self.conn.recv()
        if status == "error":
            raise ProfileError(f"variant {self.name}: {value}")
        return value

    def close(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()


def _shared_tokenizer(cfg: DictConfig, tmp: Path) -> Path:
    """The run tokenizer every variant reads: `tokenizer=`'s, or trained once here as zoo.train would."""
    path = tmp / "tokenizer.model"
    if cfg.tokenizer:
        shutil.copyfile(cfg.tokenizer, path)
    else:
        seed = trainer_config_from(cfg.trainer).seed
        path.write_bytes(train_run_tokenizer(build_splits(cfg.data).train, cfg.data, seed).model_bytes)
    return path


def measure(cfg: DictConfig) -> dict[str, Any]:
    """Start, warm up, time and profile every variant (one process each, driven in turn); returns the result."""
    configs = _variant_configs(cfg)
    base = next(iter(configs.values()))
    warm, rounds, per_round = int(cfg.warmup_updates), int(cfg.rounds), int(cfg.updates_per_round)
    profiled = int(cfg.profiled_updates)
    if min(rounds, per_round, profiled) < 1 or warm < 0:
        raise ProfileError(
            f"rounds={rounds}, updates_per_round={per_round}, profiled_updates={profiled}, warmup_updates={warm}: "
            "the first three must be at least 1 (the speeds and the where-the-time-goes table need them), "
            "warmup_updates at least 0"
        )
    needed = warm + rounds * per_round + profiled
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = _shared_tokenizer(base, Path(tmp))
        variants: dict[str, _Variant] = {}
        try:
            for name, c in configs.items():  # started together: nothing is timed while they build
                run_dir = Path(tmp) / f"variant{len(variants)}"
                run_dir.mkdir()
                shutil.copyfile(tokenizer, run_dir / "tokenizer.model")
                variants[name] = _Variant(name, c, run_dir)
            for v in variants.values():
                if (available := v.ask()) < needed:
                    raise ProfileError(f"the first epoch has {available} batches; the profile needs {needed}")
            for name, v in variants.items():
                start = time.perf_counter()
                v.ask("updates", 0, warm)
                log.info("%s: %d warm-up updates in %.1f s", name, warm, time.perf_counter() - start)
            seconds: dict[str, list[list[float]]] = {name: [] for name in variants}
            tokens: list[float] = []
            for r in range(rounds):
                order = list(variants) if r % 2 == 0 else list(reversed(variants))
                for name in order:
                    times = variants[name].ask("updates", warm + r * per_round, per_round)
                    seconds[name].append([t for t, _ in times])
                    if name == order[0]:
                        tokens.extend(n for _, n in times)
                log.info(
                    "round %d/%d: %s",
                    r + 1,
                    rounds,
                    ", ".join(f"{n} {median_and_spread(seconds[n][-1])['median']:.3f} s" for n in variants),
                )
            summaries = {name: v.ask("profile", warm + rounds * per_round, profiled) for name, v in variants.items()}
        finally:
            for v in variants.values():
                v.close()
    first = next(iter(variants))
    result_variants = {}
    for name in variants:
        medians = [median_and_spread(block)["median"] for block in seconds[name]]
        result_variants[name] = {
            "overrides": [str(o) for o in (cfg.variants or {}).get(name, [])],
            "seconds_per_update": median_and_spread([t for block in seconds[name] for t in block]),
            "round_medians": medians,
            "round_ratios": [median_and_spread(b)["median"] / m for b, m in zip(seconds[first], medians, strict=True)],
            "profile": summaries[name],
        }
    return {
        "format": 1,
        "entry": str(base.model.name),
        "trainer": OmegaConf.to_container(base.trainer, resolve=True),
        "tokens_per_update": median_and_spread(tokens),
        "rounds": rounds,
        "updates_per_round": per_round,
        "warmup_updates": warm,
        "variants": result_variants,
        "machine": describe_machine("cpu"),
        "git_sha": git_sha(),
    }


def step_profile(cfg: DictConfig) -> Path:
    """Measure, store and render; returns the stored JSON's path."""
    if "name" not in cfg.model:
        raise ProfileError("give an entry: python -m zoo.step_profile +model=transformer (entries: conf/model/)")
    settings = trainer_config_from(cfg.trainer)
    threads = choose_threads(settings.threads)
    with torch_threads(threads.threads):  # the parent's only work is the machine description
        result = measure(cfg)
    out = Path(cfg.out)
    path = write_profile(out, str(cfg.name or cfg.model.name), result)
    render_profiles(out)
    print(f"wrote {path} and {out / 'PROFILE.md'}", flush=True)
    return path


@hydra.main(config_path="../conf", config_name="step_profile", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(ProfileError):
        step_profile(cfg)


if __name__ == "__main__":
    main()
