"""Adaptive data curation that is pure arithmetic: rollout budget, step limits, replay.

DART-GUI's dynamic rollout number gives a task the policy already solves fewer rollouts:

    n(sr) = max(1, int(9 / sr - 7))   for sr > 0.6,   else n_max (8)

so sr = 1.0 -> 2, 0.9 -> 3, 0.8 -> 4, 0.7 -> 5. It is tied to n_max = 8; `linear` is the
configurable alternative, n = round(n_max - (n_max - n_min) * sr).

The step limit of a task follows the lengths of its successful trajectories: a task solved in
at most L steps gets ceil(slack * L) + margin (never above the global limit), so easy tasks
stop wasting environment time on hopeless tails. Unsolved tasks keep the global limit.

Back-off spends rollouts where there is signal. A GRPO group whose rewards are all equal is
dropped (`no_signal`), so a task that nothing in the policy solves eats full groups for
nothing. A task whose last `after` decided groups all ended without signal is skipped for
1, 2, 4, ... of its visits (capped at `max_skips`), each skip streak one longer than the
last, and then retried with an ordinary group; any group with signal ends the streak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from dart_ray.records import Status

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


GroupKind = Literal["signal", "failed", "solved", "void", "open"]
"""How a logged group ended, as back-off reads it: `signal` (trainable rewards differ),
`failed` / `solved` (all equal, below / at the success threshold), `void` (the curator
trains it in no case: an ENV_ERROR member, or fewer than two trainable members), `open`
(members still missing and nothing decided yet)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One logged trajectory of a task, as back-off reads the log (newest first)."""

    group_id: str
    group_size: int
    reward: float
    status: Status


def group_kinds(rows: Sequence[Outcome], *, threshold: float) -> list[GroupKind]:
    """The kind of each group among `rows` (a task's newest log rows, newest first), newest
    group first (a group is as new as its newest row). Rows without a group id are skipped.

    A group is decided once its slots are filled (every member but retried ABORTED attempts,
    as the curator counts them), or as soon as two trainable rewards differ (no later member
    can take that signal back). The oldest group of a window the query cut may look
    unfilled: it is `open`, which counts for nothing."""
    order: list[str] = []
    groups: dict[str, list[Outcome]] = {}
    for r in rows:
        if not r.group_id:
            continue
        if r.group_id not in groups:
            order.append(r.group_id)
            groups[r.group_id] = []
        groups[r.group_id].append(r)
    kinds: list[GroupKind] = []
    for gid in order:
        members = groups[gid]
        rewards = [m.reward for m in members if m.status.trainable]
        final = sum(1 for m in members if m.status is not Status.ABORTED)
        if any(m.status is Status.ENV_ERROR for m in members):
            kinds.append("void")
        elif len(set(rewards)) > 1:
            kinds.append("signal")
        elif final < max(members[0].group_size, 1):
            kinds.append("open")
        elif len(rewards) < 2:
            kinds.append("void")
        else:
            kinds.append("solved" if rewards[0] >= threshold else "failed")
    return kinds


def no_signal_streak(
    kinds: Sequence[GroupKind], *, replay: bool = False, count_solved: bool = False
) -> int:
    """Decided groups without signal in a row, newest first (`open` and `void` groups are
    passed over: they say nothing about the task).

    `replay`: the curator would give an all-fail group the task's newest success (success
    replay is on and that success is fresh enough), so such a group trains: it ends the
    streak like a group with signal. `count_solved`: all-success groups count too; off, an
    all-success group ends the streak (the dynamic budget already cuts a solved task to its
    minimum, and those few rollouts are what notices a regression)."""
    n = 0
    for k in kinds:
        if k in ("open", "void"):
            continue
        if (k == "failed" and not replay) or (k == "solved" and count_solved):
            n += 1
        else:
            break
    return n


@dataclass(frozen=True, slots=True)
class Backoff:
    """Skip a task with no signal in its last `after` groups for 1, 2, 4, ... visits."""

    after: int = 3
    """Groups without signal in a row before a task is first skipped."""
    max_skips: int = 8
    """Most visits skipped in a row: every task is retried at least once in this + 1."""
    lookahead: int = 16
    """Most tasks one scheduling decision looks at (reads the history of) before it opens
    the one whose back-off ends soonest: a bound on log reads per group when most tasks are
    backed off (e.g. early in a run that solves nothing yet)."""

    def __post_init__(self) -> None:
        if self.after < 1 or self.max_skips < 1 or self.lookahead < 1:
            raise ValueError(f"back-off needs after, max_skips and lookahead >= 1, got {self}")

    def skips(self, streak: int) -> int:
        """Visits to skip after a streak of `streak` groups without signal: 0 below `after`,
        then 1 at `after`, doubling with each further group (each retry that found nothing)
        up to `max_skips`."""
        if streak < self.after:
            return 0
        return min(self.max_skips, 2 ** min(streak - self.after, 62))

    @property
    def window(self) -> int:
        """Groups worth reading: the streak at which the skips reach `max_skips`."""
        return self.after + math.ceil(math.log2(self.max_skips))
