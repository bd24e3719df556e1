"""Operators one GHT training step launches (forward, the group-constraint loss with its k-means, backward),
against the same step of the transformer it is built on.

Why: on a GPU shared by a suite's runs, GHT made ~3.5 updates/s to the transformer's ~16
(`results/h200/ght_4800_gpu_monitor*.log`), and removing its host syncs did not change that: under time-slicing a
run's rate follows the number of kernels it launches. This counts them on the CPU (the same operators launch the
GPU's kernels), so a change to GHT's step can be judged without a GPU.

usage: python -m zoo.devtools.ght_step_ops [ENTRY=ght]   (from the repository root: it composes conf/)
Prints the count of tensor operators that do work (views, reshapes and no-op casts left out) per step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.profiler import ProfilerActivity, profile

from zoo.data.batching import Batch
from zoo.devtools.train_step import batch, model_for
from zoo.ght.options import GHTOptions
from zoo.ght.procedure import GHTProcedure
from zoo.model import Transformer

# operators that only describe a tensor differently (no kernel on a GPU)
VIEWS = {
    "aten::t",
    "aten::reshape",
    "aten::view",
    "aten::transpose",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::select",
    "aten::slice",
    "aten::expand",
    "aten::expand_as",
    "aten::detach",
    "aten::unbind",
    "aten::permute",
    "aten::alias",
    "aten::as_strided",
    "aten::lift_fresh",
    "aten::_unsafe_view",
}


def working_ops(step: object) -> int:
    """Top-level ATen operators of one call of `step` that do work (a cast to the same dtype is a no-op)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    top = [e for e in prof.events() if e.name.startswith("aten::") and not _under_aten(e)]
    return sum(1 for e in top if e.name not in VIEWS and not (e.name == "aten::to" and not e.cpu_children))


def _under_aten(event: object) -> bool:
    parent = event.cpu_parent
    return parent is not None and parent.name.startswith("aten::")


def ght_options(entry: str) -> GHTOptions:
    """The entry's GHT options as conf/model/<entry>.yaml sets them (its feature map, groups, k-means)."""
    with initialize_config_dir(str(Path("conf").resolve()), version_base="1.3"):
        cfg = compose("train", overrides=[f"+model={entry}", "size=small"])
    return GHTOptions.from_config(dict(OmegaConf.to_container(cfg.model.ght)))


def training_step(model: Transformer, entry: str) -> object:
    """One step's closure for the entry: GHT's entries add their group-constraint loss."""
    src, tgt = batch(torch.device("cpu"))
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    data = Batch(src=src, tgt_in=tgt_in, tgt_out=tgt_out, ntokens=int(tgt_out.ne(0).sum()))
    procedure = None
    if entry.startswith("ght"):
        procedure = GHTProcedure(ght_options(entry))
        procedure.modules = dict(model.attention_modules())
        procedure._set_capture(True)

    def step() -> None:
        logits = model(data.src, data.tgt_in)  # [B, T, V]
        loss = F.cross_entropy(logits.transpose(1, 2), data.tgt_out, ignore_index=0)
        if procedure is not None:
            aux, _ = procedure.aux_loss(SimpleNamespace(bare=model), data)
            loss = loss + aux
        loss.backward()
        if procedure is not None:
            procedure.step += 1

    return step


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    entry = args[0] if args else "ght"
    torch.manual_seed(0)
    counts = {}
    for name in ("transformer", entry):
        model = model_for(name, torch.device("cpu"))
        step = training_step(model, name)
        for _ in range(3):
            step()  # warm: GHT's groups exist, as after its first update
        counts[name] = working_ops(step)
    print(
        f"{entry}: {counts[entry]} working operators per training step; transformer: {counts['transformer']} "
        f"(×{counts[entry] / counts['transformer']:.2f})"
    )


if __name__ == "__main__":
    main()
