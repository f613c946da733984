"""The episode ledger: a row per episode attempt, written before it starts.

The durable log (`rollout_run`) holds finished trajectories only. An episode that was running
when its rollouter, the driver or the machine died would leave no trace there, so the
rollouter first records the start here (`episode_start`, keyed by the trajectory id the
episode will be logged under). Whoever picks up afterwards (a restarted rollouter, a resumed
run, the end of a run) logs every started-but-unfinished attempt as ABORTED with the reason,
and `dart-ray audit` checks that every start has its trajectory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from dart_ray.records import Status, Task, Trajectory
from dart_ray.store.clock import utcnow
from dart_ray.store.db import RetryPolicy, episode_start, rollout_run

if TYPE_CHECKING:
    from dart_ray.store import Store


@dataclass(frozen=True, slots=True)
class EpisodeStart:
    run_id: str
    trajectory_id: str
    task_id: str
    group_id: str
    group_size: int
    trace_id: str
    rollouter: str
    version_num: int


class EpisodeLedger:
    def __init__(self, engine: Engine, retry: RetryPolicy | None = None) -> None:
        self.engine = engine
        self.retry = retry or RetryPolicy()

    def start(self, e: EpisodeStart) -> None:
        """Record an attempt before it starts (idempotent: a retried insert is a no-op)."""

        def txn() -> None:
            try:
                with self.engine.begin() as c:
                    c.execute(
                        episode_start.insert().values(
                            run_id=e.run_id,
                            trajectory_id=e.trajectory_id,
                            task_id=e.task_id,
                            group_id=e.group_id,
                            group_size=e.group_size,
                            trace_id=e.trace_id,
                            rollouter=e.rollouter,
                            version_num=e.version_num,
                            # to the microsecond, on the clock its row's created_at uses (the
                            # server default has whole seconds on SQLite: the utilisation
                            # timeline read every episode half a second longer)
                            started_at=utcnow(),
                        )
                    )
            except IntegrityError:
                pass  # an earlier attempt of this call committed

        self.retry.run(txn, "episode start")

    def unfinished(self, run_id: str, rollouter: str | None = None) -> list[EpisodeStart]:
        """Attempts of the run (of one rollouter) that have no trajectory in the log."""
        es, rr = episode_start.c, rollout_run.c
        q = (
            sa.select(
                es.run_id,
                es.trajectory_id,
                es.task_id,
                es.group_id,
                es.group_size,
                es.trace_id,
                es.rollouter,
                es.version_num,
            )
            .select_from(
                episode_start.outerjoin(
                    rollout_run,
                    sa.and_(rr.run_id == es.run_id, rr.trajectory_id == es.trajectory_id),
                )
            )
            .where(es.run_id == run_id, rr.id.is_(None))
            .order_by(es.started_at)
        )
        if rollouter is not None:
            q = q.where(es.rollouter == rollouter)

        def read() -> list[EpisodeStart]:
            with self.engine.connect() as c:
                return [EpisodeStart(*row) for row in c.execute(q)]

        return self.retry.run(read, "unfinished episodes")

    def count(self, run_id: str) -> int:
        with self.engine.connect() as c:
            n = c.scalar(
                sa.select(sa.func.count())
                .select_from(episode_start)
                .where(episode_start.c.run_id == run_id)
            )
        return int(n or 0)


def log_unfinished(
    store: Store,
    run_id: str,
    reason: str,
    *,
    rollouter: str | None = None,
    tasks: Mapping[str, Task] | None = None,
    env_kind: str = "",
) -> list[str]:
    """Log every started-but-unfinished episode of the run (of one rollouter) as ABORTED
    with `reason`, blob included; returns their trajectory ids. Only call it when nothing
    can still be running them (the rollouter restarted, or every rollouter has stopped)."""
    lost = store.episodes.unfinished(run_id, rollouter)
    for e in lost:
        task = (tasks or {}).get(e.task_id) or Task(e.task_id, "", env_kind)
        now = time.time()
        t = Trajectory(
            trajectory_id=e.trajectory_id,
            run_id=run_id,
            task=task,
            steps=(),
            reward=0.0,
            status=Status.ABORTED,
            trace_id=e.trace_id,
            group_id=e.group_id,
            group_size=e.group_size,
            start_version=e.version_num,
            started_at=now,
            finished_at=now,
            error=reason,
        )
        store.log.append(t, store.blobs.write(t))
    return [e.trajectory_id for e in lost]
