"""Beam search and greedy search through the incremental cache equal the full-recompute
reference on smoke-trained (non-degenerate) checkpoints, for every model entry."""

from __future__ import annotations

import pytest
import torch

from tests.zoo_testing import ENTRIES
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.data import Tokenizer
from zoo.generate import SearchConfig, beam_search, generate, greedy_search


def _sources(run_dir, n: int = 24) -> tuple[torch.Tensor, object, Tokenizer]:
    payload = load_checkpoint(run_dir)
    model = model_from_checkpoint(payload)
    tok = Tokenizer.from_bytes(payload["tokenizer"])
    texts = payload["heldout"]["src"][:n]
    ids = [tok.encode(t) for t in texts]
    width = max(map(len, ids))
    src = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):
        src[i, : len(row)] = torch.tensor(row)
    return src, model, tok


@pytest.mark.parametrize("entry", ENTRIES)
def test_cached_search_equals_full_recompute(entry: str, smoke_run) -> None:
    src, model, _ = _sources(smoke_run(entry))
    cfg = SearchConfig(beam_size=4, len_penalty=1.0, max_len_a=1.2, max_len_b=10)
    cached = beam_search(model, src, cfg, use_cache=True)
    reference = beam_search(model, src, cfg, use_cache=False)
    assert cached == reference
    assert greedy_search(model, src, cfg, use_cache=True) == greedy_search(model, src, cfg, use_cache=False)


def test_smoke_checkpoint_is_non_degenerate(smoke_run) -> None:
    """The shared smoke checkpoint of the baseline gives input-dependent, mostly non-looping output.
    (Smoke-trained GHT models under the full-strength group constraint can still emit one sentence for
    every input after 300 updates; their beam equality above holds regardless.)"""
    src, model, _ = _sources(smoke_run("transformer"))
    hyps = beam_search(model, src, SearchConfig(beam_size=4))
    assert len({tuple(h) for h in hyps}) >= len(hyps) // 2
    long_hyps = [h for h in hyps if len(h) > 3]
    assert sum(len(set(h)) > 1 for h in long_hyps) >= len(long_hyps) / 2


def test_beam_one_is_greedy_and_beam_finds_better_or_equal_scores(smoke_run) -> None:
    src, model, _ = _sources(smoke_run("transformer"))
    greedy = greedy_search(model, src, SearchConfig(beam_size=1))
    assert generate(model, src, SearchConfig(beam_size=1)) == greedy
    beam = beam_search(model, src, SearchConfig(beam_size=4, len_penalty=0.0))

    def logprob(hyp: list[int], row: int) -> float:
        ids = torch.tensor([[model.cfg.bos_id, *hyp]])
        target = torch.tensor([[*hyp, model.cfg.eos_id]])
        with torch.no_grad():
            memory, pad = model.encode(src[row : row + 1])
            lprobs = model.decode(ids, memory, pad).log_softmax(-1)
        return float(lprobs.gather(-1, target[..., None]).sum())

    # with len_penalty 0 beam search maximises the raw log-probability. It is a heuristic, not exact search:
    # the greedy path can be pruned by prefixes that score better early and end worse (seen on a smoke
    # checkpoint: a repetitive beam hypothesis 1.9 nats below greedy), so require it on most rows and on average.
    rows = range(src.shape[0])
    gains = [logprob(beam[r], r) - logprob(greedy[r], r) for r in rows]
    assert sum(g >= -1e-4 for g in gains) >= 0.8 * len(gains), gains
    assert sum(gains) / len(gains) >= 0, gains


def test_max_length_is_respected(smoke_run) -> None:
    src, model, _ = _sources(smoke_run("transformer"), n=8)
    cfg = SearchConfig(beam_size=3, max_len_a=0.0, max_len_b=3)
    for hyp in beam_search(model, src, cfg) + greedy_search(model, src, cfg):
        assert len(hyp) <= 2  # max_len counts the eos
