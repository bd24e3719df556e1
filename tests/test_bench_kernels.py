"""`python -m export.bench.kernels`: kernels per decoder step read from onnxruntime's own profile (issue 65's count)."""

from __future__ import annotations

import json

from export.bench.kernels import kernels_per_step, main


def test_kernels_are_counted_inside_each_run_of_the_trace() -> None:
    """Kernel events are counted in the run whose window holds them; fences and session events are not kernels."""
    run = {"cat": "Session", "name": "model_run"}
    node = {"cat": "Node"}
    trace = [
        {**run, "ts": 0, "dur": 100},
        {**node, "name": "a_kernel_time", "ts": 10, "dur": 30, "args": {"op_name": "MatMul"}},
        {**node, "name": "a_fence_before", "ts": 9, "dur": 0, "args": {"op_name": "MatMul"}},
        {**node, "name": "b_kernel_time", "ts": 50, "dur": 10, "args": {"op_name": "Add"}},
        {**run, "ts": 200, "dur": 100},
        {**node, "name": "a_kernel_time", "ts": 210, "dur": 30, "args": {"op_name": "MatMul"}},
        {**node, "name": "b_kernel_time", "ts": 250, "dur": 10, "args": {"op_name": "Add"}},
        {**node, "name": "c_kernel_time", "ts": 260, "dur": 20, "args": {"op_name": "Softmax"}},
        {"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 5},
    ]
    counted = kernels_per_step(trace)
    assert counted["per_run"] == [2, 3] and counted["kernels_per_run"] == 2.5 and counted["runs"] == 2
    assert counted["by_op"]["MatMul"] == {"kernels_per_run": 1.0, "time_share": 60 / 100}
    assert list(counted["by_op"]) == ["MatMul", "Add", "Softmax"]  # most kernels first


def test_a_real_export_runs_the_same_kernels_every_step(exported, tmp_path, capsys) -> None:
    """Profiling a real export: one decoder run per forced step, the same kernels in each, MatMuls among them."""
    out, _ = exported("transformer")
    main(["--export", str(out), "--steps", "5", "--json", str(tmp_path / "k.json")])
    report = json.loads((tmp_path / "k.json").read_text())
    assert report["runs"] >= 4 and len(set(report["per_run"])) == 1 and report["kernels_per_run"] > 20
    assert report["by_op"]["MatMul"]["kernels_per_run"] >= 2
    assert f"{report['kernels_per_run']:.0f} kernels per decoder step" in capsys.readouterr().out
