"""Builders shared by the durable log's tests: rows appended, events and row ids read back."""

from __future__ import annotations

from collections import Counter

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.store.db import dataset_usage_events, rollout_run
from dart_ray.store.log import DurableLog
from tests.factories import make_trajectory


def fill(log: DurableLog, n: int, run_id: str = "run-a", version: int = 0) -> None:
    log.append_many(
        [
            (
                make_trajectory(f"t{i}", run_id=run_id, task_id=f"task-{i % 4}", version=version),
                f"/b/t{i}",
            )
            for i in range(n)
        ]
    )


def events(engine: Engine, event_type: str, run_id: str = "run-a") -> Counter[int]:
    ev = dataset_usage_events.c
    with engine.connect() as c:
        rows = c.scalars(
            sa.select(ev.row_id).where(ev.run_id == run_id, ev.event_type == event_type)
        ).all()
    return Counter(rows)


def all_row_ids(engine: Engine, run_id: str = "run-a") -> set[int]:
    with engine.connect() as c:
        return set(c.scalars(sa.select(rollout_run.c.id).where(rollout_run.c.run_id == run_id)))


def log_module_cols() -> tuple[sa.ColumnElement, ...]:  # type: ignore[type-arg]
    from dart_ray.store.log_rows import ROW_COLS

    return ROW_COLS


def stored_rows(engine: Engine, ids: list[int]) -> list[sa.Row]:  # type: ignore[type-arg]
    with engine.connect() as c:
        return list(c.execute(sa.select(rollout_run).where(rollout_run.c.id.in_(ids))))
