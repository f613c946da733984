"""Lineage: an ACK names the durable checkpoint whose weights first include the row, so a
checkpoint's trajectories are one query away (docs/OPERATIONS.md)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.store.db import dataset_usage_events, rollout_run
from dart_ray.store.log import DurableLog
from tests.factories import make_trajectory


def test_ack_into_a_checkpoint_is_recorded_on_the_events(log: DurableLog, engine: Engine) -> None:
    log.append_many([(make_trajectory(f"t{i}"), f"/b/{i}") for i in range(4)])
    first = log.claim("run-a", 2, consumer="c", lease_s=60)
    second = log.claim("run-a", 2, consumer="c", lease_s=60)
    assert log.ack(first, in_version=3) == 2
    assert log.ack(second) == 2  # without a checkpoint name: no lineage, as before
    ev = dataset_usage_events.c
    with engine.connect() as c:
        acks = dict(
            c.execute(sa.select(ev.trajectory_id, ev.reason).where(ev.event_type == "ACK")).all()
        )
        drop_reasons = set(c.scalars(sa.select(rollout_run.c.drop_reason)))
    assert {t for t, r in acks.items() if r == "v3"} == {r.trajectory_id for r in first.rows}
    assert {t for t, r in acks.items() if r is None} == {r.trajectory_id for r in second.rows}
    assert drop_reasons == {None}  # an ACK is no drop
