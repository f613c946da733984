"""What the scheduler reads about a task from the durable log: its recent success (for the
rollout budget), its longest success (for the step limit) and, with back-off, its streak of
groups without signal, counted over the task alone or over its whole family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dart_ray.algo.curriculum import Backoff, group_kinds, no_signal_streak
from dart_ray.config import Config
from dart_ray.records import Task
from dart_ray.reporting.families import family_of
from dart_ray.rollout.scheduler import TaskHistory

if TYPE_CHECKING:
    from dart_ray.store.log import DurableLog, TaskStats


class LogHistory:
    """`TaskHistory` of a run's tasks, read from its durable log at each call."""

    def __init__(
        self,
        log: DurableLog,
        run_id: str,
        config: Config,
        tasks: Sequence[Task],
        backoff: Backoff | None,
    ) -> None:
        self.log = log
        self.run_id = run_id
        self.c = config
        self.backoff = backoff
        self.by_family = config.rollout.backoff_scope == "family"
        self.family = {t.task_id: family_of(t) for t in tasks}
        self.members: dict[str, list[str]] = {}
        for tid, fam in self.family.items():
            self.members.setdefault(fam, []).append(tid)

    def key(self, task: Task) -> str:
        """What back-off counts skips by: the task's family, or the task itself."""
        return self.family[task.task_id] if self.by_family else task.task_id

    def __call__(self, task_id: str, *, version: int, filling: int = 2) -> TaskHistory:
        """The task's history as of weight `version`; `filling`: how many of the unit's
        groups may still be filling (back-off reads that many more groups' rows)."""
        recent = self.log.recent_outcomes(self.run_id, task_id, 2 * self.c.rollout.n_rollouts)
        thr = self.c.rollout.success_threshold
        stats = self.log.task_stat(self.run_id, task_id)
        return TaskHistory(
            recent_success=sum(r >= thr for r in recent) / len(recent) if recent else None,
            longest_success=stats.success_steps_max if stats else 0,
            no_signal_streak=self.streak(task_id, stats, version=version, filling=filling),
        )

    def streak(self, task_id: str, stats: TaskStats | None, *, version: int, filling: int) -> int:
        """The task's groups without signal in a row, from the log (0 without back-off); with
        `rollout.backoff_scope = "family"`, its family's groups, of any of its tasks. An
        all-fail group counts only when the curator would have no success to replay into
        it: replay is off, the task never succeeded, or its newest success is beyond
        `curation.max_staleness` versions (the curator's own bound, on plain versions).
        By family, that is this task's success: a visit that would train is never skipped."""
        if self.backoff is None:
            return 0
        # the groups that matter, at most n_rollouts rows each, plus the groups still filling
        # (a cut-off oldest group reads as open, which counts for nothing)
        limit = (self.backoff.window + filling) * self.c.rollout.n_rollouts
        which = self.members[self.family[task_id]] if self.by_family else task_id
        rows = self.log.recent_group_rows(self.run_id, which, limit)
        cur = self.c.curation
        replay = (
            cur.success_replay
            and stats is not None
            and stats.last_success_version is not None
            and version - stats.last_success_version <= cur.max_staleness
        )
        kinds = group_kinds(rows, threshold=self.c.rollout.success_threshold)
        return no_signal_streak(kinds, replay=replay, count_solved=self.c.rollout.backoff_solved)
