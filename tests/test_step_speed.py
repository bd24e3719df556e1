"""Issue 63: the training update's speed settings and its profile. The allocator setting keeps freed memory (no page
fault per page of a re-allocated 64 MB tensor), AdamW's kernels compute the same update, the profile attributes ops
to the right category and counts matmul FLOPs from their shapes, and `zoo.step_profile` stores and renders a
profile of the real update."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tests.conftest import smoke_overrides
from tests.zoo_testing import REPO, compose_train, tiny_model
from zoo.profile_render import render_profiles
from zoo.profiling import OTHER, PHASE_CATEGORIES, summarize_profile
from zoo.training.allocator import tunable
from zoo.training.config import TrainerConfig
from zoo.training.optim import OPTIMIZER_KERNELS, build_optimizer

# Minor page faults per malloc-write-free of a 64 MB block in a fresh process (torch's CPU tensors come from this
# malloc): whether a freed block is reused depends on what else the heap holds, and a test process's heap holds
# whatever earlier tests left. One thread, libc's own calls: nothing else allocates between the rounds.
FAULTS = """
import ctypes, ctypes.util, json, resource, sys
from zoo.training.allocator import set_cpu_allocator

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 * 1024 * 1024

def faults(rounds=4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)  # every page written
        libc.free(block)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds

mode = sys.argv[1]
if mode != "restored":
    set_cpu_allocator(mode)
else:  # retain, then back: glibc's own behaviour again
    set_cpu_allocator("retain")
    set_cpu_allocator("system")
faults(1)  # the first block is new memory in every mode
print(json.dumps({"faults": faults(), "page": resource.getpagesize()}))
"""


def _faults(mode: str) -> float:
    proc = subprocess.run([sys.executable, "-c", FAULTS, mode], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout)
    return measured["faults"] / (64 * 1024 * 1024 // measured["page"])


@pytest.mark.skipif(not tunable(), reason="not glibc's malloc: cpu_allocator is a no-op here")
def test_retain_keeps_freed_memory_instead_of_faulting_it_back_in() -> None:
    assert _faults("system") > 0.9  # glibc unmaps the freed block and faults every page in again
    assert _faults("retain") < 0.05  # the freed block stays in the heap, its pages mapped
    assert _faults("restored") > 0.9  # set back: glibc's behaviour again


def _three_updates(kernel: str) -> list[torch.Tensor]:
    """A tiny model's parameters after three AdamW steps on the same fixed gradients (drawn, not back-propagated:
    a key bias's true gradient is 0, and Adam would blow its rounding noise up to full steps of either sign)."""
    model = tiny_model("transformer", seed=3)
    optimizer = build_optimizer(model, 1e-3, (0.9, 0.98), 1e-8, 0.01, kernel)
    draw = torch.Generator().manual_seed(5)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=draw) * 10.0 ** torch.randint(-4, 1, (), generator=draw)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_every_optimizer_kernel_computes_the_same_update() -> None:
    reference = _three_updates("for_loop")
    for kernel in OPTIMIZER_KERNELS[1:]:
        for ours, theirs in zip(_three_updates(kernel), reference, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)


def test_the_profile_attributes_ops_to_phases_and_counts_matmul_flops() -> None:
    a, b, bias = torch.randn(64, 32), torch.randn(32, 16), torch.randn(16)
    x, y = torch.randn(3, 8, 4), torch.randn(3, 4, 5)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("zoo.forward"):
            torch.addmm(bias, a, b)  # a model matmul: 2·64·32·16 FLOPs
            torch.bmm(x, y)  # 3 × 2·8·4·5
            a.exp()
        with record_function("zoo.optimizer"):
            torch.mm(b.t(), a.t())  # an optimizer's matmul is the optimizer's time, still a matmul's FLOPs
    summary = summarize_profile(prof.events(), wall_s=1.0, updates=1)
    ms = summary["ms_per_update"]
    assert ms["matmul"] > 0 and ms[OTHER] > 0 and ms[PHASE_CATEGORIES["zoo.optimizer"]] > 0
    assert sum(ms.values()) == pytest.approx(1e3)  # categories and the uncovered rest partition the wall time
    mm = summary["matmul"]
    assert mm["shapes"] == {"1x64x32x16": 1, "3x8x4x5": 1, "1x16x32x64": 1}
    assert mm["flops_per_update"] == 2 * (64 * 32 * 16 + 3 * 8 * 4 * 5 + 16 * 32 * 64)


def test_step_profile_times_variants_side_by_side_and_renders_them(smoke_corpus: Path, tmp_path: Path) -> None:
    keys = ("+model=", "size=", "trainer", "data", "model.")  # the training settings (no runs, no generation)
    overrides = [o for o in smoke_overrides("ght", smoke_corpus, tmp_path) if o.startswith(keys)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zoo.step_profile",
            *overrides,
            f"out={tmp_path / 'out'}",
            "name=smoke",
            "trainer.threads=1",
            "warmup_updates=1",
            "rounds=2",
            "updates_per_round=2",
            "profiled_updates=2",
            'variants={loop: [], fused: ["trainer.optimizer_kernel=fused", "trainer.cpu_allocator=system"]}',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "smoke.json").read_text())
    assert result["entry"] == "ght" and list(result["variants"]) == ["loop", "fused"]
    fused = result["variants"]["fused"]
    assert fused["overrides"] == ["trainer.optimizer_kernel=fused", "trainer.cpu_allocator=system"]
    assert fused["seconds_per_update"]["n"] == 4 and len(fused["round_ratios"]) == 2
    assert result["variants"]["loop"]["round_ratios"] == [1.0, 1.0]
    profile_ = result["variants"]["loop"]["profile"]
    assert profile_["ms_per_update"][PHASE_CATEGORIES["zoo.aux_loss"]] > 0  # GHT's k-means and constraint
    assert profile_["matmul"]["flops_per_update"] > 0 and profile_["matmul"]["roofline_ms_per_update"] > 0
    page = (tmp_path / "out" / "PROFILE.md").read_text()
    assert "## smoke: `ght`" in page
    assert "| fused | `trainer.optimizer_kernel=fused` `trainer.cpu_allocator=system` |" in page
    assert "GHT k-means and constraint" in page


def test_a_variant_that_is_no_trainer_override_is_refused(smoke_corpus: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.step_profile", "+model=transformer", f"out={tmp_path}", 'variants={x: ["lr=1"]}'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "variants.x: 'lr=1' is not a trainer.<key>=<value> override" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.iterdir())


def test_a_profile_without_profiled_updates_is_refused_before_any_work(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.step_profile", "+model=transformer", f"out={tmp_path}", "profiled_updates=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "profiled_updates=0" in proc.stderr and "must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.iterdir())


def test_compile_without_a_compiler_is_refused_with_the_fix(monkeypatch) -> None:
    node = dict(compose_train(["+model=transformer"]).trainer)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ValueError, match=r"trainer.compile=true needs a C\+\+ compiler .* apt install g\+\+"):
        TrainerConfig.from_node({**node, "compile": True})
    monkeypatch.undo()
    assert TrainerConfig.from_node({**node, "compile": True}).compile


def test_the_committed_profile_page_is_the_render_of_its_records(tmp_path: Path) -> None:
    committed = REPO / "results" / "train_speed"
    for record in committed.glob("*.json"):
        shutil.copy(record, tmp_path / record.name)
    assert (render_profiles(tmp_path)).read_text() == (committed / "PROFILE.md").read_text()
