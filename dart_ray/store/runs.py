"""The `run` table: one row per training run, with its (redacted) configuration."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.config import redact
from dart_ray.store.clock import utcnow
from dart_ray.store.db import run


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: str
    name: str
    status: str
    config: dict[str, Any]
    started_at: datetime
    finished_at: datetime | None


def _row(r: sa.Row) -> RunRow:  # type: ignore[type-arg]
    return RunRow(
        r.run_id, r.name, r.status, json.loads(r.config_json), r.started_at, r.finished_at
    )


def register_run(engine: Engine, run_id: str, name: str, config: dict[str, Any]) -> None:
    """Record a run (or mark a resumed one RUNNING again). The config is redacted first."""
    snapshot = json.dumps(redact(config), sort_keys=True)
    with engine.begin() as c:
        exists = c.scalar(sa.select(run.c.run_id).where(run.c.run_id == run_id))
        if exists is None:
            c.execute(
                run.insert().values(
                    run_id=run_id, name=name, config_json=snapshot, started_at=utcnow()
                )
            )
        else:
            c.execute(
                run.update()
                .where(run.c.run_id == run_id)
                .values(status="RUNNING", finished_at=None, config_json=snapshot)
            )


def finish_run(engine: Engine, run_id: str, status: str = "FINISHED") -> None:
    with engine.begin() as c:
        c.execute(
            run.update().where(run.c.run_id == run_id).values(status=status, finished_at=utcnow())
        )


def get_run(engine: Engine, run_id: str) -> RunRow | None:
    with engine.connect() as c:
        r = c.execute(sa.select(run).where(run.c.run_id == run_id)).first()
    return None if r is None else _row(r)


def latest_run(engine: Engine) -> RunRow | None:
    with engine.connect() as c:
        r = c.execute(sa.select(run).order_by(run.c.started_at.desc()).limit(1)).first()
    return None if r is None else _row(r)
