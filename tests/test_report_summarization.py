"""A summarization suite renders like a translation one: per-seed paired bootstrap and the claims' verdicts on
ROUGE-L (per-document scores resampled), fed synthetic records whose answer is known."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from tests.zoo_testing import REPO
from zoo.metrics import reordered_rouge_l, rouge
from zoo.report.baselines import choose_constant, choose_lead, lead, oracle, score_baselines, sentences
from zoo.report.budget_probe import plot_probe, probe_choice, probe_section
from zoo.report.collect import collect
from zoo.report.pairing import dependence_text, derangements, input_dependence
from zoo.report.records import BASELINES_FILE, RecordError, References, write_json_gz
from zoo.report.render import markdown, readme_block
from zoo.report.render_curves import Curve, curves, plot_learning_curves
from zoo.report.render_outputs import baselines_section
from zoo.report.stats import HOLDS
from zoo.report.suite import BudgetProbe, SuiteError, suite_from_config
from zoo.report.verdict import Verdict

WORDS = "package tool library daemon server client plugin data files for the manage network python debian".split()


def _documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9))) for _ in range(n)]


def _degrade(refs: list[str], keep: float, seed: int) -> list[str]:
    """Each reference with words dropped (each kept with probability `keep`) and one unrelated word appended."""
    rng = random.Random(seed)
    return [" ".join([w for w in r.split() if rng.random() < keep] + [rng.choice(WORDS)]) for r in refs]


def _record(entry: str, seed: int, hyps: list[str], refs: list[str]) -> dict:
    return {
        "entry": entry,
        "seed": seed,
        "updates": 1200,
        "train_minutes": 1.0,
        "stop_reason": "reached max_updates=1200",
        "size": {"params": 7_000_000, "params_excl_emb": 5_000_000, "flops": 400_000_000},
        "pruned_size": None,
        "head_plan": None,
        "test": {**rouge(hyps, refs), "n": len(refs)},
        "hypotheses": hyps,
        "config": {"model": {"attention": "mha", "num_heads": 8, "head_dim": None, "d_model": 256}},
        "git_sha": "0" * 40,
        "machine": {"class": "cpu:test", "cpu_model": "test", "cores": 2},
        "learning_curve": [{"step": 1200, "valid_quality": 30.0}],
    }


@pytest.fixture(scope="module")
def report() -> dict:
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "summ.yaml"), REPO / "conf")
    refs = _documents(60, seed=0)
    quality = {"transformer": 0.6, "ght_summ": 0.95, "transformer_lite_layers": 0.6}  # ght_summ clearly better
    records = {
        (entry, seed): _record(entry, seed, _degrade(refs, keep, seed=seed * 100 + i), refs)
        for i, (entry, keep) in enumerate(quality.items())
        for seed in (1, 2, 3)
    }
    data = collect(suite, References(tuple(refs), ("summ",) * len(refs)), records, bootstrap_samples=200)
    # as publish adds them
    return {**data, "results_dir": "results/summ", "speed": [], "speed_claims": [], "speed_enabled": True}


def test_every_seed_has_a_paired_bootstrap_on_rouge_l(report: dict) -> None:
    rows = report["entries"]["ght_summ"]["bootstrap"]
    assert [r["seed"] for r in rows] == [1, 2, 3]
    assert all(r["metric"] == "rougeL" and r["delta"] > 5 and r["significant"] for r in rows)
    assert all(
        r["score"] == pytest.approx(report["entries"]["ght_summ"]["seeds"][r["seed"]]["test"]["rougeL"]) for r in rows
    )


def test_the_claims_get_verdicts_not_incomplete(report: dict) -> None:
    claims = {c["system"] + "/" + c["baseline"]: c for c in report["claims"]}
    better = claims["ght_summ/transformer"]
    assert better["delta"]["seeds"] == 3 and better["delta"]["low"] > 0
    assert better["verdict"]["kind"] == HOLDS
    untested = Verdict.from_json(claims["ght_ps_summ/transformer"]["verdict"])
    assert untested.kind is None and untested.words() == "too few seeds (0)"  # no records: no verdict


def test_the_tables_name_rouge_l(report: dict) -> None:
    text = markdown(report, "python -m zoo.report +suite=summ stages=[render]")
    assert "Δ ROUGE-L vs baseline" in text and "Δ̄ ROUGE-L [95% CI]" in text
    assert "mean per-document ROUGE-L F1 difference" in text and "BLEU" not in text.replace("sacreBLEU", "")
    assert "Δ ROUGE-L vs `transformer` (per seed)" in readme_block(report, "cmd")


def test_a_summarizer_at_the_constant_summarys_level_renders_degenerate_outputs() -> None:
    """Issue 86: the 2%-distinct gate let through runs with 181–193 distinct outputs that scored within +0.06–0.18
    ROUGE-L of the constant string. A run must also score above the constant summary beyond its 95% interval over
    documents; one that varies its output but not its score reads "degenerate outputs", with its margin."""
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "summ.yaml"), REPO / "conf")
    refs = _documents(100, seed=0)
    constant = ["development files for the library"] * len(refs)
    # every document its own output, none nearer its reference than the constant: a varied string of the same words
    varied = [f"development files for the library {i}" for i in range(len(refs))]
    records = {("transformer", s): _record("transformer", s, _degrade(refs, 0.6, seed=s), refs) for s in (1, 2, 3)}
    records |= {("ght_summ", s): _record("ght_summ", s, varied, refs) for s in (1, 2, 3)}
    data = collect(
        suite, References(tuple(refs), ("summ",) * len(refs)), records, bootstrap_samples=100, floor_outputs=constant
    )
    claim = next(c for c in data["claims"] if (c["system"], c["baseline"]) == ("ght_summ", "transformer"))
    words = Verdict.from_json(claim["verdict"]).words()
    assert claim["verdict"]["kind"] is None
    assert words.startswith("degenerate outputs (`ght_summ`: ") and "over the constant summary" in words
    run = data["entries"]["ght_summ"]["seeds"][1]
    assert run["outputs"]["distinct"] == 100 and run["above_constant"]["gain"] - run["above_constant"]["ci95"] <= 0
    good = data["entries"]["transformer"]["seeds"][1]["above_constant"]
    assert good["gain"] - good["ci95"] > 0  # the model that reads its documents clears the floor


def test_a_near_constant_summarizer_renders_degenerate_outputs_not_a_verdict() -> None:
    """Issue 64: `ght_summ` seed 2 gave one output for all 1 492 test documents, and a claim compared it with a
    transformer giving 13–90 distinct ones. A run with fewer distinct outputs than 2% of its documents is
    near-constant: its claims read "degenerate outputs" with the counts, and the outputs table says so per seed."""
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "summ.yaml"), REPO / "conf")
    refs = _documents(100, seed=0)
    records = {("transformer", s): _record("transformer", s, _degrade(refs, 0.6, seed=s), refs) for s in (1, 2, 3)}
    constant = ["development files for the library"] * len(refs)
    records |= {("ght_summ", s): _record("ght_summ", s, constant, refs) for s in (1, 2, 3)}
    data = collect(suite, References(tuple(refs), ("summ",) * len(refs)), records, bootstrap_samples=100)
    claim = next(c for c in data["claims"] if (c["system"], c["baseline"]) == ("ght_summ", "transformer"))
    assert Verdict.from_json(claim["verdict"]).words() == (
        "degenerate outputs (`ght_summ`: 1, 1, 1 distinct of 100; near-constant below 2% distinct, "
        "or not above the constant summary beyond its 95% interval)"
    )
    assert claim["verdict"]["p"] is None and claim["delta"]["seeds"] == 3  # the numbers are still shown, untested
    outputs = data["entries"]["ght_summ"]["seeds"][1]["outputs"]
    assert outputs == {"documents": 100, "distinct": 1, "top_share": 1.0, "mean_words": 5.0}
    expected_refs = round(sum(len(r.split()) for r in refs) / len(refs), 2)
    assert data["references"]["mean_words"] == expected_refs
    text = markdown({**data, "speed": [], "speed_claims": [], "speed_enabled": True}, "cmd")
    assert "| `ght_summ` | s1: **1**, s2: **1**, s3: **1** | s1: 100%, s2: 100%, s3: 100% |" in text
    assert "| `transformer` | s1: 100, s2: 100, s3: 100 |" in text  # every degraded reference is distinct
    # a constant earns nothing from its documents: its own − shuffled control is 0 on every seed
    constant_cells = ", ".join(
        f"s{s}: {dependence_text(data['entries']['ght_summ']['seeds'][s]['dependence'])}" for s in (1, 2, 3)
    )
    assert constant_cells.startswith("s1: +0.00 ± ") and f"| {constant_cells} |" in text
    assert all(abs(data["entries"]["ght_summ"]["seeds"][s]["dependence"]["gain"]) < 1e-9 for s in (1, 2, 3))
    reading = data["entries"]["transformer"]["seeds"][1]["dependence"]
    assert reading["gain"] - reading["ci95"] > 0  # degraded references still follow their documents
    assert "on every seed: `transformer`; not on every seed: `ght_summ`." in text


def test_where_validation_ended_shows_each_runs_last_validation_point() -> None:
    """The validation loss tells a model that learned more from one that did not before their test strings do
    (summ_8400: Lite1 4.79 against the 3+3's 5.45–5.48): the table shows each seed's last point of its learning
    curve — a later point, not the best — and skips points without a loss (runs recorded before it was stored)."""
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "summ.yaml"), REPO / "conf")
    refs = _documents(20, seed=0)
    records = {("transformer", s): _record("transformer", s, _degrade(refs, 0.6, seed=s), refs) for s in (1, 2, 3)}
    curves = {
        1: [
            {"step": 600, "valid_loss": 6.0, "valid_quality": 12.0, "valid_distinct": 0.3},
            {"step": 1200, "valid_loss": 5.456, "valid_quality": 11.5, "valid_distinct": 0.57},
        ],
        2: [{"step": 1000, "valid_loss": 4.791, "valid_quality": 25.47, "valid_distinct": None}],
        3: [{"step": 1200, "valid_quality": 9.0}],  # no loss stored: not shown
    }
    for seed, curve in curves.items():
        records[("transformer", seed)]["learning_curve"] = curve
    data = collect(suite, References(tuple(refs), ("summ",) * len(refs)), records, bootstrap_samples=20)
    text = markdown({**data, "speed": [], "speed_claims": [], "speed_enabled": True}, "cmd")
    assert "### Where validation ended" in text
    row = "| `transformer` | s1: 1200, s2: 1000 | s1: 5.46, s2: 4.79 | s1: 11.50, s2: 25.47 | s1: 57%, s2: — |"
    assert row in text
    for seed in (1, 2):  # records from before distinct validation outputs were counted: no such column
        for point in records[("transformer", seed)]["learning_curve"]:
            point["valid_distinct"] = None
    data = collect(suite, References(tuple(refs), ("summ",) * len(refs)), records, bootstrap_samples=20)
    text = markdown({**data, "speed": [], "speed_claims": [], "speed_enabled": True}, "cmd")
    assert "| `transformer` | s1: 1200, s2: 1000 | s1: 5.46, s2: 4.79 | s1: 11.50, s2: 25.47 |\n" in text
    assert "distinct validation outputs" not in text
    without = {seed: [{"step": 1200, "valid_quality": 9.0}] for seed in (1, 2, 3)}
    for seed, curve in without.items():
        records[("transformer", seed)]["learning_curve"] = curve
    data = collect(suite, References(tuple(refs), ("summ",) * len(refs)), records, bootstrap_samples=20)
    text = markdown({**data, "speed": [], "speed_claims": [], "speed_enabled": True}, "cmd")
    assert "Where validation ended" not in text


def test_input_dependence_is_own_less_shuffled_references_from_the_formula() -> None:
    """One-word documents, whose ROUGE-L F1 is 1 for the same word and 0 otherwise, so the control's numbers follow
    from its definition: mean over documents of own − (mean over the derangements of the shuffled pairing), with a
    normal 95% half-width over documents."""
    perms = derangements(6, count=4, seed=3)
    assert perms.shape == (4, 6) and (perms == derangements(6, count=4, seed=3)).all()  # fixed by its seed
    assert all(sorted(p) == list(range(6)) and all(i != j for i, j in enumerate(p)) for p in perms.tolist())
    with pytest.raises(ValueError, match="needs ≥ 2"):
        derangements(1)
    refs = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    assert input_dependence(refs, refs) == {"own": 100.0, "shuffled": 0.0, "gain": 100.0, "ci95": 0.0}
    constant = input_dependence(["alpha"] * 6, refs)  # scores 100 on one document, whichever pairing
    assert constant["own"] == pytest.approx(100 / 6) and constant["shuffled"] == pytest.approx(100 / 6)
    assert abs(constant["gain"]) < 1e-9
    hyps = ["alpha", "bravo", "alpha", "delta", "delta", "kilo"]
    own = np.array([100.0 * (h == r) for h, r in zip(hyps, refs, strict=True)])
    shuffled = np.mean(
        [[100.0 * (h == refs[j]) for h, j in zip(hyps, perm, strict=True)] for perm in derangements(6).tolist()], axis=0
    )
    got = input_dependence(hyps, refs)
    assert got["own"] == pytest.approx(own.mean()) and got["shuffled"] == pytest.approx(shuffled.mean())
    assert got["gain"] == pytest.approx((own - shuffled).mean())
    assert got["ci95"] == pytest.approx(1.96 * np.std(own - shuffled, ddof=1) / np.sqrt(6))
    assert dependence_text({"gain": -1e-15, "ci95": 0.5}) == "+0.00 ± 0.50"
    # on real text the control's own pairing is the headline's ROUGE-L, tokens and stemming included
    docs, refs = _documents(30, seed=5), _documents(30, seed=6)
    assert input_dependence(docs, refs)["own"] == pytest.approx(rouge(docs, refs)["rougeL"], abs=1e-9)
    orders = np.stack([np.arange(30), np.roll(np.arange(30), 1)])
    rolled = [refs[(i - 1) % 30] for i in range(30)]  # np.roll by 1: document i meets reference i - 1
    assert 100 * reordered_rouge_l(docs, refs, orders).mean(axis=1) == pytest.approx(
        [rouge(docs, refs)["rougeL"], rouge(docs, rolled)["rougeL"]], abs=1e-9
    )


def test_baselines_are_chosen_on_validation_and_scored_from_the_references(tmp_path) -> None:
    """Issue 64: lead-k's k and the constant are chosen on validation; what the report shows is recomputed from the
    stored outputs and the suite's references at render time, not stored numbers."""
    refs = _documents(60, seed=11)
    docs = [f"{r} {' '.join(random.Random(i).choice(WORDS) for _ in range(20))}" for i, r in enumerate(refs)]
    valid_refs = [r.split()[:4] for r in refs]  # documents whose first 4 words are their summary
    valid_docs = [" ".join(v + ["zz"] * 30) for v in valid_refs]
    chosen = choose_lead(valid_docs, [" ".join(v) for v in valid_refs])
    assert chosen["k"] == 4 and chosen["valid_rougeL_by_k"]["4"] == pytest.approx(100.0)
    training = ["zebra quagga okapi"] * 50 + ["package tool library"] * 3 + ["data files for the debian package"]
    constant = choose_constant(training, refs)  # the frequent nonsense loses to the summaries that share words
    assert constant["text"] != "zebra quagga okapi"
    stored = {
        "record_format": 1,
        "suite": "summ",
        "references_sha256": References(tuple(refs), ("summ",) * len(refs)).sha256,
        "constant": constant,
        "lead": {**chosen, "outputs": [lead(d, 4) for d in docs]},
        "oracle": {"outputs": oracle(docs, refs)},
    }
    write_json_gz(tmp_path / BASELINES_FILE, stored)
    scored = score_baselines(tmp_path, References(tuple(refs), ("summ",) * len(refs)))
    assert scored is not None
    assert scored["lead"]["test"] == pytest.approx(rouge([lead(d, 4) for d in docs], refs))
    assert scored["constant"]["test"] == pytest.approx(rouge([constant["text"]] * len(refs), refs))
    # the oracle sentence: each document's own best sentence, so never below any single sentence of it
    assert scored["oracle"]["test"] == pytest.approx(rouge(oracle(docs, refs), refs))
    other = References(tuple(reversed(refs)), ("summ",) * len(refs))
    with pytest.raises(RecordError, match="made for other test references"):
        score_baselines(tmp_path, other)
    floor_c, floor_l = scored["constant"]["test"]["rougeL"], scored["lead"]["test"]["rougeL"]
    assert floor_c < floor_l
    between = (floor_c + floor_l) / 2  # above the constant, below lead-4
    entries = {
        "transformer": {"seeds": {1: {"test": {"rougeL": 99.0}}, 2: {"test": {"rougeL": 1.0}}}},
        "lite": {"seeds": {1: {"test": {"rougeL": between}}, 2: {"test": {"rougeL": between + 0.1}}}},
    }
    text = "\n".join(baselines_section({"baselines": scored, "entries": entries}))
    assert f"| lead-4 | k = 4 of 1–40 (ROUGE-L {chosen['valid_rougeL_by_k']['4']:.2f}) |" in text
    assert f"{scored['lead']['test']['rougeL']:.2f} |" in text
    assert (
        f"Above the constant (test ROUGE-L > {floor_c:.2f}) on every seed: `lite`; not on every seed: `transformer`."
        in text
    )
    assert (
        f"Above lead-4 (test ROUGE-L > {floor_l:.2f}) on every seed: no entry; "
        "not on every seed: `transformer`, `lite`." in text
    )
    assert "| oracle sentence (upper bound) | the document's sentence closest to its own reference" in text
    # the paired-minus-shuffled control, recomputed from the outputs: 0 for the constant, positive for lead-4
    assert abs(scored["constant"]["dependence"]["gain"]) < 1e-9
    assert scored["lead"]["dependence"] == pytest.approx(input_dependence([lead(d, 4) for d in docs], refs))
    assert scored["lead"]["dependence"]["gain"] > scored["lead"]["dependence"]["ci95"] > 0
    assert f"{scored['constant']['test']['rougeL']:.2f} | +0.00 ± " in text


def test_oracle_sentence_is_each_documents_best_sentence_against_its_own_reference() -> None:
    """The oracle picks, per document, the sentence that scores best against that document's reference."""
    assert sentences("One tool. It reads files! Does it? yes") == ["One tool.", "It reads files!", "Does it?", "yes"]
    assert sentences("no end mark") == ["no end mark"]
    docs = ["A library for parsing. Command line tool for images.", "Fonts for the desktop. Data files."]
    refs = ["command line image tool", "data files"]
    assert oracle(docs, refs) == ["Command line tool for images.", "Data files."]


def test_budget_probe_applies_its_rule_to_the_baselines_curve(tmp_path) -> None:
    """Issue 64's probe: the smallest budget whose next budget adds < min_gain and whose outputs are distinct enough,
    each budget read at the last validation at or before it; the last budget when none qualifies (with what its last
    quarter gained); no decision before the run reaches the last budget. probe_summ.yaml states the rule."""
    suite = suite_from_config(OmegaConf.load(REPO / "conf" / "suite" / "probe_summ.yaml"), REPO / "conf")
    assert suite.probe == BudgetProbe((2400, 4800, 8400), 0.5, 0.5)

    def baseline(points: dict[int, tuple[float, float]]) -> dict:
        curve = [{"step": s, "valid_quality": q, "valid_distinct": d} for s, (q, d) in sorted(points.items())]
        return {"seeds": {1: {"learning_curve": curve}}}

    # 2250 stands for 2400: +0.3 to 4750 but only 40% distinct; 4750 → 8400 +0.2 with 60% distinct: 4800 chosen
    chosen = probe_choice(
        suite.probe, baseline({2250: (20.0, 0.4), 2500: (99.0, 1.0), 4750: (20.3, 0.6), 8400: (20.5, 0.7)})
    )
    assert [r["step"] for r in chosen["rows"]] == [2250, 4750, 8400]
    assert [r.get("qualifies") for r in chosen["rows"]] == [False, True, None]
    assert chosen["chosen"] == 4800 and chosen["last_quarter_gain"] is None
    assert chosen["rows"][0]["gain_to_next"] == pytest.approx(0.3)
    # still climbing at every budget: the last, with its last quarter's gain (8400 against 6250, the point of 6300)
    climbing = baseline({2250: (10.0, 0.9), 4750: (14.0, 0.9), 6250: (17.0, 0.9), 8400: (18.5, 0.9)})
    fallback = probe_choice(suite.probe, climbing)
    assert fallback["chosen"] == 8400 and fallback["last_quarter_gain"] == pytest.approx(1.5)
    text = "\n".join(probe_section({"probe": fallback, "task": "summarization", "baseline": "transformer"}))
    assert "| 2400 | update 2250 | 10.00 | 90% | +4.00 | no |" in text
    assert "**Chosen: 8400 updates** — no smaller budget qualifies; its last quarter still gained +1.50" in text
    assert "![budget probe](probe.png)" in text and "near-constant" not in text
    # near-constant at every budget (probe_longsumm): the fallback is chosen, and the decision says what it means
    flat = probe_choice(
        suite.probe, baseline({2250: (4.0, 0.04), 4750: (9.0, 0.04), 6250: (12.0, 0.0), 8400: (15.0, 0.0)})
    )
    flat_text = "\n".join(probe_section({"probe": flat, "task": "summarization", "baseline": "transformer"}))
    assert flat["chosen"] == 8400 and "But only 0% of its validation outputs are distinct" in flat_text
    assert "near-constant outputs at every budget probed" in flat_text
    plot_probe({"probe": fallback, "entries": {"t": climbing}, "baseline": "t", "task": "summarization"}, tmp_path)
    assert (tmp_path / "probe.png").read_bytes().startswith(b"\x89PNG")
    running = probe_choice(suite.probe, baseline({2250: (10.0, 0.9), 4750: (14.0, 0.9)}))
    assert running["chosen"] is None and not running["rows"][2]["reached"]
    assert "No decision yet" in "\n".join(probe_section({"probe": running, "task": "summarization", "baseline": "t"}))
    with pytest.raises(SuiteError, match="two or more rising"):
        suite_from_config(
            OmegaConf.merge(
                OmegaConf.load(REPO / "conf" / "suite" / "probe_summ.yaml"), {"probe": {"budgets": [4800, 2400]}}
            ),
            REPO / "conf",
        )


def test_learning_curves_draw_every_seed_and_the_distinct_share(report: dict, tmp_path) -> None:
    """The figure's series come from every seed's record (not only the first), each with its distinct-output shares
    and validation losses where the run recorded them; a summarization figure gets a loss panel and a distinct panel
    then (a translation one no loss panel), and the same records give the same bytes."""
    report = copy.deepcopy(report)  # the fixture is shared by the module's tests
    report["entries"]["ght_summ"]["seeds"][2]["learning_curve"] = [
        {"step": 250, "valid_quality": 3.0, "valid_distinct": 0.01, "valid_loss": 7.0},
        {"step": 500, "valid_quality": None, "valid_distinct": None},  # a validation without quality is left out
        {"step": 750, "valid_quality": 9.0, "valid_distinct": 0.4, "valid_loss": 6.2},
    ]
    series = curves(report)
    assert [(c.entry, c.seed) for c in series] == [(e, str(s)) for e in report["entries"] for s in (1, 2, 3)]
    drawn = next(c for c in series if c.entry == "ght_summ" and c.seed == "2")
    assert drawn == Curve("ght_summ", "2", [250, 750], [3.0, 9.0], [0.01, 0.4], [7.0, 6.2])
    plot_learning_curves(report, tmp_path / "a.png")
    plot_learning_curves(report, tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    height = {}
    for name, task, curve in (
        ("loss-distinct", "summarization", None),  # three panels: quality, loss, distinct
        ("distinct", "translation", None),  # a translation suite draws no loss panel
        ("quality", "summarization", [{"step": 1, "valid_quality": 1.0}]),  # nothing else recorded: one panel
    ):
        data = {**report, "task": task}
        if curve is not None:
            data["entries"] = {"t": {"seeds": {1: {"learning_curve": curve}}}}
        plot_learning_curves(data, tmp_path / f"{name}.png")
        height[name] = Image.open(tmp_path / f"{name}.png").size[1]
    assert height["quality"] < height["distinct"] < height["loss-distinct"]
