"""Appending finished trajectories to the durable log: idempotent, one transaction a batch.

`DurableLog` inherits it (`dart_ray.store.log`). An append is keyed by (trajectory_id, run_id):
logging a trajectory twice (a retry after a server restart) logs it once; each new row gets
its INSERT event in `dataset_usage_events` and its task's statistics in the same transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from dart_ray.records import Trajectory
from dart_ray.store.clock import utcnow
from dart_ray.store.db import RetryPolicy, dataset_usage_events, rollout_run
from dart_ray.store.log_rows import model_version_name, row_values
from dart_ray.store.log_stats import LogStats


class LogAppends(LogStats):
    """The append half of `DurableLog` (the task statistics it updates are `LogStats`')."""

    engine: Engine
    retry: RetryPolicy

    def append(self, trajectory: Trajectory, uri: str) -> bool:
        """Log one finished trajectory whose blob is at `uri`. False if it was already there."""
        return self.append_many([(trajectory, uri)]) == 1

    def append_many(self, items: Sequence[tuple[Trajectory, str]]) -> int:
        """Log trajectories in one transaction; returns how many were new (idempotent)."""
        if not items:
            return 0

        def attempt() -> int:
            try:
                return self._append_txn(items)
            except IntegrityError:
                # A concurrent appender of one of these trajectories committed first; the
                # transaction rolled back, and a second pass sees its rows as already logged.
                return self._append_txn(items)

        return self.retry.run(attempt, "append")

    def _append_txn(self, items: Sequence[tuple[Trajectory, str]]) -> int:
        by_run: dict[str, list[tuple[Trajectory, str]]] = defaultdict(list)
        for t, uri in items:
            by_run[t.run_id].append((t, uri))
        with self.engine.begin() as c:
            new: list[tuple[Trajectory, str]] = []
            for run_id, group in by_run.items():
                ids = list({t.trajectory_id for t, _ in group})
                seen = set(
                    c.scalars(
                        sa.select(rollout_run.c.trajectory_id).where(
                            rollout_run.c.run_id == run_id, rollout_run.c.trajectory_id.in_(ids)
                        )
                    )
                )
                for t, uri in group:
                    if t.trajectory_id not in seen:
                        seen.add(t.trajectory_id)
                        new.append((t, uri))
            if not new:
                return 0
            now = utcnow()
            c.execute(rollout_run.insert(), [row_values(t, uri, now) for t, uri in new])
            inserted = c.execute(
                sa.select(
                    rollout_run.c.id,
                    rollout_run.c.run_id,
                    rollout_run.c.trajectory_id,
                    rollout_run.c.version_num,
                ).where(
                    sa.tuple_(rollout_run.c.run_id, rollout_run.c.trajectory_id).in_(
                        [(t.run_id, t.trajectory_id) for t, _ in new]
                    )
                )
            ).all()
            c.execute(
                dataset_usage_events.insert(),
                [
                    {
                        "run_id": r.run_id,
                        "trajectory_id": r.trajectory_id,
                        "row_id": r.id,
                        "model_version": model_version_name(r.version_num),
                        "used_delta": 0,
                        "event_type": "INSERT",
                        "created_at": now,
                    }
                    for r in inserted
                ],
            )
            self._update_task_stats(c, new, now)
            return len(new)
