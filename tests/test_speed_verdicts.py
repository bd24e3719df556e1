"""The speed verdict rule (zoo/report/speed_rule.py) on synthetic per-round ratios whose truth is known, the
negative controls and old-format files in the rendered section, and the same-workload guarantee of the speed stage.

The rule before issue 60 called a claim "holds" when the system was faster in every one of 3 rounds: a sign test
whose false-positive rate is 1 in 8 for a model no faster at all, and it measured each entry on its own output
lengths. Every case here is one that rule answers differently or could not check.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from export.runtime.search import Search
from tests.zoo_testing import REPO
from zoo.report.render_speed import readme_speed_column, speed_section
from zoo.report.speed import lengths_digest, workload_lengths
from zoo.report.speed_plan import control_name, round_orders, with_control
from zoo.report.speed_results import (
    SPEED_FORMAT,
    SpeedResultsError,
    read_speed_files,
    summarize,
    workload_mismatches,
)
from zoo.report.speed_rule import (
    ALPHA,
    MARGIN,
    RatioTest,
    judge_claims,
    judge_control,
    judge_family,
)
from zoo.report.stats import FAILS, HOLDS, INCONCLUSIVE
from zoo.report.suite import suite_from_config

PAPERS = REPO.parent / "shared" / "papers"
PAPER_FILES = {
    "MGK": "000_61e8fe3075a627ec.txt",
    "GHT": "004_cb7908ec8b4aa0d8.txt",
    "GHT-PS": "004_cb7908ec8b4aa0d8.txt",
}
SPEED_SUITES = ("ght", "quick", "summ", "heads", "paper_mt", "quick_gpu")


def ratios(true: float, noise: list[float]) -> RatioTest:
    """Per-round ratios: the true ratio times each round's multiplicative noise exp(ε)."""
    return RatioTest(tuple(true * math.exp(e) for e in noise))


def one(test: RatioTest):
    [judgement] = judge_family([test])
    return judgement


# ---------------------------------------------------------------------------------------------- the rule
def test_a_clear_speed_up_holds() -> None:
    j = one(ratios(1.20, [0.01, -0.01, 0.005, -0.005, 0.0]))
    assert j.verdict == HOLDS and j.p is not None and j.p < 1e-4 and j.p_holm == j.p


def test_no_speed_up_never_holds() -> None:
    """×1.00 with 3 % round noise, 300 draws: never "holds"; mostly "does not hold" (shown below ×1.05)."""
    rng = np.random.default_rng(0)
    verdicts = [one(ratios(1.0, list(rng.normal(0, 0.03, 5)))).verdict for _ in range(300)]
    assert HOLDS not in verdicts and set(verdicts) <= {FAILS, INCONCLUSIVE}
    assert verdicts.count(FAILS) > 150


def test_a_slow_down_does_not_hold_and_says_slower() -> None:
    j = one(ratios(0.80, [0.02, -0.01, 0.0, 0.01, -0.02]))
    assert (j.verdict, j.detail) == (FAILS, "slower") and j.p is not None and j.p > 0.999


def test_within_the_margin_is_no_speed_up_but_not_slower() -> None:
    j = one(ratios(1.01, [0.004, -0.004, 0.002, -0.002, 0.0]))
    assert j.verdict == FAILS and j.detail == f"no speed-up beyond the ×{MARGIN:.2f} margin"


def test_three_rounds_are_too_few_even_when_all_are_faster() -> None:
    """The old rule's "holds" (faster in every round of 3) is no verdict now."""
    j = one(RatioTest((1.09, 1.04, 1.18)))  # ght vs transformer, fp32, as measured under the old rule
    assert j.verdict == "too few rounds (3)" and j.p is None


def test_an_inconclusive_claim_says_what_would_decide_it() -> None:
    near = one(ratios(1.05, [0.03, -0.03, 0.01, -0.01, 0.0]))  # the mean on the margin: no number of rounds
    assert near.verdict == INCONCLUSIVE and near.detail.startswith("on the margin")
    noisy = one(ratios(1.10, [0.08, -0.08, 0.04, -0.04, 0.0]))
    assert noisy.verdict == INCONCLUSIVE and noisy.detail.startswith("about ")
    rounds = int(noisy.detail.split()[1])
    assert 5 < rounds <= 60 and f"(now {5})" in noisy.detail


def test_false_positive_rate_at_the_margin() -> None:
    """2,000 claims whose true ratio is exactly ×1.05, lognormal round noise: P(holds) ≤ 2.5 % + 3 SE."""
    rng = np.random.default_rng(60)
    n_claims = 2000
    held = sum(one(ratios(MARGIN, list(rng.normal(0, 0.04, 5)))).verdict == HOLDS for _ in range(n_claims))
    se = math.sqrt(ALPHA * (1 - ALPHA) / n_claims)
    assert held / n_claims <= ALPHA + 3 * se, held


def test_holm_within_a_paper_not_across_papers() -> None:
    """Two borderline claims of one paper each hold alone (p ≈ 0.015, 0.020); Holm over the paper's two makes both
    inconclusive (adjusted 0.030); the same ratios as another paper's only claim are their own family and hold."""
    a = ratios(1.10, [0.04, -0.04, 0.02, -0.02, 0.0])
    b = ratios(1.10, [0.045, -0.045, 0.02, -0.02, 0.0])
    alone = [one(a), one(b)]
    together = judge_claims([a, b, a], ["Ni et al. 2023", "Ni et al. 2023", "Nguyen et al. 2022"])
    assert [j.verdict for j in alone] == [HOLDS, HOLDS] and 0.01 < alone[0].p < alone[1].p < ALPHA
    assert together[0].p_holm == together[1].p_holm == pytest.approx(2 * alone[0].p)
    assert [j.verdict for j in together] == [INCONCLUSIVE, INCONCLUSIVE, HOLDS]
    assert "not after Holm" in together[0].detail and together[2].p_holm == pytest.approx(alone[0].p)


def test_a_control_that_the_rule_would_call_faster_fails() -> None:
    assert judge_control(ratios(1.0, [0.01, -0.01, 0.005, -0.005, 0.0]))[0] == "passes"
    status, words = judge_control(ratios(1.12, [0.02, -0.02, 0.01, -0.01, 0.0]))
    assert status == "FAILS" and "faster" in words and "not trustworthy" in words
    assert judge_control(ratios(1.0, [0.06, -0.06, 0.03, -0.03, 0.0]))[0] == "passes, but wide"


# ---------------------------------------------------------------------------------------------- rendering
def _point(rounds: list[float], tokens: int = 900, digest: str = "abc") -> dict:
    return {"sentences_per_s": rounds, "peak_rss_mb": [300.0] * len(rounds), "output_tokens": tokens,
            "lengths_sha256": digest}  # fmt: skip


def _entry(rounds: list[float], control_of: str | None = None, **extra) -> dict:
    out = {
        "record": "results/x/e-seed1.json.gz",
        "size": {"flops": extra.pop("flops", 1000), "params_excl_emb": 5_000_000},
        "exports": {"fp32": "ok", "int8": "ok"},
        "points": {"b5/fp32": _point(rounds), "b5/int8": _point([2 * r for r in rounds])},
        "served": None,
    }
    return out | ({"control_of": control_of} if control_of else {})


def _speed_file(fmt: int, base: list[float], factors: dict[str, float]) -> dict:
    entries = {"transformer": _entry(base)}
    entries |= {name: _entry([f * b for b in base], flops=700) for name, f in factors.items()}
    data = {
        "format": fmt,
        "suite": "x",
        "baseline": "transformer",
        "seed": 1,
        "measured": "2026-12-01T00:00:00+00:00",
        "git_sha": "0" * 40,
        "machine": {"class": "cpu:AMD EPYC", "cpu_model": "AMD EPYC", "cores": 2, "onnxruntime": "1.31.1"},
        "sentences": 100,
        "threads": 2,
        "rounds": len(base),
        "workload": "synthetic",
        "settings": [{"name": "b5", "beam_size": 5, "batch": 32, "max_len_a": 1.2, "max_len_b": 10}],
        "served_settings": None,
        "entries": entries,
    }
    if fmt == SPEED_FORMAT:
        data["machine"] |= {"cpu_signature": "family 25 model 1, AVX2", "class": "cpu:AMD EPYC (family 25)"}
        data["entries"][control_name("transformer")] = _entry([b * 1.003 for b in base], control_of="transformer")
        data["controls"] = [
            {"system": control_name("transformer"), "baseline": "transformer", "points": None, "why": "A/A"},
            {"system": "ght", "baseline": "transformer", "points": ["b5/fp32"], "why": "same shapes"},
        ]
    return data


CLAIM = {
    "paper": "GHT-PS",
    "claim": "GHT-PS decodes faster",
    "system": "ght_ps",
    "baseline": "transformer",
    "point": "b5/fp32",
    "source": {"paper": "Ni et al. 2023", "where": "Table 1", "quote": "q"},
}


def _render(tmp_path: Path, data: dict) -> str:
    (tmp_path / "speed-cpu-x.json").write_text(json.dumps(data))
    speeds = [summarize(f) for f in read_speed_files(tmp_path, "x", "transformer")]
    return "\n".join(speed_section(speeds, "transformer", [CLAIM]))


def test_a_format_2_file_renders_its_controls_and_verdicts(tmp_path: Path) -> None:
    base = [200.0, 190.0, 210.0, 205.0, 195.0]
    text = _render(tmp_path, _speed_file(SPEED_FORMAT, base, {"ght": 1.004, "ght_ps": 1.4}))
    controls = text[text.index("Negative controls") : text.index("The papers' efficiency claims")]
    aa = [line for line in controls.splitlines() if line.startswith("| `transformer@control` vs `transformer`")]
    assert len(aa) == 2 and all("**passes** (within the margin)" in line for line in aa)  # fp32 and int8
    assert "| `ght` vs `transformer` | same shapes | b5/fp32 |" in controls
    table = text[: text.index("Negative controls")]
    assert "`transformer@control`" not in table  # the control has its own table, not a row among the entries
    assert "×1.40 [1.40, 1.40]" in text and "**holds** (faster than ×1.05)" in text
    assert "false-positive" in text.lower() and "×1.05" in text and "Holm" in text
    assert "`b5` 900 (9.0 per sentence)" in text
    assert "decoder cache KB" not in text  # a file without cache sizes keeps its table


def test_the_table_shows_each_entrys_decoder_cache_per_sentence_where_measured(tmp_path: Path) -> None:
    data = _speed_file(SPEED_FORMAT, [200.0] * 5, {"ght": 1.0, "ght_ps": 1.4})
    for name, kb in (("transformer", 96.0), ("ght_ps", 24.0)):
        data["entries"][name]["points"]["b5/fp32"]["cache_kb"] = kb
    text = _render(tmp_path, data)
    assert "decoder cache KB per sentence" in text
    assert "| `ght_ps` |" in text and "| 24.0 |" in text and "| 96.0 |" in text


def test_a_speed_question_of_ours_quotes_nothing_and_is_a_family_of_its_own(tmp_path: Path) -> None:
    """Issue 89: a question of this project (`paper: ours`, e.g. GQA vs the transformer) is judged by the same rule,
    cites no paper, and is Holm-corrected apart from the papers' claims."""
    ours = {**CLAIM, "paper": "ours", "claim": "GQA decodes faster", "system": "ght", "source": None}
    (tmp_path / "speed-cpu-x.json").write_text(json.dumps(_speed_file(SPEED_FORMAT, [200.0] * 5, {"ght": 1.4})))
    speeds = [summarize(f) for f in read_speed_files(tmp_path, "x", "transformer")]
    text = "\n".join(speed_section(speeds, "transformer", [CLAIM, ours]))
    row = next(line for line in text.splitlines() if line.startswith("| ours | GQA decodes faster |"))
    assert row.endswith("| our question |") and "**holds**" in row
    node = OmegaConf.load(REPO / "conf" / "suite" / "gqa_4800.yaml")
    assert all(c.source is None for c in suite_from_config(node, REPO / "conf").speed_claims)


def test_a_failed_control_is_said_in_words(tmp_path: Path) -> None:
    base = [200.0, 190.0, 210.0, 205.0, 195.0]
    text = _render(tmp_path, _speed_file(SPEED_FORMAT, base, {"ght": 1.15, "ght_ps": 1.4}))
    assert "| `ght` vs `transformer` | same shapes | b5/fp32 |" in text and "**FAILS** (would **hold**" in text
    assert "A negative control failed on this machine (above): these verdicts are not trustworthy." in text


def test_a_format_1_file_renders_without_verdicts(tmp_path: Path) -> None:
    text = _render(tmp_path, _speed_file(1, [200.0, 190.0, 210.0], {"ght_ps": 1.4}))
    assert "**Measured under the old rule** (format 1)" in text and "CPU family was not recorded" in text
    assert "not judged: measured under the old rule; re-run stages=[speed]" in text
    assert "**holds**" not in text and "Negative controls" not in text
    assert "| `ght_ps` | 5.00M | 0.70 | 280.0 · 2520 tok/s |" in text  # sent/s · tokens/s, no ratio


def test_a_current_file_goes_first_and_needs_the_cpu_family(tmp_path: Path) -> None:
    (tmp_path / "speed-cpu-amd-epyc.json").write_text(json.dumps(_speed_file(1, [200.0] * 3, {})))
    new = _speed_file(SPEED_FORMAT, [200.0] * 5, {})
    (tmp_path / "speed-cpu-amd-epyc-family-25.json").write_text(json.dumps(new))
    speeds = [summarize(f) for f in read_speed_files(tmp_path, "x", "transformer")]
    assert [s["format"] for s in speeds] == [SPEED_FORMAT, 1]
    _, cells = readme_speed_column(speeds) or ("", {})
    assert "transformer@control" not in cells and cells["transformer"] == "200.0 (×1.00)"
    del new["machine"]["cpu_signature"]
    (tmp_path / "speed-cpu-amd-epyc-family-25.json").write_text(json.dumps(new))
    with pytest.raises(SpeedResultsError, match=r"without machine\.cpu_signature"):
        read_speed_files(tmp_path, "x", "transformer")


@pytest.mark.parametrize("suite", ["ght", "quick", "summ", "heads"])
def test_the_committed_old_files_render_without_verdicts(suite: str) -> None:
    """results/<suite>/speed-cpu-amd-epyc.json were measured under the old rule: shown, never judged."""
    path = REPO / "results" / suite / "speed-cpu-amd-epyc.json"
    if not path.is_file() or json.loads(path.read_text()).get("format") != 1:
        pytest.skip(f"{path} is not the format-1 file measured before issue 60")
    s = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / f"{suite}.yaml"), REPO / "conf")
    speeds = [summarize(f) for f in read_speed_files(path.parent, s.name, s.baseline) if f["file"] == path.name]
    claims = [{**c.__dict__, "source": c.source.__dict__} for c in s.speed_claims]
    text = "\n".join(speed_section(speeds, s.baseline, claims))
    assert "Measured under the old rule" in text and "**holds**" not in text and "does not hold" not in text


# ---------------------------------------------------------------------------------------------- same workload
def test_every_entry_decodes_the_baseline_lengths() -> None:
    """The speed process caps the given lengths by the search's limit and the model's position limit alone: models
    of one position limit decode the same lengths (same digest) whatever their shapes; a smaller limit is caught."""
    encoded = [[5] * n for n in (3, 12, 7, 30)]
    baseline = [4, 20, 9, 50]  # 50: beyond 1.2·30 + 10 → capped
    search = Search(beam_size=5, max_len_a=1.2, max_len_b=10)
    forced = {name: workload_lengths(1024, encoded, baseline, search) for name in ("transformer", "ght_ps", "mgk")}
    assert forced["transformer"] == [4, 20, 9, 45] and len({tuple(v) for v in forced.values()}) == 1
    points = {name: {"b5/fp32": {"lengths_sha256": lengths_digest(v)}} for name, v in forced.items()}
    assert workload_mismatches(points, "transformer") == []
    short = workload_lengths(40, encoded, baseline, search)  # a model with a smaller position limit
    points["short"] = {"b5/fp32": {"lengths_sha256": lengths_digest(short)}, "b5/int8": {"error": "x"}}
    assert short != forced["transformer"] and workload_mismatches(points, "transformer") == ["short b5/fp32"]


def test_the_control_is_timed_mid_list_and_moves_every_round() -> None:
    names = with_control(["transformer", "ght", "ght_ps", "mgk"], "transformer")
    assert names == ["transformer", "ght", "transformer@control", "ght_ps", "mgk"]
    orders = round_orders(names, 5)
    assert [o.index("transformer@control") for o in orders] == [2, 1, 0, 4, 3]
    assert all(sorted(o) == sorted(names) for o in orders)


# ---------------------------------------------------------------------------------------------- the suites
def test_every_speed_suite_times_enough_rounds_and_ght_has_its_control() -> None:
    for name in SPEED_SUITES:
        s = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / f"{name}.yaml"), REPO / "conf")
        assert s.speed_rounds >= 5, name
    ght = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "ght.yaml"), REPO / "conf")
    assert [(c.system, c.baseline) for c in ght.speed_controls] == [("ght", "transformer")]
    assert ("ght_ps", "transformer_lite_width") not in [(c.system, c.baseline) for c in ght.speed_claims]


@pytest.mark.skipif(not PAPERS.is_dir(), reason="the papers' texts (../shared/papers) are not on this machine")
def test_every_speed_quote_is_verbatim_in_its_paper() -> None:
    """Up to line breaks (a word hyphenated across a line is joined), as tests/test_verdicts.py checks claims."""
    texts = {name: " ".join((PAPERS / f).read_text().replace("-\n", "-").split()) for name, f in PAPER_FILES.items()}
    quoted = []
    for name in SPEED_SUITES:
        s = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / f"{name}.yaml"), REPO / "conf")
        quoted += [(name, c) for c in s.speed_claims]
    assert quoted and all(c.paper in texts for _, c in quoted)
    missing = [(suite, c.claim) for suite, c in quoted if c.source.quote not in texts[c.paper]]
    assert not missing, missing
