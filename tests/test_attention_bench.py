"""`python -m zoo.attention_bench`: every entry's attention timed against mha in one run.

Timings are not asserted (speed targets are read from the command's printed table, not from unit tests);
what is asserted is the structure a reader relies on: one row per entry with its real mechanism and shape,
the baseline at ratio 1, ratios that are median / baseline median of the recorded steps, and a wider
attention explained by its width rather than flagged bare.
"""

from __future__ import annotations

import json
import statistics

import pytest

from zoo.attention_bench import BASELINE, format_table, main, slow_reason


def test_ratio_table_over_entries(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    result = main(
        [
            "--size",
            "tiny",
            "--entries",
            "fixhead,mgk_4head,mixhead_b,mlk_4head",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--batch-sentences",
            "4",
            "--src-len",
            "8",
            "--tgt-len",
            "7",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    rows = result["rows"]
    assert set(rows) == {BASELINE, "fixhead", "mgk_4head", "mixhead_b", "mlk_4head"}
    assert {rows[e]["key"] for e in rows} == {"mha", "mgk", "mixhead", "mlk"}
    assert rows[BASELINE]["ratio"] == pytest.approx(1.0)
    base = statistics.median(rows[BASELINE]["step_ms"])
    for r in rows.values():
        assert len(r["step_ms"]) == 3 and r["median_ms"] == pytest.approx(statistics.median(r["step_ms"]))
        assert r["ratio"] == pytest.approx(r["median_ms"] / base)
        assert r["ratio_per_width"] == pytest.approx(r["ratio"] / r["width_ratio"])
    # fixhead: 16 heads of d_model/8 at any size, twice the baseline's width
    assert rows["fixhead"]["width_ratio"] == pytest.approx(2.0)
    assert rows["mgk_4head"]["width_ratio"] == pytest.approx(0.5)
    table = capsys.readouterr().out
    assert table == format_table(result) + "\n"
    for label in rows:
        assert label in table
    assert json.loads(out.read_text())["rows"]["fixhead"]["num_heads"] == 16


def test_slow_variant_reason() -> None:
    """Over the flag, a variant is explained by its width only when the per-width ratio is under the flag."""
    assert slow_reason(2.05, 2.0, 2.0) == "attention width 2× mha's: 1.02× per unit of width"
    assert slow_reason(1.9, 2.0, 2.0) == ""  # not over the flag: nothing to explain
    assert slow_reason(4.5, 2.0, 2.0) == ""  # slower than its width explains: flagged bare
    assert slow_reason(2.5, 1.0, 2.0) == ""
