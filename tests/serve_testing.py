"""A flood for the serving fairness tests: clients each keeping one request in flight on a real server while
another client times single requests — what a cheap request waits while others fill the server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


@dataclass
class Flood:
    answered: list[float]  # seconds of each flood request answered
    failures: list[str]  # messages of flood requests that failed
    probes: list[float]  # seconds of each probe
    outputs: list[Any]  # what each probe returned
    in_flight: int  # flood clients still running when the probes ended


def flood_while_probing(
    url: str,
    model: str,
    rows: np.ndarray,
    parameters: dict[str, Any],
    probe: Callable[[grpcclient.InferenceServerClient], Any],
    probes: int,
    clients: int = 16,
    timeout: float = 300,
) -> Flood:
    """`clients` threads each keep a request of `rows` ([n, 1] bytes) with `parameters` in flight over gRPC at
    `url`; after 3 s (every flood request is in) `probe(client)` is timed `probes` times, 0.2 s apart."""
    stop = threading.Event()
    flood = Flood([], [], [], [], 0)

    def keep_one_in_flight() -> None:
        with grpcclient.InferenceServerClient(url) as client:
            while not stop.is_set():
                inp = grpcclient.InferInput("TEXT", list(rows.shape), "BYTES")
                inp.set_data_from_numpy(rows)
                begin = time.perf_counter()
                try:
                    client.infer(model, [inp], parameters=parameters, client_timeout=timeout)
                    flood.answered.append(time.perf_counter() - begin)
                except InferenceServerException as exc:
                    flood.failures.append(exc.message())

    threads = [threading.Thread(target=keep_one_in_flight) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3)
        with grpcclient.InferenceServerClient(url) as client:
            for _ in range(probes):
                begin = time.perf_counter()
                flood.outputs.append(probe(client))
                flood.probes.append(time.perf_counter() - begin)
                time.sleep(0.2)
        flood.in_flight = sum(thread.is_alive() for thread in threads)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    return flood
