"""Builders shared by the curator's tests: a group of trajectories written to the log and
blobs, the log's settled state, and curator settings with test defaults."""

from __future__ import annotations

from collections import Counter

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.data.curator import CuratorSettings
from dart_ray.records import Status
from dart_ray.store.blobs import BlobStore
from dart_ray.store.db import dataset_usage_events, rollout_run
from dart_ray.store.log import DurableLog
from tests.factories import make_trajectory


def write_group(
    log: DurableLog,
    blobs: BlobStore,
    task: str,
    rnd: int,
    rewards: list[float],
    *,
    version: int = 0,
    statuses: list[Status] | None = None,
) -> None:
    gid = f"{task}#{rnd}"
    items = []
    for i, r in enumerate(rewards):
        st = statuses[i] if statuses else Status.OK
        t = make_trajectory(
            f"{gid}/{i}",
            task_id=task,
            reward=r,
            version=version,
            status=st,
            n_steps=0 if st is Status.ENV_ERROR else 2,
            group_id=gid,
            group_size=len(rewards),
        )
        items.append((t, blobs.write(t)))
    log.append_many(items)


def settled(engine: Engine) -> tuple[Counter[int], Counter[str], dict[int, int]]:
    ev = dataset_usage_events.c
    with engine.connect() as c:
        acks = Counter(c.scalars(sa.select(ev.row_id).where(ev.event_type == "ACK")))
        drops = Counter(c.scalars(sa.select(ev.reason).where(ev.event_type == "DROP")))
        states = dict(c.execute(sa.select(rollout_run.c.id, rollout_run.c.state)).all())
    return acks, drops, states


def settings(**kw: object) -> CuratorSettings:
    base = dict(
        run_id="run-a",
        num_ranks=2,
        group_size=4,
        groups_per_step=2,
        lease_s=60,
        group_timeout_s=1000,
    )
    base.update(kw)
    return CuratorSettings(**base)  # type: ignore[arg-type]
