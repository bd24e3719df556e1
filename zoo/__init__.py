"""The attention zoo: multi-head-attention variants trained, pruned, exported and served.

How the code is laid out (tests/test_imports.py fails on any module-level import cycle):

* **Verbs are commands, nouns are library.** Commands are thin Hydra entry points — `zoo.train`, `zoo.evaluate`,
  `zoo.analyze`, `zoo.report`, `zoo.corpus`, `export` (`python -m export`), `serve.repository` / `serve.start` /
  `serve.bench` — that compose a config and call one testable function. Library modules never import Hydra.
  Commands whose arguments are free text or paths use ordinary flags: `zoo.translate`, and `zoo.convert` (a
  pretrained model's directory → a checkpoint; its library is the package, its `__main__` the thin command).
* **Layers import downward only.** `zoo.attention` is the leaf: the contract (`base.py`), one file per mechanism, the
  mixture-of-keys base they share and their FLOP helpers. Above it `zoo.model` (the encoder-decoder from a
  `ModelConfig`), then `zoo.data`, `zoo.decoding.generate`, `zoo.training.trainer`, `zoo.ght`, `zoo.checkpoint`,
  `zoo.metrics`,
  `zoo.flops`, `zoo.pretrained` (a run started from a checkpoint: `init=`); `zoo.convert` (on zoo.model,
  zoo.checkpoint, zoo.flops and the runtime's tokenizer) and the commands sit on top.
* **The runtime is the ground floor.** `export.runtime` (numpy, onnxruntime, sentencepiece) imports nothing of
  zoo, serve or the exporter, and importing it loads neither torch nor onnxruntime (its backend imports onnxruntime
  when it makes sessions); the `export` package only re-exports it. It owns the search's settings, results and
  errors and the tokenizers, and `zoo.data`, `zoo.decoding.generate`, `zoo.decoding.evaluation`, `zoo.convert` import
  them from it.
* **The exporter builds on `zoo` and the runtime.** `export.exporter` and the verifier import zoo (model, data,
  generation) to prune and check; a serving host needs only the export directory.
* **`serve` builds on `export.runtime`**, never on the model code (its nginx fetch reuses `zoo.data`'s Debian
  package cache); the Triton model directories carry a copy of `export` and import `export.runtime` like any
  caller. `zoo.report` orchestrates `zoo` and `export`.
* **`zoo.devtools` sits above everything**: one-off measurement scripts (`python -m zoo.devtools.<name>`) kept as
  the provenance of stored numbers (`results/h200/`); they may import `zoo` and `export`, and nothing imports them.
* Imports sit at module top; the few inside functions say why (optional dependency, start-up time, one
  process per measured engine). transformers is no dependency of any module: only the converter's parity tests
  import it (the `[hf]` extra).

Importing `zoo` has two process-wide effects, both below: the `div` config resolver, and OpenMP threads that
spin only briefly while they wait (GOMP_SPINCOUNT, unless the environment sets it or OMP_WAIT_POLICY). Every
`zoo.*` import runs this file first, so the commands get it before torch loads; a program that imports torch
before zoo does not.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

# libgomp, torch's OpenMP runtime, reads how long a waiting thread spins once, when torch loads it, so it is set
# here, before any zoo module imports torch. Its default (300,000 spins) burns the time slice a descheduled
# sibling needs: the CPU preset's training step on 2 cores next to one other CPU-bound process took 4.0 s instead
# of 0.60 s. Measured on this 2-core VM (`python -m zoo.bench`, quiet / one busy process): default 0.60 / 4.00 s,
# OMP_WAIT_POLICY=PASSIVE 0.68 / 1.06 s (14% slower when quiet), GOMP_SPINCOUNT=10000 0.61 / 1.26 s — as fast as
# the default on a quiet machine, 2.1× (not 6.7×) with a competitor. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
SPIN_COUNT = "10000"
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)

# `${div:${model.d_model},8}` lets an entry say "the 8-head baseline's head size" whatever the size preset.
OmegaConf.register_new_resolver("div", lambda a, b: int(a) // int(b), replace=True)

if TYPE_CHECKING:
    from zoo.api import Translator


def load(checkpoint: str, device: str = "cpu") -> Translator:
    """`zoo.load(run_dir_or_pt).translate(["Guten Morgen."])` — see zoo.api.Translator."""
    # imported here: every zoo.* import runs this file first, and zoo.api loads torch and the whole model stack
    from zoo.api import Translator

    return Translator.from_checkpoint(checkpoint, device=device)


__all__ = ["load"]
