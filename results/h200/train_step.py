"""Training-step time of whole small models on one device: the MHA entry under each SDPA backend vs others."""

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
from zoo.model import build_model

device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
conf = str(Path("conf").resolve())


def model_for(entry):
    with initialize_config_dir(conf, version_base="1.3"):
        cfg = compose("train", overrides=[f"+model={entry}", "size=small"])
    mc = entry_model_config(cfg.model, vocab_size=8000, pad_id=0, bos_id=1, eos_id=2)
    return build_model(mc).to(device).train()


def batch(b=64, s=30, padded=True):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, 8000, (b, s), generator=g)
    tgt = torch.randint(3, 8000, (b, s + 1), generator=g)
    if padded:
        for i in range(b):
            n = int(torch.randint(s // 3, s + 1, (1,), generator=g))
            src[i, n:] = 0
            tgt[i, n + 1 :] = 0
    return src.to(device), tgt.to(device)


def time_steps(model, src, tgt, backend=None):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    ctx = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
    with ctx:
        shapes = [batch(48 + 4 * (j % 5), 12 + 3 * j) for j in range(12)] if os.environ.get("VARY") else None
        for i in range(steps + 10):
            if shapes is not None:
                src, tgt = shapes[(i * 7) % len(shapes)]
            if i == 10:
                torch.cuda.synchronize() if device.type == "cuda" else None
                start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(src, tgt[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize() if device.type == "cuda" else None
    return (time.perf_counter() - start) / steps * 1000


src, tgt = batch()
rows = []
for entry, backend, padded in [
    ("transformer", None, True),
    ("transformer", None, False),
    ("transformer", SDPBackend.MATH, True),
    ("transformer", SDPBackend.EFFICIENT_ATTENTION, True),
    ("transformer", SDPBackend.CUDNN_ATTENTION, True),
    ("mixhead_a", None, True),
    ("mgk_4head", None, True),
    ("transformer", None, True),
]:
    if os.environ.get("ONLY") and (entry != os.environ["ONLY"] or backend is not None or not padded):
        continue
    s, t = (src, tgt) if padded else batch(padded=False)
    torch.manual_seed(0)
    try:
        ms = round(time_steps(model_for(entry), s, t, backend), 2)
    except RuntimeError as exc:
        ms = f"failed: {str(exc).splitlines()[0][:120]}"
    row = {"entry": entry, "sdpa": backend.name if backend is not None else "default", "padded": padded, "ms": ms}
    rows.append(row)
    print(json.dumps(row), flush=True)
if len(sys.argv) > 3:
    Path(sys.argv[3]).write_text(
        json.dumps({"torch": torch.__version__, "device": str(device), "rows": rows}, indent=1)
    )
