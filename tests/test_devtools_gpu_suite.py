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


def test_a_run_that_could_finish_once_the_others_end_is_not_late() -> None:
    # 2026-11-30: ght_ps_summ seed 3 at update 1000 of 2400 at 291 s, ≈ 5.2 updates/s since 100 s under a 12-way
    # share, its vote ahead; shed as late (deadline 562 s), it trained to its end in ≈ 4 minutes once alone
    assert projected_end(291.0, 1000, (100.0, 0), 2400, pending_vote=True) > 562.0  # at the shared rate: late
    assert projected_end(291.0, 1000, (100.0, 0), 2400, pending_vote=True, share=12) < 562.0


def test_a_run_that_cannot_finish_even_alone_is_late() -> None:
    # 1400 updates left at ≈ 5.2 updates/s with one other run alive: even twice that rate ends past the deadline
    assert projected_end(540.0, 1000, (349.0, 0), 2400, pending_vote=False, share=2) > 562.0
