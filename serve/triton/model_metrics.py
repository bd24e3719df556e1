"""This project's Prometheus metrics, served by Triton's /metrics beside its own `nv_*` ones (copied next to
every model.py of both repository variants).

Why these: Triton counts requests, executions and queue/compute time per model, but not what a translation
service is sized by — sentences, tokens in and out, sources cut at the model's limit, and how long one
request's generation took. Every metric is labelled `model` and `version`; the model's instances add to the
same series (Triton keeps one series per family and label set). Warm-up requests (model_warmup) count too.

| metric | kind | what |
|---|---|---|
| `zoo_sentences_total` | counter | rows answered with an output (empty sources included) |
| `zoo_source_tokens_total` | counter | source tokens fed to the encoder (after truncation) |
| `zoo_generated_tokens_total` | counter | tokens of the returned hypotheses (best first; n-best: all), eos excluded |
| `zoo_truncated_sources_total` | counter | sources longer than the model's limit, cut before translating |
| `zoo_refused_requests_total{reason}` | counter | requests answered with an error: invalid / busy / failed |
| `zoo_request_latency_seconds` | histogram | per answered request: from the start of `execute` to its response |
"""

from __future__ import annotations

import threading
from typing import Any

import triton_python_backend_utils as pb_utils

LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]  # seconds
REFUSAL_REASONS = ("invalid", "busy", "failed")


class ModelMetrics:
    """The zoo_* series of one model version. Families are kept alive as long as their metrics (the backend
    requires a family to be deleted after its metrics: `close`)."""

    def __init__(self, model: str, version: str) -> None:
        labels = {"model": model, "version": version}
        # the express and bulk lanes answer from threads of their own, and the backend's metric calls are not safe
        # from two threads at once: a histogram's observe raced a counter's increment ("HISTOGRAM does not support
        # Increment", the request failed) when both lanes answered together
        self._lock = threading.Lock()
        self._families: list[Any] = []
        self.sentences = self._counter("zoo_sentences_total", "Rows answered with an output", labels)
        self.source_tokens = self._counter("zoo_source_tokens_total", "Source tokens fed to the encoder", labels)
        self.generated_tokens = self._counter(
            "zoo_generated_tokens_total", "Tokens of the returned hypotheses, eos excluded", labels
        )
        self.truncated = self._counter("zoo_truncated_sources_total", "Sources cut at the model's length limit", labels)
        refused = self._family("zoo_refused_requests_total", "Requests answered with an error", "COUNTER")
        self.refused = {reason: refused.Metric(labels={**labels, "reason": reason}) for reason in REFUSAL_REASONS}
        latency = self._family(
            "zoo_request_latency_seconds", "Per request: from the start of execute to its response", "HISTOGRAM"
        )
        self.latency = latency.Metric(labels=labels, buckets=LATENCY_BUCKETS)

    def _family(self, name: str, description: str, kind: str) -> Any:
        family = pb_utils.MetricFamily(name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind))
        self._families.append(family)
        return family

    def _counter(self, name: str, description: str, labels: dict[str, str]) -> Any:
        return self._family(name, description, "COUNTER").Metric(labels=labels)

    def answered(self, rows: int, source_tokens: int, generated_tokens: int, truncated: int, seconds: float) -> None:
        """One request answered with outputs."""
        with self._lock:
            self.sentences.increment(rows)
            self.source_tokens.increment(source_tokens)
            self.generated_tokens.increment(generated_tokens)
            self.truncated.increment(truncated)
            self.latency.observe(seconds)

    def refused_one(self, reason: str) -> None:
        with self._lock:
            self.refused[reason].increment(1)

    def close(self) -> None:
        """Drop the metrics, then their families (the order the backend requires)."""
        self.sentences = self.source_tokens = self.generated_tokens = self.truncated = self.latency = None
        self.refused = {}
        self._families = []
