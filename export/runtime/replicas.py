"""Throughput mode: independent copies of one exported model, each with its own onnxruntime sessions and stores,
decoding different batches at once (`export.load(dir, inter_threads=N, intra_threads=M)`).

One search keeps its cores busy only while a graph runs; between steps its Python and numpy work leaves them idle.
Two single-thread searches over different batches fill those gaps, at the cost of a second set of sessions and
stores, and of batch-1 latency (each search has fewer threads) — the `inter_threads × intra_threads` choice
dedicated engines expose. Sessions release the GIL while they run, so threads suffice.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

Model = TypeVar("Model")
Item = TypeVar("Item")
Result = TypeVar("Result")


class Replicas(Generic[Model]):
    """`map` runs `fn(model, item)` for every item, each call on a model no other call is using, results in input
    order."""

    def __init__(self, models: list[Model]) -> None:
        self.models = list(models)
        self._free: queue.SimpleQueue[Model] = queue.SimpleQueue()
        for model in self.models:
            self._free.put(model)
        many = len(self.models) > 1
        self._executor = ThreadPoolExecutor(len(self.models), thread_name_prefix="export-inter") if many else None

    def __len__(self) -> int:
        return len(self.models)

    def map(self, fn: Callable[[Model, Item], Result], items: Iterable[Item]) -> Iterator[Result]:
        if self._executor is None:  # one model: in this thread, one item after the other
            return (fn(self.models[0], item) for item in items)

        def call(item: Item) -> Result:
            model = self._free.get()
            try:
                return fn(model, item)
            finally:
                self._free.put(model)

        return self._executor.map(call, items)
