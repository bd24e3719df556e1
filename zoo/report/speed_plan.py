"""What the speed stage times, in which order: the entries plus the baseline's A/A control, rotated per round.

Pure planning (no models, no processes), so the order and the control's place are testable without timing:
  control   the baseline's own export timed a second time under `<baseline>@control`: the two decode the same
            graph on the same work, so their ratio is the measurement's noise floor — a speed file that cannot
            tell a model from itself carries no speed-up claims
  order     the control sits mid-list, as far from the baseline in time as a typical pair of entries, and every
            round rotates the list by one, so no entry (nor the control) always runs first or last on a warming
            machine
"""

from __future__ import annotations

CONTROL_SUFFIX = "@control"


def control_name(baseline: str) -> str:
    """The A/A control's entry name in a speed file."""
    return f"{baseline}{CONTROL_SUFFIX}"


def with_control(names: list[str], baseline: str) -> list[str]:
    """The timed entries: `names` with the baseline's control inserted halfway."""
    if baseline not in names:
        raise ValueError(f"the baseline {baseline!r} is not among the timed entries {names}")
    mid = (len(names) + 1) // 2
    return [*names[:mid], control_name(baseline), *names[mid:]]


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """Each round's order: the list rotated by the round's index."""
    out = []
    for r in range(rounds):
        shift = r % len(names)
        out.append(names[shift:] + names[:shift])
    return out


__all__ = ["CONTROL_SUFFIX", "control_name", "round_orders", "with_control"]
