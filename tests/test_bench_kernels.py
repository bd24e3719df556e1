"""`python -m export.bench.kernels`: kernels per decoder step read from onnxruntime's own profile (issue 65's count)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from export.bench.kernels import kernels_per_step, main
from export.self_attention_by_rows import FUSED_MOST_ROWS


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


def test_a_branch_is_timed_once_in_the_shares() -> None:
    """An If's kernel time holds its branch's kernels, which the profile also times: the shares are taken of the
    kernels alone, so the If's share is what its branch took, and nothing is counted twice."""
    trace = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        {"cat": "Node", "name": "if_kernel_time", "ts": 5, "dur": 40, "args": {"op_name": "If"}},
        {"cat": "Node", "name": "inner_kernel_time", "ts": 10, "dur": 30, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "after_kernel_time", "ts": 60, "dur": 10, "args": {"op_name": "Add"}},
    ]
    shares = {op: entry["time_share"] for op, entry in kernels_per_step(trace)["by_op"].items()}
    assert shares == {"If": 40 / 40, "MatMul": 30 / 40, "Add": 10 / 40}


def test_a_real_export_runs_the_same_kernels_every_step(exported, tmp_path, capsys) -> None:
    """Profiling a real export: one decoder run per forced step, the same kernels in each, MatMuls among them."""
    out, _ = exported("transformer")
    main(["--export", str(out), "--steps", "5", "--batch", "2", "--json", str(tmp_path / "k.json")])
    report = json.loads((tmp_path / "k.json").read_text())
    assert report["runs"] >= 4 and len(set(report["per_run"])) == 1 and report["kernels_per_run"] > 20
    assert report["by_op"]["MatMul"]["kernels_per_run"] >= 2
    assert f"{report['kernels_per_run']:.0f} kernels per decoder step" in capsys.readouterr().out


def test_spin_pairs_times_each_setting_in_its_own_processes(exported, tmp_path, capsys) -> None:
    """`python -m export.bench.spin_pairs`: every round runs one fresh process per spinning setting (the order
    alternating; "shared" makes its process's one pool), each timing its calls and its encoder runs; the summary is
    the median of per-pair ratios, and `--table` renders the stored report from those numbers."""
    from export.bench import spin_pairs

    out, _ = exported("transformer")
    args = ["--export", str(out), "--settings", "false,shared", "--pairs", "2", "--calls", "2", "--fixed-len", "3"]
    spin_pairs.main([*args, "--threads", "1", "--json", str(tmp_path / "s.json")])
    report = json.loads((tmp_path / "s.json").read_text())
    assert [list(row) for row in report["rounds"]] == [["false", "shared"], ["shared", "false"]]  # order alternates
    for row in report["rounds"]:
        for setting, child in row.items():
            assert child["spinning"] == setting and 0 < child["encoder_s"] < child["call_s"]
    ratios = [row["false"]["call_s"] / row["shared"]["call_s"] for row in report["rounds"]]
    assert report["shared"]["speed_vs_false"] == sum(ratios) / 2 and report["false"]["speed_vs_false"] == 1.0
    assert report["shared"]["faster_than_false_in"] == sum(r > 1 for r in ratios)
    assert "faster in" in capsys.readouterr().out
    spin_pairs.main(["--table", str(tmp_path / "s.json")])
    rendered = capsys.readouterr().out
    first, shared = report["false"], report["shared"]
    assert "| point | false | shared |" in rendered and report["machine"]["signature"] in rendered
    assert (
        f"| greedy batch 1 (2 pairs × 2 calls) | {first['call_ms']:.1f} ms (encoder {first['encoder_ms']:.1f}) | "
        f"×{shared['speed_vs_false']:.3f}, faster in {shared['faster_than_false_in']} of 2" in rendered
    )


def test_spin_pairs_times_a_baseline_runtime_in_the_same_rounds(exported, tmp_path, capsys) -> None:
    """`baseline:<spinning>` settings run another version of the runtime (here this checkout's, imported under
    another name as an older commit's would be) in the same rounds; one without --baseline-runtime, or a baseline
    export of another checkpoint, is refused before any process starts."""
    import shutil

    from export.bench import spin_pairs

    out, _ = exported("transformer")
    args = ["--export", str(out), "--pairs", "1", "--calls", "1", "--fixed-len", "3", "--threads", "1"]
    checkout = str(Path(spin_pairs.__file__).parents[2])
    spin_pairs.main(
        [
            *args,
            "--settings",
            "false,baseline:false",
            "--baseline-runtime",
            checkout,
            "--json",
            str(tmp_path / "b.json"),
        ]
    )
    report = json.loads((tmp_path / "b.json").read_text())
    (row,) = report["rounds"]
    assert row["baseline:false"]["spinning"] == "baseline:false" and row["baseline:false"]["call_s"] > 0
    assert (
        report["args"]["baseline_runtime"].endswith("export/runtime")
        and len(report["args"]["baseline_runtime_sha256"]) == 64
    )
    capsys.readouterr()
    with pytest.raises(SystemExit):
        spin_pairs.main([*args, "--settings", "false,baseline:false"])
    assert "baseline:<spinning> settings need --baseline-runtime" in capsys.readouterr().err
    other = tmp_path / "other"
    shutil.copytree(out, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["checkpoint"]["sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit):
        spin_pairs.main(
            [
                *args,
                "--settings",
                "false,baseline:false",
                "--baseline-runtime",
                checkout,
                "--baseline-export",
                str(other),
            ]
        )
    assert "exports of different checkpoints" in capsys.readouterr().err


def test_op_costs_times_each_kind_of_kernel_as_a_chain(tmp_path) -> None:
    """`python -m export.bench.op_costs`: every kind runs as a chain in its own session; the report holds one cost
    per kind and the empty run's; a longer chain of the same kernels takes longer per run."""
    from export.bench import op_costs

    small = ["--d-model", "64", "--heads", "4", "--past", "3", "--vocab", "100", "--runs", "50", "--threads", "1"]
    op_costs.main([*small, "--chain", "4", "--json", str(tmp_path / "c.json")])
    report = json.loads((tmp_path / "c.json").read_text())
    kinds = ("bias_add", "layer_norm", "self_attention_step", "cross_attention_step", "log_softmax")
    assert all(f"{k}_us" in report for k in kinds) and report["empty_run_us"] > 0
    assert report["shapes"] == {"d_model": 64, "heads": 4, "past": 3, "vocab": 100, "chain": 4}
    helper, x = op_costs.helper, op_costs.np.zeros((1, 1, 64), op_costs.np.float32)
    bias = op_costs.numpy_helper.from_array(op_costs.np.ones(64, op_costs.np.float32), "b")

    def chain_run(n: int) -> float:
        nodes = [helper.make_node("Add", [f"a{i - 1}" if i else "x", "b"], [f"a{i}"]) for i in range(n)]
        inputs = [helper.make_tensor_value_info("x", op_costs.F32, [1, 1, 64])]
        return op_costs.run_seconds(op_costs._session(nodes, inputs, [bias], 1, False), {"x": x}, 200)

    assert chain_run(64) > chain_run(1)


BAD_INPUTS = [
    ("kernels", ["--export", "{missing}"], "--export {missing}: {missing} is not an export directory"),
    ("ablate", ["--export", "{missing}"], "--export {missing}: {missing} is not an export directory"),
    ("spin_pairs", ["--export", "{missing}"], "--export {missing}: {missing} is not an export directory"),
    ("threads", ["--export", "{missing}", "--src", "{text}"], "--export {missing}: {missing} is not an export"),
    ("threads", ["--export", "{export}", "--src", "{missing}"], "--src {missing}: no such file"),
    ("shortlist", ["--export", "{export}", "--src", "{text}", "--ref", "{missing}"], "--ref {missing}: no such file"),
    ("ablate", ["--table", "{missing}"], "{missing}: No such file or directory; give a report the command wrote"),
    ("spin_pairs", ["--table", "{text}"], "{text}: not JSON (Expecting value"),
    ("threads", ["--render", "{text}"], "{text}: not JSON"),
    ("shortlist", ["--render", "{text}"], "{text}: not JSON"),
    ("ablate", ["--table", "{other}"], "--table {other}: not this command's reports (no 'args')"),
    ("spin_pairs", ["--table", "{other}"], "--table {other}: not this command's reports"),
]


@pytest.mark.parametrize(
    ("command", "argv", "said"), BAD_INPUTS, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(BAD_INPUTS)]
)
def test_bench_commands_answer_bad_input_with_one_usage_line(command, argv, said, exported, tmp_path, capsys) -> None:
    """A missing or non-export --export, a missing input file, a stored report that is not JSON or not this command's:
    the command's usage error (exit 2) naming the flag and the file — before any child process or measurement, and
    never a traceback."""
    import importlib

    (tmp_path / "text.txt").write_text("not json\n")
    (tmp_path / "other.json").write_text('{"a": 1}\n')
    paths = {"missing": str(tmp_path / "missing"), "text": str(tmp_path / "text.txt")}
    paths["other"] = str(tmp_path / "other.json")
    if any("{export}" in a for a in argv):
        paths["export"] = str(exported("transformer")[0])
    main_of = importlib.import_module(f"export.bench.{command}").main
    with pytest.raises(SystemExit) as stop:
        main_of([a.format(**paths) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"python -m export.bench.{command}: error: ") and said.format(**paths) in err[-1]


def test_self_attention_rows_times_both_branches_of_the_crossover(exported, tmp_path, capsys) -> None:
    """`python -m export.bench.self_attention_rows`: the export's decoder with the kernel at every row count and
    written out at every row count (their tokens checked equal), a ratio per round and row count, the table
    printed; the copies it made are gone."""
    from export.bench.self_attention_rows import main as rows_main

    out, _ = exported("transformer")
    before = sorted(p.name for p in out.parent.iterdir())
    rows_main(
        ["--export", str(out), "--rows", "9,1", "--rounds", "2", "--steps", "3", "--threads", "1"]
        + ["--json", str(tmp_path / "rows.json")]
    )
    report = json.loads((tmp_path / "rows.json").read_text())
    assert list(report["per_rows"]) == ["1", "9"] and report["cpu"] and report["steps"] == 3
    assert report["export_kernel_rows"] == FUSED_MOST_ROWS
    for row in report["per_rows"].values():
        assert len(row["per_round"]) == 2 and all(r > 0 for r in row["per_round"])
        assert row["kernel_ms_per_step"] > 0 and row["written_ms_per_step"] > 0
    assert "| 9 |" in capsys.readouterr().out
    assert sorted(p.name for p in out.parent.iterdir()) == before


def test_self_attention_rows_names_the_fix_for_an_export_without_the_crossover(tmp_path, capsys) -> None:
    """An export whose decoder has no fused self-attention chosen by rows (an older export, fused_attention=none), or
    a directory that is no export, is refused with the command that makes one."""
    from onnx import TensorProto, helper

    from export.bench.self_attention_rows import main as rows_main
    from export.bench.self_attention_rows import with_crossover

    with pytest.raises(SystemExit):
        rows_main(["--export", str(tmp_path)])
    assert "no manifest.json); make one with python -m export" in capsys.readouterr().err

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    (tmp_path / "old").mkdir()
    onnx.save(helper.make_model(graph), str(tmp_path / "old" / "decoder.onnx"))
    (tmp_path / "old" / "manifest.json").write_text(json.dumps({"graphs": {"decoder": {"file": "decoder.onnx"}}}))
    with pytest.raises(SystemExit, match="python -m export"):
        with_crossover(tmp_path / "old", tmp_path / "copy", 0)
