"""torchrun / DistributedDataParallel glue: a no-op when launched as a single process."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def init_distributed(device: torch.device) -> tuple[int, int]:
    """Join the process group torchrun set up (env WORLD_SIZE > 1); return (rank, world_size)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size()


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's value of `obj` on every rank (e.g. the run directory, which embeds a timestamp)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_sum(values: list[float]) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
