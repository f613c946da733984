"""Adaptive data curation that is pure arithmetic: rollout budget, step limits, replay.

DART-GUI's dynamic rollout number gives a task the policy already solves fewer rollouts:

    n(sr) = max(1, int(9 / sr - 7))   for sr > 0.6,   else n_max (8)

so sr = 1.0 -> 2, 0.9 -> 3, 0.8 -> 4, 0.7 -> 5. It is tied to n_max = 8; `linear` is the
configurable alternative, n = round(n_max - (n_max - n_min) * sr).

The step limit of a task follows the lengths of its successful trajectories: a task solved in
at most L steps gets ceil(slack * L) + margin (never above the global limit), so easy tasks
stop wasting environment time on hopeless tails. Unsolved tasks keep the global limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypeVar

BudgetRule = Literal["dart", "linear"]


def rollout_budget(
    success_rate: float | None,
    *,
    n_max: int = 8,
    n_min: int = 1,
    rule: BudgetRule = "dart",
    threshold: float = 0.6,
) -> int:
    """Rollouts for a task with this recent success rate (None: unknown -> n_max)."""
    if success_rate is None:
        return n_max
    sr = min(max(success_rate, 0.0), 1.0)
    if rule == "dart":
        if sr <= threshold:
            return n_max
        return min(n_max, max(n_min, int(9 / sr - 7)))
    if rule == "linear":
        return max(n_min, min(n_max, round(n_max - (n_max - n_min) * sr)))
    raise ValueError(f"unknown rollout budget rule {rule!r}")


def step_limit(
    success_lengths: Sequence[int], *, global_max: int, slack: float = 1.5, margin: int = 2
) -> int:
    """Max steps for a task from the lengths of its successful trajectories."""
    if not success_lengths:
        return global_max
    return max(1, min(global_max, math.ceil(slack * max(success_lengths)) + margin))


T = TypeVar("T")


def replay_into_group(
    group: Sequence[T], successes: Sequence[bool], replay: T | None
) -> tuple[list[T], int | None]:
    """Success replay: an all-fail group gets `replay` (the task's newest success) in place
    of its first member (the oldest). Returns the new group and the replaced index (or None).
    """
    if replay is None or not group or any(successes):
        return list(group), None
    return [replay, *group[1:]], 0
