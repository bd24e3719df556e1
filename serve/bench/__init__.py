"""The lab beside the server: load generation and measurement of a running tritonserver, not part of serving.

    python -m serve.bench exports=[…]                 served sentences/s and latency vs concurrency (conf/bench.yaml)
    python -m serve.bench.gate <export>               what the request gate costs per request
    python -m serve.bench.perf_analyzer install       NVIDIA's perf_analyzer, the cross-check `tool=both` runs

Why a package of its own: the product (serve/, export/, export/runtime/) imports nothing from here
(tests/test_imports.py holds it), so the server reads as what a deployment runs. This file imports nothing.
"""
