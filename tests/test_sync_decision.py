"""The synchronous baseline's one decision, worked by hand: roll out now, and how much?"""

from __future__ import annotations

import pytest

from dart_ray.run.driver import sync_groups_needed


def curator(**kw: int) -> dict[str, int]:
    m = {"filling_groups": 0, "ready_groups": 0, "queue_depth": 0, "steps_handed": 0}
    m.update(kw)
    return m


@pytest.mark.parametrize(
    ("available", "state", "trained", "needed"),
    [
        (0, curator(), 0, 4),  # nothing anywhere: a whole step's groups
        (3, curator(), 0, 0),  # rows in the log the curator has not claimed yet
        (0, curator(filling_groups=1), 0, 0),  # a group waiting for members or its timeout
        (0, curator(queue_depth=1), 0, 0),  # a step queued for the trainer
        (0, curator(steps_handed=2), 1, 0),  # a step handed out, not trained yet
        (0, curator(steps_handed=2), 2, 4),  # both trained: the next step
        # one of four groups was dropped: the step lacks one group, not four (the old rule
        # waited for ever on the three curated groups, or sampled a whole step too many)
        (0, curator(ready_groups=3), 0, 1),
        (0, curator(ready_groups=5), 0, 1),  # never none: something must move
    ],
)
def test_sync_rolls_out_what_the_next_step_lacks(
    available: int, state: dict[str, int], trained: int, needed: int
) -> None:
    assert sync_groups_needed(available, state, trained, 4) == needed
