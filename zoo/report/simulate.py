"""How often a verdict rule says "holds" or "does not hold" where the true Δ sits on the claim's bound: simulated
runs of the shapes real ones have (tests/test_verdicts.py runs the single-look rule through these; a suite with a
second look stores its two-look rates in `second_look.json` by `python -m zoo.report +suite=<name>
'stages=[simulate]'`, and its REPORT.md renders them).

The scenarios put the variance where real runs put it: in the seeds (each seed's system shifted by its own
effect), in the test set every seed shares (a sentence's effect, the same for every seed), or in both.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from zoo.metrics import mean_from_stats
from zoo.report.claims import ALPHA, Question, decision_p, delta_test, judge
from zoo.report.second_look import SIMULATION_FILE, SecondLook

# (seed sd, shared per-sentence sd, own noise sd) on 200 sentences: seeds dominate; the two components comparable
# (Welch–Satterthwaite's df gave 7.6% false positives here at 3 seeds); the test set dominates.
SCENARIOS = {"seeds": (0.5, 0.0, 2.0), "comparable": (0.4, 2.0, 2.0), "sentences": (0.1, 5.0, 2.0)}
SENTENCES = 200
BOOTSTRAP = 200  # resamples per simulated Δ test (the reports use 1000)


def shared_runs(
    rng: np.random.Generator, offsets: list[float], seed_sd: float, shared_sd: float, noise: float, sentences: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(system, baseline) per seed, the way real runs differ: each seed's system is shifted by its offset plus a
    seed effect (sd `seed_sd`), every sentence by an effect all seeds share (sd `shared_sd`: the test set is one
    sample of sentences, whose population mean effect is the offset) and by noise of its own run (sd `noise`)."""
    shared = rng.normal(0.0, shared_sd, sentences)
    pairs = []
    for offset in offsets:
        base = rng.normal(20.0, 6.0, sentences)
        system = base + offset + rng.normal(0.0, seed_sd) + shared + rng.normal(0.0, noise, sentences)
        pairs.append(tuple(np.stack([s, np.ones(sentences)], axis=1) for s in (system, base)))
    return pairs  # type: ignore[return-value]


def two_look_rates(
    design: SecondLook, first_seeds: int, scenario: str, simulations: int, seed: int = 85
) -> dict[str, float | int]:
    """Under no effect (a `better` claim alone in its family, Δ = 0): the share of simulations whose verdict is
    definite with look 1 alone, with the declared two looks, and with the seeds of look 2 added after look 1 and
    tested at α as if they had been planned (what the design replaces)."""
    seed_sd, shared_sd, noise = SCENARIOS[scenario]
    rng = np.random.default_rng(seed)
    total = first_seeds + len(design.seeds)
    first = designed = naive = 0
    for i in range(simulations):
        pairs = shared_runs(rng, [0.0] * total, seed_sd, shared_sd, noise, SENTENCES)
        look1 = delta_test(pairs[:first_seeds], score=mean_from_stats, samples=BOOTSTRAP, seed=i)
        both = delta_test(pairs, score=mean_from_stats, samples=BOOTSTRAP, seed=i)
        p1, p2 = decision_p(look1, "better")[0], decision_p(both, "better")[0]
        first += p1 < ALPHA
        naive += p1 < ALPHA or p2 < ALPHA
        [verdict] = judge([Question("better", first_seeds, look1, second=both)], design=design)
        designed += verdict.p_holm is not None and verdict.p_holm < ALPHA
    return {
        "simulations": simulations,
        "look1_alone": first / simulations,
        "designed": designed / simulations,
        "naive": naive / simulations,
    }


def simulate_second_look(results_dir: Path, design: SecondLook, first_seeds: int, simulations: int) -> Path:
    """Store the two-look rule's simulated false-positive rates for every scenario in results_dir."""
    start = time.perf_counter()
    out: dict[str, Any] = {
        "design": {
            "seeds": list(design.seeds),
            "first_share": design.first_share,
            "continue_below": design.continue_below,
        },
        "first_seeds": first_seeds,
        "alpha": ALPHA,
        "sentences": SENTENCES,
        "bootstrap": BOOTSTRAP,
        "scenarios": {},
    }
    for name, (seed_sd, shared_sd, noise) in SCENARIOS.items():
        rates = two_look_rates(design, first_seeds, name, simulations)
        out["scenarios"][name] = {"seed_sd": seed_sd, "shared_sd": shared_sd, "noise_sd": noise, **rates}
        print(f"[simulate] {name}: {rates}", flush=True)
    out["se_at_alpha"] = math.sqrt(ALPHA * (1 - ALPHA) / simulations)
    out["minutes"] = round((time.perf_counter() - start) / 60, 1)
    path = results_dir / SIMULATION_FILE
    results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return path


__all__ = ["SCENARIOS", "shared_runs", "simulate_second_look", "two_look_rates"]
