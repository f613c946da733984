"""Which task runs next, in which GRPO group, with how many rollouts and steps.

Tasks are visited in a seeded shuffled order, epoch after epoch. Each visit opens a group of
`n = rollout_budget(recent success rate)` slots (DART-GUI's dynamic rollout number) whose
episodes may take up to `step_limit(longest success)` steps (dynamic trajectory length).
Slots are handed out one at a time, so a new episode starts the moment any other finishes
(rollout-wise sampling), and a group's episodes run in parallel on whatever sessions are free.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dart_ray.algo.curriculum import BudgetRule, rollout_budget, step_limit
from dart_ray.records import Task


@dataclass(frozen=True)
class TaskHistory:
    """What the curriculum reads about a task (from the durable log)."""

    recent_success: float | None
    """Success rate over the recent trainable episodes; None if there are none yet."""
    longest_success: int = 0


@dataclass(frozen=True)
class PlannedSlot:
    task: Task
    group_id: str
    group_size: int
    max_steps: int


class Scheduler:
    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        n_rollouts: int,
        max_steps: int,
        history: Callable[[str], TaskHistory],
        dynamic: bool = True,
        rule: BudgetRule = "dart",
        seed: int = 0,
        incarnation: str = "",
    ) -> None:
        """`incarnation` goes into every group id: a restarted rollouter or a resumed run
        passes a fresh one, so its groups never merge with groups of an earlier life that
        are already in the log."""
        if not tasks:
            raise ValueError("the scheduler needs at least one task")
        self.tasks = list(tasks)
        self.n_rollouts = n_rollouts
        self.max_steps = max_steps
        self.history = history
        self.dynamic = dynamic
        self.rule = rule
        self._rng = random.Random(seed)
        self._order: deque[Task] = deque()
        self._slots: deque[PlannedSlot] = deque()
        self._rounds: dict[str, int] = {}
        self.groups_opened = 0
        self.incarnation = incarnation

    def _next_task(self) -> Task:
        if not self._order:
            order = list(self.tasks)
            self._rng.shuffle(order)
            self._order.extend(order)
        return self._order.popleft()

    def open_group(self) -> list[PlannedSlot]:
        """Plan the next group: its task, size and step limit (one slot per rollout)."""
        task = self._next_task()
        n, steps = self.n_rollouts, self.max_steps
        if self.dynamic:
            h = self.history(task.task_id)
            n = rollout_budget(h.recent_success, n_max=self.n_rollouts, rule=self.rule)
            lengths = [h.longest_success] if h.longest_success else []
            steps = step_limit(lengths, global_max=self.max_steps)
        rnd = self._rounds.get(task.task_id, 0)
        self._rounds[task.task_id] = rnd + 1
        gid = f"{task.task_id}#{self.incarnation}{rnd}"
        self.groups_opened += 1
        return [PlannedSlot(task, gid, n, steps) for _ in range(n)]

    def next_slot(self) -> PlannedSlot:
        if not self._slots:
            self._slots.extend(self.open_group())
        return self._slots.popleft()

    def pending_slots(self) -> int:
        """Slots of groups already opened that have not started yet."""
        return len(self._slots)
