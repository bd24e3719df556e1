"""The GPU monitor's end projection: shedding a run projected late loses it, so the projection must not count
Voting-to-Stay twice (a GHT-PS run shed on 2026-11-28 would have finished)."""

import pytest

from zoo.devtools.gpu_suite import projected_end


def test_end_is_rate_over_updates_left_plus_test() -> None:
    # 1000 updates in 100 s -> 10 upd/s; 3800 left -> 380 s; + 40 s test
    assert projected_end(200.0, 1000, (100.0, 0), 4800, pending_vote=False) == pytest.approx(620.0)


def test_a_vote_still_ahead_adds_its_time() -> None:
    assert projected_end(200.0, 1000, (100.0, 0), 4800, pending_vote=True) == pytest.approx(670.0)


@pytest.mark.parametrize(
    ("now", "step", "ref", "why"),
    [
        (321.0, 2900, (321.0, 2900), "rate restarted at the vote this tick"),
        (330.0, 2950, (321.0, 2900), "window under 15 s"),
        (400.0, 2900, (321.0, 2900), "no progress (voting pass or test)"),
        (400.0, 4800, (321.0, 2900), "training done, in its test"),
    ],
)
def test_unknown_rate_is_not_projected(now: float, step: int, ref: tuple[float, int], why: str) -> None:
    assert projected_end(now, step, ref, 4800, pending_vote=False) is None, why


def test_run_just_past_its_vote_is_not_projected_late() -> None:
    # the 2026-11-28 case: ght_ps seed 3 at 2900 at 321 s, just past its vote; the other two fine-tuned at ~20 upd/s
    assert projected_end(351.0, 3500, (321.0, 2900), 4800, pending_vote=False) < 560.0
