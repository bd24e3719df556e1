"""How many threads torch trains with (`trainer.threads`), and how its OpenMP threads wait.

torch's default team is one thread per usable core, which is right on a quiet machine. Next to another
CPU-bound process it is not: OpenMP threads that spin while they wait for a descheduled sibling burn the time
slice the sibling needs, and one update of the CPU preset on 2 cores became 8× slower next to one other job.
Two remedies: the threads spin only briefly before they sleep (GOMP_SPINCOUNT, which must be set before torch
loads libgomp, so `zoo/__init__.py` sets it), and jobs that share a machine on purpose take fewer threads each
(`trainer.threads=1`). `auto` is the cores this process may run on (its affinity mask, which `taskset` and
container CPU sets narrow) unless the user exported OMP_NUM_THREADS, which wins; either way the count is set
explicitly, logged, and recorded in the run's machine.json.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from export.runtime.backend import usable_cores  # one home: the runtime's spinning rule counts the same cores

AUTO = "auto"
KEY = "trainer.threads"


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count to use and why, in words for the log."""

    threads: int
    reason: str


def _positive_int(value: object) -> int | None:
    """`value` as a positive int (an int, or a string of digits), else None. Booleans are not counts."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
        return number if number > 0 else None
    return None


def choose_threads(value: object, environ: Mapping[str, str] | None = None, cores: int | None = None) -> ThreadChoice:
    """Resolve a `trainer.threads` value: a positive int as given, or `auto` = OMP_NUM_THREADS when the
    environment sets it (the user's explicit choice), else the usable cores. Raises ValueError naming the
    key and the allowed values for anything else."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        env = os.environ if environ is None else environ
        # OMP_NUM_THREADS may be a nesting list ("4,2"): the first level is this process's team size
        from_env = _positive_int(env.get("OMP_NUM_THREADS", "").split(",")[0])
        if from_env is not None:
            return ThreadChoice(from_env, f"auto: OMP_NUM_THREADS={from_env} from the environment")
        usable = usable_cores() if cores is None else cores
        return ThreadChoice(usable, f"auto: {usable} usable cores")
    threads = _positive_int(value)
    if threads is None:
        raise ValueError(f"{KEY}={value!r} is not allowed: use {AUTO} or a positive integer (e.g. {KEY}=1)")
    return ThreadChoice(threads, f"{KEY}={threads}")


def wait_policy() -> str:
    """How OpenMP threads wait, as this process's environment says (libgomp read it when torch loaded):
    OMP_WAIT_POLICY if set, else the spin count."""
    if "OMP_WAIT_POLICY" in os.environ:
        return f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    return f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'default')}"


def describe(choice: ThreadChoice) -> str:
    """One log line: `torch threads: 2 (auto: 2 usable cores; OpenMP wait GOMP_SPINCOUNT=10000)`."""
    return f"torch threads: {choice.threads} ({choice.reason}; OpenMP wait {wait_policy()})"


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with `torch.set_num_threads(threads)`, then restore the caller's count: the setting is
    process-wide, and an in-process caller (tests, a notebook) keeps its own."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["AUTO", "ThreadChoice", "choose_threads", "describe", "torch_threads", "usable_cores", "wait_policy"]
