"""Training-step time of whole small models on one device: the MHA entry under each SDPA backend vs others.

Why: on the H200 the entries on the fused-attention path trained slower than the rest in a shared run; this
timed a bf16 step of the whole `size=small` model per SDPA backend, which is why zoo.train runs SDPA without its
cuDNN backend on CUDA (`results/h200/train_step*.json`).

usage: python -m zoo.devtools.train_step [DEVICE=cuda] [STEPS=50] [OUT_JSON]
environment: VARY=1 cycles through 12 batch shapes; ONLY=<entry> times that entry's default backend alone.
Run from the repository root (it composes conf/).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from torch.nn.attention import SDPBackend, sdpa_kernel

from zoo.entries import entry_model_config
from zoo.model import Transformer, build_model

# (entry, SDPA backend or None for torch's choice, padded batch); the transformer is timed again last for drift
CASES: list[tuple[str, SDPBackend | None, bool]] = [
    ("transformer", None, True),
    ("transformer", None, False),
    ("transformer", SDPBackend.MATH, True),
    ("transformer", SDPBackend.EFFICIENT_ATTENTION, True),
    ("transformer", SDPBackend.CUDNN_ATTENTION, True),
    ("mixhead_a", None, True),
    ("mgk_4head", None, True),
    ("transformer", None, True),
]


def model_for(entry: str, device: torch.device) -> Transformer:
    """The entry at size=small (8000-token vocabulary), in training mode on `device`."""
    with initialize_config_dir(str(Path("conf").resolve()), version_base="1.3"):
        cfg = compose("train", overrides=[f"+model={entry}", "size=small"])
    mc = entry_model_config(cfg.model, vocab_size=8000, pad_id=0, bos_id=1, eos_id=2)
    return build_model(mc).to(device).train()


def batch(device: torch.device, b: int = 64, s: int = 30, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch of `b` sentences of ≤ `s` tokens (lengths s/3 … s when padded)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, 8000, (b, s), generator=g)
    tgt = torch.randint(3, 8000, (b, s + 1), generator=g)
    if padded:
        for i in range(b):
            n = int(torch.randint(s // 3, s + 1, (1,), generator=g))
            src[i, n:] = 0
            tgt[i, n + 1 :] = 0
    return src.to(device), tgt.to(device)


def time_steps(
    model: Transformer,
    src: torch.Tensor,
    tgt: torch.Tensor,
    steps: int,
    device: torch.device,
    backend: SDPBackend | None = None,
) -> float:
    """Milliseconds per bf16 training step (forward, backward, Adam), after 10 warm-up steps."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    ctx = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
    start = time.perf_counter()
    with ctx:
        shapes = [batch(device, 48 + 4 * (j % 5), 12 + 3 * j) for j in range(12)] if os.environ.get("VARY") else None
        for i in range(steps + 10):
            if shapes is not None:
                src, tgt = shapes[(i * 7) % len(shapes)]
            if i == 10:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(src, tgt[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1000


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    device = torch.device(args[0] if args else "cuda")
    steps = int(args[1]) if len(args) > 1 else 50
    src, tgt = batch(device)
    rows = []
    for entry, backend, padded in CASES:
        if os.environ.get("ONLY") and (entry != os.environ["ONLY"] or backend is not None or not padded):
            continue
        s, t = (src, tgt) if padded else batch(device, padded=False)
        torch.manual_seed(0)
        ms: float | str
        try:
            ms = round(time_steps(model_for(entry, device), s, t, steps, device, backend), 2)
        except RuntimeError as exc:
            ms = f"failed: {str(exc).splitlines()[0][:120]}"
        row = {"entry": entry, "sdpa": backend.name if backend is not None else "default", "padded": padded, "ms": ms}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if len(args) > 2:
        record = {"torch": torch.__version__, "device": str(device), "rows": rows}
        Path(args[2]).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
