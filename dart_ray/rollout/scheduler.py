"""Which task runs next, in which GRPO group, with how many rollouts and steps.

Tasks are visited in a seeded shuffled order, epoch after epoch. Each visit opens a group of
`n = rollout_budget(recent success rate)` slots (DART-GUI's dynamic rollout number) whose
episodes may take up to `step_limit(longest success)` steps (dynamic trajectory length).
Slots are handed out one at a time, so a new episode starts the moment any other finishes
(rollout-wise sampling), and a group's episodes run in parallel on whatever sessions are free.

With back-off (`dart_ray.algo.curriculum.Backoff`), a visit to a task whose recent groups
carried no signal may be skipped: the scheduler moves on to the next task in the order. It
never skips every task: when all of them are backed off it opens a group of the one whose
back-off ends soonest (among the next `Backoff.lookahead` tasks in the order, which bounds
the history reads per group), so a run always has something to roll out. The skips counted since a
task's last group live in memory; the streak itself is read from the durable log, so a
restarted rollouter keeps backing off (it only retries each backed-off task once early).

Back-off is counted per `backoff_key(task)`: the task id (default), or its family, so that
skipping is decided for a family at once (the history's streak is then the family's).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dart_ray.algo.curriculum import Backoff, BudgetRule, rollout_budget, step_limit
from dart_ray.records import Task


@dataclass(frozen=True)
class TaskHistory:
    """What the curriculum reads about a task (from the durable log)."""

    recent_success: float | None
    """Success rate over the recent trainable episodes; None if there are none yet."""
    longest_success: int = 0
    no_signal_streak: int = 0
    """The task's newest decided groups without signal, in a row (`no_signal_streak`)."""


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
        backoff: Backoff | None = None,
        backoff_key: Callable[[Task], str] | None = None,
    ) -> None:
        """`incarnation` goes into every group id: a restarted rollouter or a resumed run
        passes a fresh one, so its groups never merge with groups of an earlier life that
        are already in the log. `backoff`: skip tasks without signal (None: never skip).
        `backoff_key`: what skips are counted by (default the task id; a family, say, whose
        streak `history` then returns for each of its tasks)."""
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
        self.backoff = backoff
        self._key: Callable[[Task], str] = backoff_key or (lambda t: t.task_id)
        self._distinct = len({self._key(t) for t in self.tasks})
        self._skipped: dict[str, int] = {}
        """Visits skipped since the key's last group, by back-off key (task or family)."""
        self.visits_skipped = 0
        """Visits skipped by back-off, in all."""

    def _pop(self) -> Task:
        if not self._order:
            order = list(self.tasks)
            self._rng.shuffle(order)
            self._order.extend(order)
        return self._order.popleft()

    def _next_task(self) -> tuple[Task, TaskHistory | None]:
        """The next task to open a group of, with its history when it was read."""
        if self.backoff is None:
            return self._pop(), None
        # the visits skipped in this search: key -> (skips still owed, task, history);
        # a search ends once `lookahead` different keys were skipped, so a run whose every
        # task is backed off still opens a group for a bounded number of log reads
        seen: dict[str, tuple[int, Task, TaskHistory]] = {}
        while len(seen) < min(self._distinct, self.backoff.lookahead):
            # a task may come round again (a new epoch's order) before every other was seen:
            # that is another visit, skipped or not by what it still owes
            task = self._pop()
            key = self._key(task)
            h = self.history(task.task_id)
            owed = self.backoff.skips(h.no_signal_streak) - self._skipped.get(key, 0)
            if owed <= 0:
                return task, h
            self._skipped[key] = self._skipped.get(key, 0) + 1
            self.visits_skipped += 1
            seen[key] = (owed - 1, task, h)
        # never starve: the task whose back-off ends soonest (the first seen among equals)
        _, task, h = min(seen.values(), key=lambda v: v[0])
        self._skipped[self._key(task)] -= 1  # this visit was not skipped after all
        self.visits_skipped -= 1
        return task, h

    def open_group(self) -> list[PlannedSlot]:
        """Plan the next group: its task, size and step limit (one slot per rollout)."""
        task, h = self._next_task()
        self._skipped.pop(self._key(task), None)
        n, steps = self.n_rollouts, self.max_steps
        if self.dynamic:
            if h is None:
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
