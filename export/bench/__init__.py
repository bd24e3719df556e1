"""The lab beside the exporter: measurements of the runtime and the exports, not part of what an export ships.

    python -m export.bench …             the runtime against PyTorch or another commit's runtime (speed.py)
    python -m export.bench.table …       the runtime's tables, rendered from a stored speed report
    python -m export.bench.threads …     throughput mode (inter × intra threads) against one search
    python -m export.bench.shortlist …   what the lexical shortlist costs in BLEU and gains in speed
    python -m export.bench.kernels …     kernels per decoder step, from onnxruntime's profile

Why a package of its own: the product (export/, export/runtime/, serve/) imports nothing from here
(tests/test_imports.py holds it), so the exporter and the runtime read as what they ship. This file imports
nothing, so `export.bench.rss_probe` and the others load without the benchmark's torch-side imports.
"""
