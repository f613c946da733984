"""The curator core against the real log (SQLite and MariaDB) and real Parquet blobs:
every claimed row ends trained, dropped with a reason, or back in the pool; none twice."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.data.curator import CuratorCore
from dart_ray.records import SAMPLE_SCHEMA, Status
from dart_ray.store.blobs import BlobStore
from dart_ray.store.db import RowState, rollout_run
from dart_ray.store.log import DurableLog
from tests.data.curator_support import settings, settled, write_group
from tests.factories import make_trajectory


def test_every_row_is_trained_or_dropped_once(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "a", 0, [1.0, 0.0, 0.0, 1.0])
    write_group(log, blobs, "b", 0, [0.0, 1.0, 0.0, 0.0])
    write_group(
        log,
        blobs,
        "c",
        0,
        [1.0, 0.0, 0.0, 0.0],
        statuses=[Status.OK, Status.OK, Status.ENV_ERROR, Status.OK],
    )
    write_group(log, blobs, "d", 0, [0.0, 0.0, 0.0, 0.0])  # all fail, no success of d yet
    write_group(log, blobs, "e", 0, [1.0, 0.0, 1.0, 0.0])
    core = CuratorCore(log, blobs, settings())
    core.poll()
    steps = []
    while (step := core.take_step()) is not None:
        steps.append(step)
    # groups a, b, e have signal; c is dropped (env error), d has no signal and nothing to
    # replay -> 3 trainable groups, 2 per step -> one full step, and one group waiting
    assert len(steps) == 1 and steps[0].num_groups == 2
    for shard in steps[0].shards:
        assert shard.schema.equals(SAMPLE_SCHEMA)
    assert sum(s.num_rows for s in steps[0].shards) == steps[0].num_samples == 16
    for s in steps:
        core.ack(s.step_id)
    acks, drops, states = settled(engine)
    assert drops == Counter({"group_env_error": 4, "no_signal": 4})
    assert set(acks.values()) == {1} and len(acks) == 8
    # the third trainable group is still held (claimed), not lost and not trained
    assert Counter(states.values()) == {
        RowState.CONSUMED: 8,
        RowState.DROPPED: 8,
        RowState.CLAIMED: 4,
    }
    assert core.release_all() == 4
    _, _, states = settled(engine)
    assert Counter(states.values())[RowState.AVAILABLE] == 4


def test_replay_from_the_log_fills_an_all_fail_group(log: DurableLog, tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "t", 0, [1.0, 0.0, 1.0, 0.0])
    write_group(log, blobs, "t", 1, [0.0, 0.0, 0.0, 0.0])
    core = CuratorCore(log, blobs, settings(groups_per_step=1))
    core.poll()
    first, second = core.take_step(), core.take_step()
    assert first is not None and second is not None
    assert core.metrics.replays == 1
    ids = set(
        pa.concat_tables([pa.Table.from_batches([b]) for b in second.shards if b.num_rows])
        .column("trajectory_id")
        .to_pylist()
    )
    assert "t#0/2" in ids  # the newest success of task t took the oldest failure's place


def test_backpressure_leaves_rows_in_the_pool(log: DurableLog, tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    for k in range(3):
        write_group(log, blobs, f"t{k}", 0, [1.0, 0.0, 0.0, 0.0])
    core = CuratorCore(log, blobs, settings(groups_per_step=1, queue_depth=1, claim_batch=4))
    core.poll()
    assert core.metrics.queue_depth == 1
    assert core.poll() == 0  # queue full: claims nothing
    step = core.take_step()
    assert step is not None
    assert core.poll() == 4  # room again
    assert log.buffer("run-a").get((0, RowState.AVAILABLE)) == 4


def test_a_dead_curator_loses_nothing(log: DurableLog, engine: Engine, tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    for k in range(2):
        write_group(log, blobs, f"t{k}", 0, [1.0, 0.0, 0.0, 0.0])
    dead = CuratorCore(log, blobs, settings(groups_per_step=1, lease_s=0.5, consumer="dead"))
    dead.poll()
    assert dead.take_step() is not None  # handed to a trainer that never finishes
    del dead
    time.sleep(0.7)
    live = CuratorCore(log, blobs, settings(groups_per_step=1, consumer="live"))
    live.poll()
    while (s := live.take_step()) is not None:
        live.ack(s.step_id)
    acks, _, states = settled(engine)
    assert len(acks) == 8 and set(acks.values()) == {1}
    assert set(states.values()) == {RowState.CONSUMED}


def test_an_undersized_group_is_dropped_after_its_wait(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """A group whose other members never come (their rollouter died) and that stays below
    min_group is dropped with a reason after group_abandon_s, instead of being held (and its
    lease renewed) forever."""
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "lonely", 0, [1.0, 0.0, 0.0, 0.0])
    with engine.begin() as c:  # three members never arrived
        c.execute(rollout_run.delete().where(rollout_run.c.trajectory_id != "lonely#0/0"))
    core = CuratorCore(log, blobs, settings(min_group=2, group_timeout_s=10, group_abandon_s=60))
    core.poll(now=0)
    core.poll(now=59)
    assert core.metrics.held_rows == 1
    core.poll(now=61)
    _, drops, states = settled(engine)
    assert drops == Counter({"group_incomplete": 1})
    assert set(states.values()) == {RowState.DROPPED} and core.metrics.held_rows == 0


def test_a_slow_trainer_leaves_rows_in_the_log_not_in_memory(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """Rollout writes ten groups for every step the trainer takes. The curator holds at most
    max_held_rows (here 12: one queued step of 4 rows, groups still filling, curated groups)
    and leaves the rest AVAILABLE in the durable log. Before, it claimed up to claim_batch
    (256) rows whatever it already held, hoarding a slow trainer's backlog in memory."""
    blobs = BlobStore(tmp_path / "blobs")
    core = CuratorCore(
        log, blobs, settings(groups_per_step=1, queue_depth=1, max_held_rows=12, claim_batch=256)
    )
    trained = 0
    for rnd in range(3):
        for k in range(10):  # rollout: 10 groups per train step
            write_group(log, blobs, f"t{k}", rnd, [1.0, 0.0, 0.0, 0.0])
        for _ in range(5):
            core.poll()
            assert core.metrics.held_rows <= 12
        step = core.take_step()  # the trainer: one step per round
        assert step is not None
        core.ack(step.step_id)
        trained += len(step.rows)
    available = log.buffer("run-a").get((0, RowState.AVAILABLE), 0)
    assert available == 120 - trained - core.metrics.held_rows >= 100


def _states_by_task(engine: Engine) -> dict[str, Counter[int]]:
    rr = rollout_run.c
    with engine.connect() as c:
        rows = c.execute(sa.select(rr.task_id, rr.state)).all()
    out: dict[str, Counter[int]] = {}
    for task, state in rows:
        out.setdefault(task, Counter())[state] += 1
    return out


def test_a_group_whose_curation_raises_is_quarantined_and_the_others_train(
    log: DurableLog, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45, point 1: a poison group before a healthy one. Before the fix the exception
    left the poll, the popped groups were lost from the buffer and their rows stayed CLAIMED
    (renewed for ever): the run stalled. Now the poison rows are QUARANTINED with the reason,
    and the healthy group trains in the same poll."""
    import dart_ray.data.curator as curator_mod

    real = curator_mod.curate_group

    def poisoned(members, params, replay=None):  # type: ignore[no-untyped-def]
        if members[0][1].task.task_id == "poison":
            raise KeyError("a field the curation needs")
        return real(members, params, replay)

    monkeypatch.setattr(curator_mod, "curate_group", poisoned)
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "poison", 0, [1.0, 0.0, 0.0, 0.0])
    write_group(log, blobs, "healthy", 0, [1.0, 0.0, 0.0, 0.0])
    core = CuratorCore(log, blobs, settings(groups_per_step=1))
    core.poll()
    step = core.take_step()
    assert step is not None and step.num_groups == 1
    core.ack(step.step_id)
    states = _states_by_task(engine)
    assert states["poison"] == Counter({RowState.QUARANTINED: 4})
    assert states["healthy"] == Counter({RowState.CONSUMED: 4})
    assert core.metrics.quarantined == Counter({"curation": 4})
    assert core.metrics.held_rows == 0  # nothing left claimed and renewed
    with engine.connect() as c:
        reasons = set(c.scalars(sa.select(rollout_run.c.drop_reason).where(
            rollout_run.c.task_id == "poison")))  # fmt: skip
    assert reasons == {"curation: KeyError: 'a field the curation needs'"}


def test_bad_data_of_every_kind_is_quarantined_with_its_reason(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """A corrupt blob, a missing blob, and a trajectory that cannot train (a step without
    response tokens): each is settled QUARANTINED with where it broke; a healthy group
    trains beside them."""
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "healthy", 0, [1.0, 0.0, 0.0, 0.0])
    write_group(log, blobs, "corrupt", 0, [1.0, 0.0])
    write_group(log, blobs, "missing", 0, [1.0, 0.0])
    rr = rollout_run.c
    with engine.connect() as c:
        uris = dict(c.execute(sa.select(rr.trajectory_id, rr.uri)).all())
    Path(uris["corrupt#0/0"]).write_bytes(b"PAR1 not a parquet file")
    Path(uris["missing#0/1"]).unlink()
    empty = make_trajectory(
        "empty#0/0", task_id="empty", reward=1.0, group_id="empty#0", group_size=2
    )
    empty = replace(
        empty, steps=(replace(empty.steps[0], response_ids=(), behaviour_logprobs=(), entropy=()),)
    )
    other = make_trajectory("empty#0/1", task_id="empty", group_id="empty#0", group_size=2)
    log.append_many([(t, blobs.write(t)) for t in (empty, other)])
    core = CuratorCore(log, blobs, settings(groups_per_step=1, min_group=1, group_timeout_s=0))
    core.poll()
    with engine.connect() as c:
        quarantined = c.scalars(sa.select(rr.drop_reason).where(rr.state == RowState.QUARANTINED))
        reasons = dict(Counter(r.split(":")[0] for r in quarantined))
    assert reasons == {"blob_unreadable": 2, "curation": 2}
    assert core.metrics.quarantined == Counter({"blob_unreadable": 2, "curation": 2})
    assert _states_by_task(engine)["healthy"] == Counter({RowState.CLAIMED: 4})  # in a step
    assert core.take_step() is not None


def test_the_synchronous_round_packs_every_group_it_gave_into_one_step(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """Sync mode (`pack_as_ready` off): polls curate but never pack; `flush` at the end of a
    round releases what is still filling (a group missing a member: 3 of 4 final, min_group
    2, is curated; one with a single final member is dropped `group_incomplete`) and packs
    every trainable group into one step (3 here, below groups_per_step 4: a synchronous step
    trains what its round gave)."""
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    write_group(log, blobs, "b", 0, [0.0, 1.0, 0.0, 0.0])
    write_group(log, blobs, "flat", 0, [0.0, 0.0, 0.0, 0.0])  # no signal: dropped
    write_group(log, blobs, "short", 0, [1.0, 0.0, 0.0, 0.0][:3])  # 3 logged of 4
    rr, short_rows = rollout_run.c, None
    with engine.begin() as c:  # they were stamped as groups of 4
        c.execute(rollout_run.update().where(rr.task_id == "short").values(group_size=4))
        short_rows = c.scalar(sa.select(sa.func.count()).where(rr.task_id == "short"))
    assert short_rows == 3
    write_group(log, blobs, "lonely", 0, [1.0])
    with engine.begin() as c:
        c.execute(rollout_run.update().where(rr.task_id == "lonely").values(group_size=4))
    core = CuratorCore(log, blobs, settings(groups_per_step=4, min_group=2, pack_as_ready=False))
    core.poll()
    assert core.metrics.queue_depth == 0 and core.metrics.ready_groups == 2  # a, b
    assert core.flush() == 1
    step = core.take_step()
    assert step is not None and step.num_groups == 3  # a, b and the short one
    assert core.metrics.dropped == Counter({"no_signal": 4, "group_incomplete": 1})
