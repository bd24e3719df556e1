"""`python -m serve.first_request export_dir=<dir>`: what warm-up buys — time to ready and first-request latency
of a freshly started server, with `model_warmup` off and on, rounds interleaved.

Why a command: "the first user pays for ORT's first runs" is a claim about one number that depends on the model
and the machine; this measures it (serve/README.md quotes its output). Per round and setting: write a repository
(one instance, so the first request surely meets a fresh instance), start a server, time until ready, then time a
beam request (the default search), the same again (warm), a greedy request and the same again. The request
sentence is a held-out source other than the warm-up sample. Writes results.json and results.md to `out`.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from export.runtime.search import DEFAULT_MAX_REQUEST_COST
from serve.client import Client
from serve.errors import ServeError
from serve.model_config import ModelSettings, read_manifest
from serve.repository import write_repository
from serve.server import Server
from serve.warmup import plan_warmup
from zoo.errors import one_line_errors

COLUMNS = ("ready_s", "first_beam_ms", "warm_beam_ms", "first_greedy_ms", "warm_greedy_ms")


def _timed_ms(client: Client, text: str, **search: Any) -> float:
    start = time.perf_counter()
    client.translate([text], **search)
    return (time.perf_counter() - start) * 1000.0


def one_round(export_dir: Path, work: Path, warmup: bool, settings: dict[str, Any], text: str) -> dict[str, float]:
    """Fresh repository and server; the timings of COLUMNS."""
    repo = work / f"repo-{'warm' if warmup else 'cold'}"
    values = {**settings, "warmup": warmup, "instance_count": 1}
    (name,) = write_repository([export_dir], repo, ModelSettings.from_mapping(values), overwrite=True)
    start = time.perf_counter()
    with Server.start(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        ready = time.perf_counter() - start
        with Client(server.info.grpc_url, "grpc", name) as client:
            first_beam = _timed_ms(client, text)
            warm_beam = _timed_ms(client, text)
            first_greedy = _timed_ms(client, text, beam_size=1)
            warm_greedy = _timed_ms(client, text, beam_size=1)
    return dict(zip(COLUMNS, (ready, first_beam, warm_beam, first_greedy, warm_greedy), strict=True))


def measure(cfg: DictConfig) -> dict[str, Any]:
    export_dir = Path(cfg.export_dir)
    manifest = read_manifest(export_dir)
    settings = OmegaConf.to_container(cfg.server, resolve=True) or {}
    plan = plan_warmup(export_dir, manifest, int(settings.get("max_batch_size", 64)), DEFAULT_MAX_REQUEST_COST)
    sources = json.loads((export_dir / manifest["heldout"]).read_text(encoding="utf-8"))["src"]
    text = next((s for s in sources if s.strip() and (plan is None or s != plan.sentence)), None)
    if text is None:
        raise ServeError(f"{export_dir} has no held-out sentence to send; export it again with verification on")
    out = Path(cfg.out or f"bench/first-request-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    out.mkdir(parents=True, exist_ok=True)
    rounds: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for k in range(int(cfg.rounds)):
        for key in ("off", "on") if k % 2 == 0 else ("on", "off"):  # interleaved, order alternating
            rounds[key].append(one_round(export_dir, out, key == "on", settings, text))
            print(f"round {k + 1} warmup {key}: " + "  ".join(f"{c} {v:.1f}" for c, v in rounds[key][-1].items()))
    medians = {key: {c: statistics.median(r[c] for r in rs) for c in COLUMNS} for key, rs in rounds.items()}
    result = {"export": str(export_dir), "model": manifest["name"], "text": text, "rounds": rounds, "median": medians}
    (out / "results.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    (out / "results.md").write_text(markdown(result))
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    rows = [
        f"| {key} | " + " | ".join(f"{result['median'][key][c]:.1f}" for c in COLUMNS) + " |" for key in ("off", "on")
    ]
    n = len(result["rounds"]["on"])
    return (
        f"First request to a fresh server, {result['model']}, one instance, median of {n} interleaved rounds\n\n"
        "| warm-up | " + " | ".join(COLUMNS) + " |\n|---|" + "---:|" * len(COLUMNS) + "\n" + "\n".join(rows) + "\n"
    )


@hydra.main(config_path="../conf", config_name="first_request", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors(ServeError):
        measure(cfg)


if __name__ == "__main__":
    main()
