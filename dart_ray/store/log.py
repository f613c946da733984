"""The durable trajectory log: append, claim exactly once, acknowledge, and leases.

A row's life (`rollout_run.state`):

    AVAILABLE --claim--> CLAIMED --ack--> CONSUMED
        ^                   |  \\--drop--> DROPPED   (stale, untrainable group, ... with a reason)
        |                   |  \\--quarantine--> QUARANTINED   (bad data, with the reason)
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

This module owns that protocol: claims, settles, leases. Appends are in `log_appends`; a
row's record, a claim's and their errors, and the columns are in `log_rows`, the per-task
statistics and counting queries in `log_stats`, the two clocks in `clock`; callers still
import `LogRow`, `TaskStats`, `utcnow`, `db_now`, ... from here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dart_ray.store.clock import db_now, utcnow
from dart_ray.store.db import RetryPolicy, RowState, dataset_usage_events, rollout_run
from dart_ray.store.log_appends import LogAppends
from dart_ray.store.log_rows import (
    ROW_COLS,
    Claim,
    ClaimRaceError,
    LeaseLostError,
    LogRow,
    log_row,
    model_version_name,
)
from dart_ray.store.log_stats import TaskStats

__all__ = [
    "Claim",
    "ClaimRaceError",
    "DurableLog",
    "LeaseLostError",
    "LogRow",
    "TaskStats",
    "db_now",
    "model_version_name",
    "utcnow",
]


class DurableLog(LogAppends):
    """The log's API over one SQLAlchemy engine (thread-safe; one per process). Appends come
    from `LogAppends` (`dart_ray.store.log_appends`), the statistics, counting queries and
    row reads from `LogStats` (`dart_ray.store.log_stats`)."""

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

    # ------------------------------------------------------------------ claim

    def claim_query(self, run_id: str, n: int, min_version: int | None = None) -> sa.Select[Any]:
        """The SELECT a claim runs: it follows `ix_rollout_run_claim` in index order.

        ORDER BY (version_num, id) is the index's own order after the equality prefix
        (run_id, state), so InnoDB reads exactly the rows it returns and locks only those;
        ordering by id alone would make it sort, scanning and locking every candidate.
        """
        rr = rollout_run.c
        q = sa.select(*ROW_COLS).where(rr.run_id == run_id, rr.state == RowState.AVAILABLE)
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
                sa.select(*ROW_COLS, rr.lease_expires_at)
                .where(rr.claim_id == cid, rr.state == RowState.CLAIMED)
                .order_by(rr.version_num, rr.id)
            ).all()
            if held:
                return Claim(cid, consumer, run_id, tuple(map(log_row, held)), held[0][-1])
            rows = [log_row(r) for r in c.execute(self.claim_query(run_id, n, min_version))]
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

    def quarantine(self, claim: Claim, row_ids: Sequence[int], reason: str) -> int:
        """Settle rows of a claim as bad data (a blob that cannot be read, a group whose
        curation raised), with the reason cut to the column's 64 characters: never trained,
        never retried, counted by the audit apart from the planned drops."""
        return self._settle(claim, row_ids, RowState.QUARANTINED, "QUARANTINE", reason=reason[:64])

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
            if reason is not None and to_state in (RowState.DROPPED, RowState.QUARANTINED):
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
                q = sa.select(*ROW_COLS, rr.claim_id, rr.claimed_by).where(
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
                        c, [log_row(r)], "EXPIRE", t, claim_id=r.claim_id, consumer=r.claimed_by
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
                q = sa.select(*ROW_COLS, rr.claim_id).where(
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
                        [log_row(r)],
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
                q = sa.select(*ROW_COLS).where(
                    rr.run_id == run_id,
                    rr.state == RowState.AVAILABLE,
                    rr.version_num < min_version,
                )
                if self._mysql:
                    q = q.with_for_update(skip_locked=True)
                rows = [log_row(r) for r in c.execute(q)]
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
