"""Issue 64: an exported summarizer is bounded by its own training summaries' lengths, not translation's
1.2 · source + 10 — the manifest's search defaults come from the lengths the checkpoint stores."""

from __future__ import annotations

import math

from omegaconf import OmegaConf

from export.exporter import search_settings
from zoo.api import SUMMARY_LENGTH_MARGIN, task_length_defaults
from zoo.train import target_lengths

PAIRS = [([5, 6, 7], list(range(n))) for n in [3] * 90 + [8] * 9 + [40]]  # 100 summaries: p50 3, p99 40


def _generation(**given) -> OmegaConf:
    keys = ("beam_size", "len_penalty", "max_len_a", "max_len_b", "min_len")
    return OmegaConf.create({"generation": {k: given.get(k) for k in keys}})


def test_a_summarizer_s_length_bound_comes_from_its_training_summaries() -> None:
    lengths = target_lengths(PAIRS)
    assert lengths == {"p50": 3, "p99": 40, "max": 40}
    payload = {"task": "summarization", "target_lengths": lengths}
    assert task_length_defaults(payload) == {"max_len_a": 0.0, "max_len_b": math.ceil(SUMMARY_LENGTH_MARGIN * 40)}
    search = search_settings(_generation(), payload)
    assert (search.max_len_a, search.max_len_b, search.beam_size) == (0.0, 44, 5)
    given = search_settings(_generation(max_len_a=0.5, max_len_b=7), payload)  # the command line wins
    assert (given.max_len_a, given.max_len_b) == (0.5, 7)


def test_a_translator_keeps_the_zoo_s_length_defaults() -> None:
    payload = {"task": "translation", "target_lengths": {"p50": 3, "p99": 40, "max": 40}}
    search = search_settings(_generation(), payload)
    assert (search.max_len_a, search.max_len_b) == (1.2, 10)


def test_an_old_summarizer_checkpoint_keeps_them_and_says_how_to_bound_it(caplog) -> None:
    search = search_settings(_generation(), {"task": "summarization"})  # saved before target_lengths existed
    assert (search.max_len_a, search.max_len_b) == (1.2, 10)
    assert "generation.max_len_a=0 generation.max_len_b=<pieces>" in caplog.text
