"""Issue 62: the compaction scan's rule, read from its suite file and applied by the report — the weakest setting
whose trained groups compact (silhouette ≥ the threshold) without collapse and without a validation loss beyond
the margin against the scan's ×1 run; and the compaction table's slopes from the checks."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from omegaconf import OmegaConf

from tests.zoo_testing import REPO
from zoo.report.render_ght import compaction_table, scan_verdicts
from zoo.report.suite import SuiteError, suite_from_config


def _run(silhouettes: list[float], intra: float, inter: float, valid: float) -> dict:
    curve = [
        {"step": 100 * i, "mean": {"silhouette": s, "intra_cos": intra, "inter_cos": inter}, "modules": {}}
        for i, s in enumerate(silhouettes)
    ]
    return {
        "compaction_curve": curve,
        "compactness": {"partition": "trained"},
        "learning_curve": [{"step": 100, "valid_quality": valid + 3}, {"step": 400, "valid_quality": valid}],
    }


def _data(runs: dict[str, dict]) -> dict:
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "ght_scan.yaml"), REPO / "conf")
    return {"entries": {e: {"seeds": {"1": r}} for e, r in runs.items()}, "compaction_rule": asdict(suite.compaction)}


def test_the_scan_chooses_the_weakest_setting_that_compacts_without_collapse_or_loss() -> None:
    data = _data(
        {
            "ght_v_x1": _run([0.02, 0.03, 0.03, 0.04, 0.05], 0.49, -0.1, valid=10.0),
            "ght_v_x4": _run([0.02, 0.1, 0.2, 0.24, 0.249], 0.55, -0.3, valid=10.0),  # just under the threshold
            "ght_v_x16": _run([0.02, 0.2, 0.3, 0.35, 0.4], 0.7, -0.6, valid=8.9),  # compacts, but loses 1.1 BLEU
            "ght_v_x64": _run([0.02, 0.4, 0.5, 0.55, 0.6], 0.8, -0.8, valid=9.5),  # the weakest that passes
            "ght_v_x220": _run([0.02, 0.9, 0.95, 0.97, 0.98], 0.99, -0.99, valid=1.1),  # collapsed
            "gct_o_x1": _run([0.04, 0.04, 0.05, 0.05, 0.05], 0.5, -0.2, valid=10.0),
        }
    )
    ght, gct = scan_verdicts(data)
    outcome = {r["entry"]: r["outcome"] for r in ght["rows"]}
    assert ght["chosen"] == "ght_v_x64" and outcome["ght_v_x64"] == "compacts"
    assert outcome["ght_v_x4"] == "silhouette 0.249 < 0.25"
    assert outcome["ght_v_x16"] == "validation 8.90 < ×1's 10.00 − 1.0"
    assert outcome["ght_v_x220"].startswith("collapsed (intra cos 0.990, inter cos -0.990)")
    assert gct["chosen"] is None and gct["missing"] == ["gct_o_x4", "gct_o_x16", "gct_o_x64", "gct_o_x220"]
    table = "\n".join(compaction_table(data))
    assert "Chosen: `ght_v_x64`." in table and "No choice yet: 4 setting(s) not run." in table
    # silhouette slope of x1 over the last half (updates 200–400: 0.03, 0.04, 0.05) is +0.05 per 100 → +0.1/1000
    assert "| `ght_v_x1` | 1 | trained | 400 | 0.050 | 0.490 | -0.100 | +0.100 | +0.000 | 10.00 | no |" in table


def test_a_scan_naming_an_entry_outside_the_suite_is_refused() -> None:
    node = OmegaConf.load(REPO / "conf" / "suite" / "ght_scan.yaml")
    node.compaction.scans[0].entries = ["ght_v_x1", "ght_v_x999"]
    with pytest.raises(SuiteError, match="ght_v_x999"):
        suite_from_config(node, REPO / "conf")


def test_a_narrowed_suite_keeps_the_scans_of_its_entries() -> None:
    node = OmegaConf.load(REPO / "conf" / "suite" / "ght_scan.yaml")
    node.entries = ["ght_v_x1", "ght_v_x16", "gct_o_x16"]  # gct_o_x1, the second scan's reference, left out
    suite = suite_from_config(node, REPO / "conf")
    assert suite.compaction is not None
    assert [(s.reference, s.entries) for s in suite.compaction.scans] == [("ght_v_x1", ("ght_v_x1", "ght_v_x16"))]


def test_no_setting_is_chosen_while_a_weaker_one_has_not_run() -> None:
    data = _data(
        {
            "gct_o_x1": _run([0.02, 0.03, 0.03, 0.03, 0.03], 0.50, -0.1, valid=10.0),
            "gct_o_x16": _run([0.02, 0.2, 0.3, 0.35, 0.36], 0.72, -0.8, valid=9.8),  # passes, but ×4 is unknown
        }
    )
    gct = scan_verdicts(data)[1]
    assert gct["chosen"] is None and gct["passing"] == "gct_o_x16" and "gct_o_x4" in gct["missing"]
    table = "\n".join(compaction_table(data))
    assert "No choice yet: 3 setting(s) not run. The weakest that passes so far: `gct_o_x16`." in table


def test_a_scan_where_settings_compact_but_lose_quality_says_so() -> None:
    """Issue 86: ght_scan_gpu's report printed "No setting in this scan compacts the trained groups" although ×16
    and ×64 compacted there (they lost more validation quality than the rule allows): the sentence names them."""
    data = _data(
        {
            "ght_v_x1": _run([0.02, 0.03], 0.49, -0.1, valid=10.0),
            "ght_v_x4": _run([0.02, 0.1], 0.55, -0.3, valid=10.0),
            "ght_v_x16": _run([0.02, 0.3], 0.7, -0.6, valid=8.5),
            "ght_v_x64": _run([0.02, 0.5], 0.8, -0.8, valid=3.0),
            "ght_v_x220": _run([0.02, 0.98], 0.99, -0.99, valid=1.1),
        }
    )
    table = "\n".join(compaction_table(data))
    assert "No setting in this scan compacts" not in table
    assert "No setting passes the rule within the budget: `ght_v_x16`, `ght_v_x64` compact the trained groups" in table
    data = _data({e: _run([0.02, 0.1], 0.5, -0.2, valid=10.0) for e in ("ght_v_x1", "ght_v_x4", "ght_v_x16")})
    data["entries"].update(
        {e: {"seeds": {"1": _run([0.02, 0.98], 0.99, -0.99, valid=1.0)}} for e in ("ght_v_x64", "ght_v_x220")}
    )
    assert "No setting in this scan compacts the trained groups within the budget." in "\n".join(compaction_table(data))
