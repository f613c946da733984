"""What the log counts: per-task statistics (`task_stats`, kept up to date in the same
transaction as each append) and the read-only queries over a run's rows (outcomes, the
buffer by version and state, success by version, drops, rows by trajectory id). `DurableLog`
inherits them from
`LogStats`; none of them claims, settles or leases anything."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Connection, Engine

from dart_ray.algo.curriculum import Outcome
from dart_ray.records import Status, Trajectory
from dart_ray.store.clock import utcnow
from dart_ray.store.db import RetryPolicy, RowState, episode_start, rollout_run, task_stats
from dart_ray.store.log_rows import ROW_COLS, LogRow, log_row


@dataclass(frozen=True, slots=True)
class TaskStats:
    task_id: str
    attempts: int
    successes: int
    failures_env: int
    success_steps_total: int
    success_steps_max: int
    last_success_uri: str | None
    last_success_trajectory_id: str | None
    last_success_version: int | None

    @property
    def success_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0


def _no_stats(t: Trajectory, now: datetime) -> dict[str, Any]:
    """A `task_stats` row of `t`'s task that counts nothing yet."""
    return {
        "run_id": t.run_id,
        "task_id": t.task.task_id,
        "attempts": 0,
        "successes": 0,
        "failures_env": 0,
        "success_steps_total": 0,
        "success_steps_max": 0,
        "last_success_uri": None,
        "last_success_trajectory_id": None,
        "last_success_version": None,
        "updated_at": now,
    }


class LogStats:
    """The statistics half of `DurableLog` (which sets these attributes in its constructor)."""

    engine: Engine
    retry: RetryPolicy
    success_threshold: float
    _mysql: bool

    def is_success(self, t: Trajectory) -> bool:
        return t.status.trainable and t.reward >= self.success_threshold

    # ------------------------------------------------------------------ write side (append)

    def _update_task_stats(
        self, c: Connection, new: Sequence[tuple[Trajectory, str]], now: datetime
    ) -> None:
        agg: dict[tuple[str, str], dict[str, Any]] = {}
        for t, uri in new:
            a = agg.setdefault((t.run_id, t.task.task_id), _no_stats(t, now))
            if not t.status.trainable:
                a["failures_env"] += 1
                continue
            a["attempts"] += 1
            if self.is_success(t):
                a["successes"] += 1
                a["success_steps_total"] += t.num_steps
                a["success_steps_max"] = max(a["success_steps_max"], t.num_steps)
                a["last_success_uri"] = uri
                a["last_success_trajectory_id"] = t.trajectory_id
                a["last_success_version"] = t.min_version
        # in key order: concurrent appenders then lock task_stats rows in the same order
        # instead of deadlocking on each other
        for key in sorted(agg):
            c.execute(self._upsert_task_stats(agg[key]))

    def record_seed(self, t: Trajectory, uri: str) -> None:
        """Make `t`, a written solution's successful episode (`curation.replay_seeds`), its
        task's newest success, what success replay reads, without logging it as a rollout:
        the task's attempts and successes stay the policy's own. A success of the policy's
        replaces it as any newer success does."""
        if not self.is_success(t):
            raise ValueError(f"{t.trajectory_id}: only a success seeds replay (reward {t.reward})")
        values = _no_stats(t, utcnow()) | {
            "last_success_uri": uri,
            "last_success_trajectory_id": t.trajectory_id,
            "last_success_version": t.min_version,
        }

        def txn() -> None:
            with self.engine.begin() as c:
                c.execute(self._upsert_task_stats(values, seed=True))

        self.retry.run(txn, "record_seed")

    def _upsert_task_stats(self, values: dict[str, Any], *, seed: bool = False) -> sa.Executable:
        ts = task_stats.c
        if self._mysql:
            stmt = mysql.insert(task_stats).values(values)
            new = stmt.inserted
        else:
            stmt = sqlite.insert(task_stats).values(values)
            new = stmt.excluded
        has_success = sa.true() if seed else new.successes > 0
        update = {
            "attempts": ts.attempts + new.attempts,
            "successes": ts.successes + new.successes,
            "failures_env": ts.failures_env + new.failures_env,
            "success_steps_total": ts.success_steps_total + new.success_steps_total,
            "success_steps_max": sa.case(
                (new.success_steps_max > ts.success_steps_max, new.success_steps_max),
                else_=ts.success_steps_max,
            ),
            "last_success_uri": sa.case(
                (has_success, new.last_success_uri), else_=ts.last_success_uri
            ),
            "last_success_trajectory_id": sa.case(
                (has_success, new.last_success_trajectory_id),
                else_=ts.last_success_trajectory_id,
            ),
            "last_success_version": sa.case(
                (has_success, new.last_success_version), else_=ts.last_success_version
            ),
            "updated_at": new.updated_at,
        }
        if self._mysql:
            return stmt.on_duplicate_key_update(**update)  # type: ignore[union-attr]
        return stmt.on_conflict_do_update(  # type: ignore[union-attr]
            index_elements=[ts.run_id, ts.task_id], set_=update
        )

    # ------------------------------------------------------------------ read side

    def _fetch(self, q: sa.Executable, what: str) -> list[sa.Row[Any]]:
        """Run a read, retrying transient errors (a database restart must not stop readers)."""

        def read() -> list[sa.Row[Any]]:
            with self.engine.connect() as c:
                return list(c.execute(q).all())

        return self.retry.run(read, what)

    def task_stats(self, run_id: str) -> list[TaskStats]:
        ts = task_stats.c
        rows = self._fetch(
            sa.select(task_stats).where(ts.run_id == run_id).order_by(ts.task_id), "task_stats"
        )
        return [_task_stats(r) for r in rows]

    def task_stat(self, run_id: str, task_id: str) -> TaskStats | None:
        """One task's statistics (None before its first attempt): one row by its key, what a
        rollouter reads at every visit of a task (`task_stats` reads the run's every task)."""
        ts = task_stats.c
        q = sa.select(task_stats).where(ts.run_id == run_id, ts.task_id == task_id)
        rows = self._fetch(q, "task_stat")
        return _task_stats(rows[0]) if rows else None

    def recent_outcomes(self, run_id: str, task_id: str, window: int) -> list[float]:
        """Rewards of the newest `window` trainable trajectories of a task (newest first)."""
        rr = rollout_run.c
        q = (
            sa.select(rr.reward)
            .where(
                rr.run_id == run_id,
                rr.task_id == task_id,
                rr.status.in_([Status.OK.value, Status.TRUNCATED.value]),
            )
            .order_by(rr.id.desc())
            .limit(window)
        )
        return [r[0] for r in self._fetch(q, "recent_outcomes")]

    def recent_group_rows(
        self, run_id: str, task_id: str | Collection[str], limit: int
    ) -> list[Outcome]:
        """The newest `limit` rows of a task (or of any of several: a task family), every
        status (newest first), with their group: what back-off reads a streak of groups
        without signal from (`dart_ray.algo.curriculum.group_kinds`). Served by
        `ix_rollout_run_task`."""
        rr = rollout_run.c
        ids = [task_id] if isinstance(task_id, str) else sorted(task_id)
        if not ids:
            raise ValueError("recent_group_rows needs at least one task id")
        which = rr.task_id == ids[0] if len(ids) == 1 else rr.task_id.in_(ids)
        q = (
            sa.select(rr.group_id, rr.group_size, rr.reward, rr.status)
            .where(rr.run_id == run_id, which)
            .order_by(rr.id.desc())
            .limit(limit)
        )
        return [
            Outcome(str(g), int(n), float(r), Status(s))
            for g, n, r, s in self._fetch(q, "recent_group_rows")
        ]

    def available(self, run_id: str) -> int:
        """Rows of one run waiting unclaimed in the log (one indexed count)."""
        rr = rollout_run.c
        q = sa.select(sa.func.count()).where(rr.run_id == run_id, rr.state == RowState.AVAILABLE)
        return int(self._fetch(q, "available")[0][0])

    def buffer(self, run_id: str) -> dict[tuple[int, int], int]:
        """Row counts by (version_num, state) for one run."""
        rr = rollout_run.c
        q = (
            sa.select(rr.version_num, rr.state, sa.func.count())
            .where(rr.run_id == run_id)
            .group_by(rr.version_num, rr.state)
        )
        return {(v, s): n for v, s, n in self._fetch(q, "buffer")}

    def success_by_version(self, run_id: str) -> dict[int, tuple[int, int]]:
        """(successes, episodes) of the run's trainable trajectories (OK, TRUNCATED) by the
        weight version that started them: the sampled success curve."""
        rr = rollout_run.c
        won = sa.case((rr.reward >= self.success_threshold, 1), else_=0)
        q = (
            sa.select(rr.version_num, sa.func.sum(won), sa.func.count())
            .where(
                rr.run_id == run_id,
                rr.status.in_([Status.OK.value, Status.TRUNCATED.value]),
            )
            .group_by(rr.version_num)
        )
        return {int(v): (int(k or 0), int(n)) for v, k, n in self._fetch(q, "success_by_version")}

    def episode_intervals(self, run_id: str) -> list[tuple[datetime, datetime]]:
        """(started, logged) of every finished episode attempt of the run, on the database's
        clock: when its session was busy (the environment utilisation over time)."""
        es, rr = episode_start.c, rollout_run.c
        q = (
            sa.select(es.started_at, rr.created_at)
            .select_from(
                episode_start.join(
                    rollout_run,
                    sa.and_(rr.run_id == es.run_id, rr.trajectory_id == es.trajectory_id),
                )
            )
            .where(es.run_id == run_id)
            .order_by(es.started_at)
        )
        return [(a, b) for a, b in self._fetch(q, "episode_intervals")]

    def task_usage(self, run_id: str) -> dict[str, tuple[int, int, int]]:
        """Per task of one run: (rows logged, rows trained, rows dropped as `no_signal`). Rows
        logged are every trajectory, retried ABORTED attempts and ENV_ERRORs included: what
        the environments spent. Rows trained are the CONSUMED ones (acknowledged after the
        optimizer step that used them)."""
        rr = rollout_run.c
        trained = sa.case((rr.state == RowState.CONSUMED, 1), else_=0)
        no_signal = sa.case(
            (sa.and_(rr.state == RowState.DROPPED, rr.drop_reason == "no_signal"), 1), else_=0
        )
        q = (
            sa.select(rr.task_id, sa.func.count(), sa.func.sum(trained), sa.func.sum(no_signal))
            .where(rr.run_id == run_id)
            .group_by(rr.task_id)
        )
        return {
            str(t): (int(n), int(k or 0), int(d or 0))
            for t, n, k, d in self._fetch(q, "task_usage")
        }

    def drops(self, run_id: str, state: int = RowState.DROPPED) -> dict[str, int]:
        """DROPPED rows of one run by reason (stale, no_signal, group_incomplete, ...); with
        `state = RowState.QUARANTINED` the bad-data rows by their reason."""
        rr = rollout_run.c
        q = (
            sa.select(rr.drop_reason, sa.func.count())
            .where(rr.run_id == run_id, rr.state == state)
            .group_by(rr.drop_reason)
        )
        return {str(reason or ""): n for reason, n in self._fetch(q, "drops")}

    def get_rows(self, run_id: str, trajectory_ids: Sequence[str]) -> list[LogRow]:
        rr = rollout_run.c
        q = sa.select(*ROW_COLS).where(
            rr.run_id == run_id, rr.trajectory_id.in_(list(trajectory_ids))
        )
        return [log_row(r) for r in self._fetch(q, "get_rows")]


def _task_stats(r: Any) -> TaskStats:
    return TaskStats(
        task_id=r.task_id,
        attempts=r.attempts,
        successes=r.successes,
        failures_env=r.failures_env,
        success_steps_total=r.success_steps_total,
        success_steps_max=r.success_steps_max,
        last_success_uri=r.last_success_uri,
        last_success_trajectory_id=r.last_success_trajectory_id,
        last_success_version=r.last_success_version,
    )
