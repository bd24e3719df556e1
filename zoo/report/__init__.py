"""`python -m zoo.report +suite=<name>`: the papers' comparison table, reproduced on our data.

Stages (each resumable, each reading only artefacts on disk so every number traces to a run):
  train  — `zoo.train` per (entry, seed) in a subprocess, reusing finished runs and resuming unfinished ones;
  speed  — per entry: PyTorch and ONNX Runtime sentences/s and peak memory, each engine in its own process;
  render — REPORT.md, report.json and plots from the run directories and speed files.
"""
