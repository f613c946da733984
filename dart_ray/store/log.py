"""The durable trajectory log: append, claim exactly once, acknowledge, and leases.

A row's life (`rollout_run.state`):

    AVAILABLE --claim--> CLAIMED --ack--> CONSUMED
        ^                   |  \\--drop--> DROPPED   (stale, untrainable group, ... with a reason)
        +---release/expire--+

A claim selects and marks rows in one transaction (`FOR UPDATE SKIP LOCKED` on MySQL/MariaDB,
so concurrent claimers never wait on each other and never get the same row; one writer
transaction on SQLite). Every transition also writes a row to the append-only
`dataset_usage_events`, from which exactly-once consumption can be audited. A claim holds its
rows for a lease; a claimer that dies before acknowledging leaves them to expire back into the
pool, and its late ack (if it ever comes) is refused, so no row is trained twice. Leases are
set and checked on the database's clock (`db_now`), never a client's: claimers on machines
whose clocks disagree by a minute still agree on when a lease ends. A settle (ack, drop) of
a row whose lease has passed is refused even before any sweep has returned the row.

Every write is idempotent under retry: appends are keyed by (trajectory_id, run_id), claims by
their claim id, acks by (row, claim id). That is what lets a server restart mid-stream be
retried through without losing or doubling anything.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from dart_ray.records import Status, Trajectory
from dart_ray.store.db import (
    RetryPolicy,
    RowState,
    dataset_usage_events,
    rollout_run,
    task_stats,
)


class LeaseLostError(RuntimeError):
    """Rows of a claim are no longer held by it (the lease expired and they went back)."""


class ClaimRaceError(RuntimeError):
    """A claim selected rows that another transaction had already taken: nothing was
    claimed (the transaction rolled back); claiming again is safe."""


def utcnow() -> datetime:
    """Naive UTC, the form every timestamp column holds (this process's clock)."""
    return datetime.now(UTC).replace(tzinfo=None)


def db_now(c: Connection) -> datetime:
    """The database server's current time, naive UTC, read inside transaction `c`."""
    if c.dialect.name in ("mysql", "mariadb"):
        value = c.execute(sa.text("SELECT UTC_TIMESTAMP(6)")).scalar_one()
    else:
        value = c.execute(sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


@dataclass(frozen=True, slots=True)
class LogRow:
    """One trajectory as the log knows it (the steps live in the blob at `uri`)."""

    id: int
    run_id: str
    trajectory_id: str
    task_id: str
    trace_id: str
    group_id: str
    group_size: int
    uri: str
    reward: float
    num_steps: int
    status: Status
    version_num: int
    model_version: str
    instruction: str


@dataclass(frozen=True, slots=True)
class Claim:
    claim_id: str
    consumer: str
    run_id: str
    rows: tuple[LogRow, ...]
    lease_expires_at: datetime

    @property
    def row_ids(self) -> list[int]:
        return [r.id for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


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


_ROW_COLS = (
    rollout_run.c.id,
    rollout_run.c.run_id,
    rollout_run.c.trajectory_id,
    rollout_run.c.task_id,
    rollout_run.c.trace_id,
    rollout_run.c.group_id,
    rollout_run.c.group_size,
    rollout_run.c.uri,
    rollout_run.c.reward,
    rollout_run.c.num_steps,
    rollout_run.c.status,
    rollout_run.c.version_num,
    rollout_run.c.model_version,
    rollout_run.c.instruction,
)


def _log_row(r: sa.Row[Any]) -> LogRow:
    return LogRow(
        id=r.id,
        run_id=r.run_id,
        trajectory_id=r.trajectory_id,
        task_id=r.task_id,
        trace_id=r.trace_id,
        group_id=r.group_id,
        group_size=r.group_size,
        uri=r.uri,
        reward=r.reward,
        num_steps=r.num_steps,
        status=Status(r.status),
        version_num=r.version_num,
        model_version=r.model_version,
        instruction=r.instruction,
    )


def model_version_name(version: int) -> str:
    return f"v{version}" if version >= 0 else ""


class DurableLog:
    """The log's API over one SQLAlchemy engine (thread-safe; one per process)."""

    def __init__(
        self,
        engine: Engine,
        *,
        retry: RetryPolicy | None = None,
        success_threshold: float = 1.0,
    ) -> None:
        self.engine = engine
        self.retry = retry or RetryPolicy()
        self.success_threshold = success_threshold
        self._mysql = engine.dialect.name in ("mysql", "mariadb")

    # ------------------------------------------------------------------ append

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
            c.execute(rollout_run.insert(), [self._row_values(t, uri, now) for t, uri in new])
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

    def _row_values(self, t: Trajectory, uri: str, now: datetime) -> dict[str, Any]:
        return {
            "run_id": t.run_id,
            "trajectory_id": t.trajectory_id,
            "task_id": t.task.task_id,
            "trace_id": t.trace_id,
            "group_id": t.group_id,
            "group_size": t.group_size,
            "uri": uri,
            "reward": float(t.reward),
            "num_steps": t.num_steps,
            "status": t.status.value,
            "state": RowState.AVAILABLE,
            "used": 0,
            "model_version": model_version_name(t.min_version),
            "version_num": t.min_version,
            "instruction": t.task.instruction,
            "created_at": now,
        }

    def is_success(self, t: Trajectory) -> bool:
        return t.status.trainable and t.reward >= self.success_threshold

    def _update_task_stats(
        self, c: Connection, new: Sequence[tuple[Trajectory, str]], now: datetime
    ) -> None:
        agg: dict[tuple[str, str], dict[str, Any]] = {}
        for t, uri in new:
            a = agg.setdefault(
                (t.run_id, t.task.task_id),
                {
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
                },
            )
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

    def _upsert_task_stats(self, values: dict[str, Any]) -> sa.Executable:
        ts = task_stats.c
        if self._mysql:
            stmt = mysql.insert(task_stats).values(values)
            new = stmt.inserted
        else:
            stmt = sqlite.insert(task_stats).values(values)
            new = stmt.excluded
        has_success = new.successes > 0
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

    # ------------------------------------------------------------------ claim

    def claim_query(self, run_id: str, n: int, min_version: int | None = None) -> sa.Select[Any]:
        """The SELECT a claim runs: it follows `ix_rollout_run_claim` in index order.

        ORDER BY (version_num, id) is the index's own order after the equality prefix
        (run_id, state), so InnoDB reads exactly the rows it returns and locks only those;
        ordering by id alone would make it sort, scanning and locking every candidate.
        """
        rr = rollout_run.c
        q = sa.select(*_ROW_COLS).where(rr.run_id == run_id, rr.state == RowState.AVAILABLE)
        if min_version is not None:
            q = q.where(rr.version_num >= min_version)
        q = q.order_by(rr.version_num, rr.id).limit(n)
        if self._mysql:
            # Without the hint MariaDB 10.11 picks `ref` on (run_id, state) from ~30k rows on
            # and applies the version bound by index condition pushdown: still index order and
            # no filesort, but it steps over every older available row (850k entries read for
            # 64 rows at 1M). The hint restores the `range` scan that starts at min_version.
            q = q.with_hint(rollout_run, "FORCE INDEX (ix_rollout_run_claim)", "mysql")
            q = q.with_hint(rollout_run, "FORCE INDEX (ix_rollout_run_claim)", "mariadb")
            q = q.with_for_update(skip_locked=True)
        return q

    def claim(
        self,
        run_id: str,
        n: int,
        *,
        consumer: str,
        lease_s: float,
        min_version: int | None = None,
        claim_id: str | None = None,
    ) -> Claim:
        """Take up to n available rows (oldest version first) for `lease_s` seconds.

        Rows older than `min_version` are left in the pool (see `drop_stale`). Passing the
        same `claim_id` again returns the rows that claim already holds, so a claim whose
        commit outcome was unknown can be retried safely.
        """
        if n < 1:
            raise ValueError(f"claim size must be >= 1, got {n}")
        cid = claim_id or uuid.uuid4().hex
        self.expire_leases(run_id)
        return self.retry.run(
            lambda: self._claim_txn(run_id, n, consumer, lease_s, min_version, cid), "claim"
        )

    def _claim_txn(
        self,
        run_id: str,
        n: int,
        consumer: str,
        lease_s: float,
        min_version: int | None,
        cid: str,
    ) -> Claim:
        rr = rollout_run.c
        with self.engine.begin() as c:
            now = db_now(c)
            expires = now + timedelta(seconds=lease_s)
            held = c.execute(
                sa.select(*_ROW_COLS, rr.lease_expires_at)
                .where(rr.claim_id == cid, rr.state == RowState.CLAIMED)
                .order_by(rr.version_num, rr.id)
            ).all()
            if held:
                return Claim(cid, consumer, run_id, tuple(map(_log_row, held)), held[0][-1])
            rows = [_log_row(r) for r in c.execute(self.claim_query(run_id, n, min_version))]
            if not rows:
                return Claim(cid, consumer, run_id, (), expires)
            ids = [r.id for r in rows]
            taken = c.execute(
                rollout_run.update()
                .where(rr.id.in_(ids), rr.state == RowState.AVAILABLE)
                .values(
                    state=RowState.CLAIMED,
                    claim_id=cid,
                    claimed_by=consumer,
                    claimed_at=now,
                    lease_expires_at=expires,
                )
            ).rowcount
            if taken != len(ids):  # exactly once must not rest on the SELECT's locking alone
                raise ClaimRaceError(
                    f"claim {cid}: {len(ids) - taken} of {len(ids)} selected rows were taken by "
                    "another transaction; nothing was claimed"
                )
            self._events(c, rows, "CLAIM", now, claim_id=cid, consumer=consumer)
        return Claim(cid, consumer, run_id, tuple(rows), expires)

    def _events(
        self,
        c: Connection,
        rows: Iterable[LogRow],
        event_type: str,
        now: datetime,
        *,
        claim_id: str | None = None,
        consumer: str | None = None,
        used_delta: int = 0,
        reason: str | None = None,
    ) -> None:
        values = [
            {
                "run_id": r.run_id,
                "trajectory_id": r.trajectory_id,
                "row_id": r.id,
                "model_version": r.model_version,
                "used_delta": used_delta,
                "event_type": event_type,
                "claim_id": claim_id,
                "consumer": consumer,
                "reason": reason,
                "created_at": now,
            }
            for r in rows
        ]
        if values:
            c.execute(dataset_usage_events.insert(), values)

    # ------------------------------------------------------------------ settle a claim

    def ack(
        self, claim: Claim, row_ids: Sequence[int] | None = None, *, in_version: int | None = None
    ) -> int:
        """Mark rows of a claim trained (all of them by default). Raises LeaseLostError if
        any row is no longer held by this claim; then nothing is acknowledged. `in_version`:
        the durable checkpoint that holds the training, recorded on the ACK events (`v<N>`
        in their `reason`) for the audit and for lineage queries."""
        reason = None if in_version is None else f"v{in_version}"
        return self._settle(claim, row_ids, RowState.CONSUMED, "ACK", used_delta=1, reason=reason)

    def drop(self, claim: Claim, row_ids: Sequence[int], reason: str) -> int:
        """Mark rows of a claim never to be trained, with a short reason (e.g. `stale`)."""
        return self._settle(claim, row_ids, RowState.DROPPED, "DROP", reason=reason)

    def release(self, claim: Claim, row_ids: Sequence[int] | None = None) -> int:
        """Give rows of a claim back to the pool untouched (a consumer shutting down)."""
        return self._settle(claim, row_ids, RowState.AVAILABLE, "RELEASE")

    def _settle(
        self,
        claim: Claim,
        row_ids: Sequence[int] | None,
        to_state: int,
        event_type: str,
        *,
        used_delta: int = 0,
        reason: str | None = None,
    ) -> int:
        ids = list(claim.row_ids if row_ids is None else row_ids)
        if not ids:
            return 0
        unknown = set(ids) - set(claim.row_ids)
        if unknown:
            raise ValueError(f"claim {claim.claim_id}: rows {sorted(unknown)} are not in it")
        return self.retry.run(
            lambda: self._settle_txn(claim, ids, to_state, event_type, used_delta, reason),
            event_type.lower(),
        )

    def _settle_txn(
        self,
        claim: Claim,
        ids: list[int],
        to_state: int,
        event_type: str,
        used_delta: int,
        reason: str | None,
    ) -> int:
        rr = rollout_run.c
        with self.engine.begin() as c:
            now = db_now(c)
            q = sa.select(rr.id, rr.state, rr.claim_id, rr.lease_expires_at).where(rr.id.in_(ids))
            if self._mysql:
                q = q.with_for_update()
            current = {r.id: r for r in c.execute(q)}
            todo: list[int] = []
            lost: list[int] = []
            for i in ids:
                r = current.get(i)
                held = (
                    r is not None and r.claim_id == claim.claim_id and r.state == RowState.CLAIMED
                )
                # a lease that has run out no longer holds its rows, swept back or not (giving
                # them back to the pool is still fine: that is where they are going anyway)
                if held and (to_state == RowState.AVAILABLE or r.lease_expires_at >= now):
                    todo.append(i)
                elif (
                    r is not None
                    and r.claim_id == claim.claim_id
                    and r.state == to_state
                    and to_state != RowState.AVAILABLE
                ):
                    continue  # settled by an earlier attempt of this same call (retry)
                else:
                    lost.append(i)
            if lost:
                raise LeaseLostError(
                    f"claim {claim.claim_id} by {claim.consumer}: {len(lost)} of {len(ids)} rows "
                    f"are no longer held (lease expired?): {lost[:10]}; nothing was {event_type}ed"
                )
            if not todo:
                return 0
            values: dict[str, Any] = {"state": to_state, "lease_expires_at": None}
            if used_delta:
                values["used"] = rr.used + used_delta
            if reason is not None and to_state == RowState.DROPPED:
                values["drop_reason"] = reason
            if to_state == RowState.AVAILABLE:
                values.update(claim_id=None, claimed_by=None, claimed_at=None)
            c.execute(rollout_run.update().where(rr.id.in_(todo)).values(**values))
            by_id = {r.id: r for r in claim.rows}
            self._events(
                c,
                (by_id[i] for i in todo),
                event_type,
                now,
                claim_id=claim.claim_id,
                consumer=claim.consumer,
                used_delta=used_delta,
                reason=reason,
            )
            return len(todo)

    def renew(self, claim: Claim, lease_s: float) -> Claim:
        """Extend the lease of every row the claim still holds; LeaseLostError if any is gone."""

        def txn() -> Claim:
            rr = rollout_run.c
            with self.engine.begin() as c:
                now = db_now(c)
                expires = now + timedelta(seconds=lease_s)
                n = c.execute(
                    rollout_run.update()
                    .where(
                        rr.id.in_(claim.row_ids),
                        rr.claim_id == claim.claim_id,
                        rr.state == RowState.CLAIMED,
                        rr.lease_expires_at >= now,
                    )
                    .values(lease_expires_at=expires)
                ).rowcount
                if n != len(claim.rows):
                    raise LeaseLostError(
                        f"claim {claim.claim_id}: {len(claim.rows) - n} rows are no longer held"
                    )
            return Claim(claim.claim_id, claim.consumer, claim.run_id, claim.rows, expires)

        if not claim.rows:
            return claim
        return self.retry.run(txn, "renew")

    def expire_leases(self, run_id: str | None = None, now: datetime | None = None) -> int:
        """Return rows whose lease has passed to the pool; returns how many."""

        def txn() -> int:
            rr = rollout_run.c
            with self.engine.begin() as c:
                t = now or db_now(c)
                q = sa.select(*_ROW_COLS, rr.claim_id, rr.claimed_by).where(
                    rr.state == RowState.CLAIMED, rr.lease_expires_at < t
                )
                if run_id is not None:
                    q = q.where(rr.run_id == run_id)
                if self._mysql:
                    q = q.with_for_update(skip_locked=True)
                expired = c.execute(q).all()
                if not expired:
                    return 0
                c.execute(
                    rollout_run.update()
                    .where(rr.id.in_([r.id for r in expired]), rr.state == RowState.CLAIMED)
                    .values(
                        state=RowState.AVAILABLE,
                        claim_id=None,
                        claimed_by=None,
                        claimed_at=None,
                        lease_expires_at=None,
                    )
                )
                for r in expired:
                    self._events(
                        c, [_log_row(r)], "EXPIRE", t, claim_id=r.claim_id, consumer=r.claimed_by
                    )
                return len(expired)

        return self.retry.run(txn, "expire")

    def consume_lineage(self, run_id: str, row_ids: Sequence[int], in_version: int) -> int:
        """Settle rows that durable checkpoint `in_version` trained as CONSUMED, whoever holds
        them now (a resume's repair: the trainer died after completing the checkpoint and
        before acknowledging its rows, which then went back to the pool or sit under a lapsed
        claim). Rows already CONSUMED are left alone; returns how many were settled."""

        def txn() -> int:
            rr = rollout_run.c
            with self.engine.begin() as c:
                now = db_now(c)
                q = sa.select(*_ROW_COLS, rr.claim_id).where(
                    rr.run_id == run_id,
                    rr.id.in_(list(row_ids)),
                    rr.state.in_([RowState.AVAILABLE, RowState.CLAIMED]),
                )
                if self._mysql:
                    q = q.with_for_update()
                rows = c.execute(q).all()
                if not rows:
                    return 0
                c.execute(
                    rollout_run.update()
                    .where(
                        rr.id.in_([r.id for r in rows]),
                        rr.state.in_([RowState.AVAILABLE, RowState.CLAIMED]),
                    )
                    .values(state=RowState.CONSUMED, used=rr.used + 1, lease_expires_at=None)
                )
                for r in rows:
                    self._events(
                        c,
                        [_log_row(r)],
                        "ACK",
                        now,
                        claim_id=r.claim_id,
                        consumer="lineage",
                        used_delta=1,
                        reason=f"v{in_version}",
                    )
                return len(rows)

        if not row_ids:
            return 0
        return self.retry.run(txn, "consume_lineage")

    def drop_stale(self, run_id: str, min_version: int, reason: str = "stale") -> int:
        """Drop every available row acted on by a version older than `min_version`."""

        def txn() -> int:
            rr = rollout_run.c
            with self.engine.begin() as c:
                now = db_now(c)
                q = sa.select(*_ROW_COLS).where(
                    rr.run_id == run_id,
                    rr.state == RowState.AVAILABLE,
                    rr.version_num < min_version,
                )
                if self._mysql:
                    q = q.with_for_update(skip_locked=True)
                rows = [_log_row(r) for r in c.execute(q)]
                if not rows:
                    return 0
                c.execute(
                    rollout_run.update()
                    .where(rr.id.in_([r.id for r in rows]), rr.state == RowState.AVAILABLE)
                    .values(state=RowState.DROPPED, drop_reason=reason)
                )
                self._events(c, rows, "DROP", now, reason=reason)
                return len(rows)

        return self.retry.run(txn, "drop_stale")

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
        return [
            TaskStats(
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
            for r in rows
        ]

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

    def drops(self, run_id: str) -> dict[str, int]:
        """DROPPED rows of one run by reason (stale, no_signal, group_incomplete, ...)."""
        rr = rollout_run.c
        q = (
            sa.select(rr.drop_reason, sa.func.count())
            .where(rr.run_id == run_id, rr.state == RowState.DROPPED)
            .group_by(rr.drop_reason)
        )
        return {str(reason or ""): n for reason, n in self._fetch(q, "drops")}

    def get_rows(self, run_id: str, trajectory_ids: Sequence[str]) -> list[LogRow]:
        rr = rollout_run.c
        q = sa.select(*_ROW_COLS).where(
            rr.run_id == run_id, rr.trajectory_id.in_(list(trajectory_ids))
        )
        return [_log_row(r) for r in self._fetch(q, "get_rows")]
