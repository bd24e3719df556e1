"""`python -m serve.bench.prices <export> [--out FILE] [--rounds 15]`: measure what each decoding option costs the
served model, and write the price rule's calibration (serve/triton/model_prices.py reads it as `prices.json`).

One real tritonserver with one instance of one ORT thread — what one lane of one instance spends — queried over
Triton's own loopback gRPC listener (nginx and the gate cost the front, not the instance). Per round, in rotated
order: one empty source; 16 empty sources; 16 sources forced to exactly `--length` output tokens greedily; the same
with beam 5, with sampling (top_p 0.9), with repetition_penalty 1.2, with no_repeat_ngram_size 3 and, where the
export has the alignment output, with return_alignments. Medians over the rounds give the fixed costs (an empty
source's request: per request; each further empty row: per row), a plain row-step's time, and each option's
factor: its time per row-step (row-steps as the served model counts them: `request_cost`) over the plain one's.
Pass the report to `serve.repository … triton.prices=<file>`; serve/triton/default_prices.json is this command's
report on the test suite's smoke transformer (vocabulary 1,000) — sampling costs more with a larger vocabulary, so
calibrate on the model you serve.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 16
PLAIN = {"beam_size": 1}
OPTIONS: dict[str, dict[str, Any]] = {  # each priced option (model_prices.OPTIONS) as the settings that use it
    "beam": {"beam_size": 5},
    "sampling": {"beam_size": 1, "sampling": 1, "top_p": 0.9, "seed": 1},
    "repetition_penalty": {"beam_size": 1, "repetition_penalty": 1.2},
    "no_repeat_ngram_size": {"beam_size": 1, "no_repeat_ngram_size": 3},
    "return_alignments": {"beam_size": 1, "return_alignments": True},
}


def _forced(settings: dict[str, Any], length: int) -> dict[str, Any]:
    return {**settings, "min_len": length, "max_len_a": 0.0, "max_len_b": length}


def request_kinds(local: Any, export_dir: Path, length: int) -> dict[str, tuple[list[str], dict[str, Any], int]]:
    """name → (texts, request parameters, row-steps as the served model counts them) of every timed request."""
    sources = [s for s in json.loads((export_dir / "heldout.json").read_text())["src"] if s.strip()][:ROWS]
    lengths = [len(ids) for ids in local.encode_texts(sources)]
    try:
        local.check_alignments()
        options = OPTIONS
    except Exception:  # an export without the alignment output: that option is not measured
        options = {k: v for k, v in OPTIONS.items() if k != "return_alignments"}

    def row_steps(texts: list[str], settings: dict[str, Any]) -> int:
        search = local.search_settings(**{k: v for k, v in settings.items() if k != "return_alignments"})
        return local.request_cost([n for n, t in zip(lengths, texts, strict=False) if t.strip()], search)

    kinds = {
        "empty_1": ([""], PLAIN),
        f"empty_{ROWS}": ([""] * ROWS, PLAIN),
        "plain": (sources, _forced(PLAIN, length)),
        **{name: (sources, _forced(settings, length)) for name, settings in options.items()},
    }
    return {name: (texts, settings, row_steps(texts, settings)) for name, (texts, settings) in kinds.items()}


def measure(
    grpc_url: str,
    model: str,
    kinds: dict[str, tuple[list[str], dict[str, Any], int]],
    rounds: int,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """`statistic` (the median; `min` on a machine shared with other work, where interference only ever adds waiting,
    worst for the shortest requests) of each kind of request's seconds, sent one at a time in `rounds` rotated rounds
    after one warm-up."""
    import tritonclient.grpc as grpcclient

    seconds: dict[str, list[float]] = {name: [] for name in kinds}
    with grpcclient.InferenceServerClient(grpc_url) as client:

        def once(name: str) -> float:
            texts, settings, _ = kinds[name]
            tensor = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_).reshape(-1, 1))
            begin = time.perf_counter()
            client.infer(model, [tensor], parameters=settings)
            return time.perf_counter() - begin

        names = list(kinds)
        for name in names:
            once(name)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                seconds[name].append(once(name))
    return {name: statistic(values) for name, values in seconds.items()}


def fit(median: dict[str, float], kinds: dict[str, tuple[list[str], dict[str, Any], int]]) -> dict[str, Any]:
    """The rule from the medians: an empty source's request is the per-request cost, each further empty row the
    per-row cost; what a plain translation takes beyond them per row-step is the unit; each option's factor is its
    time per row-step beyond the fixed costs over the unit (at least 1)."""
    per_request = median["empty_1"]
    per_row = max(0.0, (median[f"empty_{ROWS}"] - per_request) / (ROWS - 1))
    fixed = per_request + ROWS * per_row
    step = (median["plain"] - fixed) / kinds["plain"][2]
    factors = {
        name: round(max(1.0, (median[name] - fixed) / kinds[name][2] / step), 3) for name in OPTIONS if name in median
    }
    return {
        "factors": factors,
        "per_row": round(per_row / step, 2),
        "per_request": round(per_request / step, 2),
        "plain_row_step_ms": round(1000 * step, 4),
    }


def calibrate(export_dir: Path, rounds: int, length: int) -> dict[str, Any]:
    """The report: the fitted rule, and the medians and row-steps it was fitted to."""
    import export
    from serve.model_config import ModelSettings
    from serve.repository import write_repository
    from serve.server import Server

    kinds = request_kinds(export.load(export_dir, threads=1), export_dir, length)
    with tempfile.TemporaryDirectory() as tmp:
        repo, neutral = Path(tmp) / "repo", Path(tmp) / "neutral_prices.json"
        neutral.write_text(json.dumps({"factors": {}, "per_row": 0, "per_request": 0}))  # requests go one at a time
        settings = ModelSettings(  # no batcher delay: what is timed is the instance's work
            threads=1, instance_count=1, max_batch_size=ROWS, dynamic_batching=False, prices=str(neutral)
        )
        write_repository([export_dir], repo, settings)
        with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
            median = measure(server.info.triton_grpc_url, server.info.models[0], kinds, rounds)
    return {
        "model": export_dir.name,
        **fit(median, kinds),
        "median_ms": {name: round(1000 * value, 3) for name, value in median.items()},
        "row_steps": {name: kind[2] for name, kind in kinds.items()},
        "rounds": rounds,
        "rows": ROWS,
        "forced_length": length,
        "not_measured": [name for name in OPTIONS if name not in kinds],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve.bench.prices", description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="an export directory (python -m export)")
    parser.add_argument("--out", type=Path, default=Path("prices.json"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--length", type=int, default=40, help="output tokens every timed translation is forced to")
    args = parser.parse_args(argv)
    from zoo.machine import cpu_signature

    report = calibrate(args.export, args.rounds, args.length)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_signature(),
        "command": f"python -m serve.bench.prices <export of {report['model']}> --rounds {args.rounds} "
        f"--length {args.length}",
        **report,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
