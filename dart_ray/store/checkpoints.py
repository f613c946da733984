"""The checkpoint registry: one row per published weight version, with a status workflow.

    PENDING -> RUNNING -> COMPLETED -> DEPRECATED
         \\         \\-> FAILED (with the reason)
          \\-> FAILED
    any of PENDING, RUNNING, COMPLETED, FAILED -> DISCARDED

DISCARDED marks a version whose weights are gone: a trainer resumed from the durable
checkpoint below it (`discard_above`). Samples that version generated came from weights off
the run's lineage; `lineage()` is what every component reads to judge a sample's version (the
newest version published, and the discarded ones, judged by their distance through the
version tree: `Lineage.effective`).

DART-GUI's release created rows and never moved them; here every move is a compare-and-set on
the current status, so two writers cannot both complete a checkpoint and an illegal move
fails loudly with the state it found. Deletion is soft (`deleted_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.config.masking import mask_text
from dart_ray.store.clock import utcnow
from dart_ray.store.db import RetryPolicy, checkpoint

PENDING, RUNNING, COMPLETED, FAILED, DEPRECATED, DISCARDED = (
    "PENDING",
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "DEPRECATED",
    "DISCARDED",
)
_ALLOWED_FROM = {
    RUNNING: (PENDING,),
    COMPLETED: (RUNNING,),
    FAILED: (PENDING, RUNNING),
    DEPRECATED: (COMPLETED,),
    DISCARDED: (PENDING, RUNNING, COMPLETED, FAILED),
}


@dataclass(frozen=True, slots=True)
class Lineage:
    """What the registry says about a run's versions, for judging a sample's version."""

    newest: int
    """The highest version ever registered (published or being published): versions only go
    up, so staleness is measured against at least this."""
    discarded: frozenset[int]
    """Versions whose weights are gone (a trainer resumed from an older durable checkpoint):
    their tags no longer say how far their samples are from the weights being trained."""

    def effective(self, version: int, at: int | None = None) -> int:
        """The version a sample of `version` is as far from as the lineage goes (`at`: as it
        went when the weights of version `at` trained the sample; by default, as it goes now).

        A block of discarded versions D+1..M branched off the durable vD; the resumed trainer
        published vD's weights again as v(M+1) and trains on from there. So a sample of vD
        (or of an ancestor v <= D) is as far from the current vc as v(M+1) - (D - v) is: its
        weights are vD's, which v(M+1) republished. A sample of discarded v is v - D updates
        from vD on the dead branch: the distance of a sample of version M + 1 - (v - D).
        Each later resume above it shifts it again, by that block's M + 1 - D. Staleness
        (and the audit) judge a sample by this: a dead branch's tag never passes as fresh,
        and the durable version's samples are not judged as far as the discarded versions
        above it made their tag look. A resume after `at` (its block's M + 1 > `at`) had not
        happened yet for a sample trained at `at`, and does not move it."""
        blocks = [(d, m) for d, m in self._blocks() if at is None or m + 1 <= at]
        eff, top = version, version
        for d, m in blocks:  # a discarded version: where its branch joins the lineage
            if d < version <= m:
                eff, top = m + 1 - (version - d), m + 1
        for d, m in blocks:  # every resume above it republished its ancestor's weights
            if d >= top:
                eff += m + 1 - d
        return eff

    def _blocks(self) -> list[tuple[int, int]]:
        """The discarded blocks as (D, M): versions D+1..M, D the durable version below."""
        out: list[tuple[int, int]] = []
        for v in sorted(self.discarded):
            if out and out[-1][1] == v - 1:
                out[-1] = (out[-1][0], v)
            else:
                out.append((v - 1, v))
        return out


class CheckpointStateError(RuntimeError):
    """An illegal status move (e.g. completing a checkpoint that already failed)."""


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    id: int
    run_id: str
    version_num: int
    version: str
    status: str
    path: str | None
    error: str | None
    created_at: datetime
    finished_at: datetime | None


def _row(r: sa.Row) -> CheckpointRow:  # type: ignore[type-arg]
    return CheckpointRow(
        id=r.id,
        run_id=r.run_id,
        version_num=r.version_num,
        version=r.version,
        status=r.status,
        path=r.path,
        error=r.error,
        created_at=r.created_at,
        finished_at=r.finished_at,
    )


class CheckpointRegistry:
    def __init__(self, engine: Engine, retry: RetryPolicy | None = None) -> None:
        self.engine = engine
        self.retry = retry or RetryPolicy()

    def create(
        self,
        run_id: str,
        version_num: int,
        *,
        path: str | None = None,
        source: str = "train",
        operator: str = "",
        remark: str = "",
        config_yaml: str | None = None,
    ) -> int:
        """Register version `version_num` of a run as PENDING; returns its id (idempotent).

        `config_yaml` (e.g. `Config.redacted_yaml()`) is masked once more before it is stored.
        """
        if config_yaml is not None:
            config_yaml = mask_text(config_yaml)

        def txn() -> int:
            cp = checkpoint.c
            with self.engine.begin() as c:
                existing = c.scalar(
                    sa.select(cp.id).where(cp.run_id == run_id, cp.version_num == version_num)
                )
                if existing is not None:
                    return int(existing)
                now = utcnow()
                res = c.execute(
                    checkpoint.insert().values(
                        name=f"{run_id[:40]}-v{version_num}",
                        version=f"v{version_num}",
                        version_num=version_num,
                        run_id=run_id,
                        status=PENDING,
                        path=path,
                        source=source,
                        operator=operator,
                        remark=remark,
                        config_yaml=config_yaml,
                        created_at=now,
                        updated_at=now,
                    )
                )
                return int(res.inserted_primary_key[0])

        return self.retry.run(txn, "checkpoint create")

    def _move(self, cid: int, to: str, **values: object) -> None:
        def txn() -> None:
            cp = checkpoint.c
            now = utcnow()
            with self.engine.begin() as c:
                n = c.execute(
                    checkpoint.update()
                    .where(cp.id == cid, cp.status.in_(_ALLOWED_FROM[to]), cp.deleted_at.is_(None))
                    .values(status=to, updated_at=now, **values)
                ).rowcount
                if n == 1:
                    return
                found = c.scalar(sa.select(cp.status).where(cp.id == cid))
                if found == to:
                    return  # an earlier attempt of this same move committed (retry)
                raise CheckpointStateError(
                    f"checkpoint {cid} is {found or 'missing'}; cannot move it to {to}"
                )

        self.retry.run(txn, f"checkpoint {to.lower()}")

    def start(self, cid: int) -> None:
        self._move(cid, RUNNING, started_at=utcnow())

    def complete(self, cid: int, path: str | None = None) -> None:
        extra: dict[str, object] = {"finished_at": utcnow()}
        if path is not None:
            extra["path"] = path
        self._move(cid, COMPLETED, **extra)

    def attach(self, cid: int, path: str) -> None:
        """Record durable files for a COMPLETED checkpoint that had none yet."""
        cp = checkpoint.c
        with self.engine.begin() as c:
            n = c.execute(
                checkpoint.update()
                .where(cp.id == cid, cp.status == COMPLETED, cp.deleted_at.is_(None))
                .values(path=path, updated_at=utcnow())
            ).rowcount
        if n != 1:
            raise CheckpointStateError(f"checkpoint {cid} is not COMPLETED; cannot attach {path}")

    def fail(self, cid: int, error: str) -> None:
        # the reason is often an exception's text, which may quote a DSN or a header
        self._move(cid, FAILED, finished_at=utcnow(), error=mask_text(error)[:60000])

    def deprecate(self, cid: int) -> None:
        self._move(cid, DEPRECATED)

    def discard_above(self, run_id: str, version_num: int, reason: str) -> list[int]:
        """Mark every version of the run above `version_num` DISCARDED (their weights are
        lost: a trainer resumes from `version_num`); returns the versions it marked."""
        cp = checkpoint.c

        def txn() -> list[int]:
            with self.engine.begin() as c:
                where = (
                    cp.run_id == run_id,
                    cp.version_num > version_num,
                    cp.status.in_(_ALLOWED_FROM[DISCARDED]),
                    cp.deleted_at.is_(None),
                )
                versions = sorted(c.scalars(sa.select(cp.version_num).where(*where)))
                if versions:
                    now = utcnow()
                    c.execute(
                        checkpoint.update()
                        .where(*where)
                        .values(status=DISCARDED, updated_at=now, error=mask_text(reason)[:60000])
                    )
                return versions

        return self.retry.run(txn, "checkpoint discard")

    def lineage(self, run_id: str) -> Lineage:
        cp = checkpoint.c
        q = sa.select(cp.version_num, cp.status).where(cp.run_id == run_id, cp.deleted_at.is_(None))
        rows = self._fetch(q)
        return Lineage(
            newest=max((r.version_num for r in rows), default=0),
            discarded=frozenset(r.version_num for r in rows if r.status == DISCARDED),
        )

    def delete(self, cid: int) -> None:
        """Soft delete: the row stays for lineage, but no query of the registry returns it."""
        with self.engine.begin() as c:
            c.execute(
                checkpoint.update()
                .where(checkpoint.c.id == cid, checkpoint.c.deleted_at.is_(None))
                .values(deleted_at=utcnow(), updated_at=utcnow())
            )

    def list(self, run_id: str) -> list[CheckpointRow]:
        cp = checkpoint.c
        q = (
            sa.select(checkpoint)
            .where(cp.run_id == run_id, cp.deleted_at.is_(None))
            .order_by(cp.version_num)
        )
        return [_row(r) for r in self._fetch(q)]

    def _fetch(self, q: sa.Select[Any]) -> list[sa.Row[Any]]:
        def read() -> list[sa.Row[Any]]:
            with self.engine.connect() as c:
                return list(c.execute(q).all())

        return self.retry.run(read, "checkpoint read")

    def latest(self, run_id: str, status: str | None = COMPLETED) -> CheckpointRow | None:
        """The newest checkpoint of a run (with the given status; None means any)."""
        cp = checkpoint.c
        q = sa.select(checkpoint).where(cp.run_id == run_id, cp.deleted_at.is_(None))
        if status is not None:
            q = q.where(cp.status == status)
        rows = self._fetch(q.order_by(cp.version_num.desc()).limit(1))
        return _row(rows[0]) if rows else None
