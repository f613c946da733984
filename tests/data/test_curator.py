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

from dart_ray.data.curation import CurationParams
from dart_ray.data.curator import CuratorCore, CuratorSettings
from dart_ray.records import SAMPLE_SCHEMA, Status
from dart_ray.store.blobs import BlobStore
from dart_ray.store.checkpoints import CheckpointRegistry
from dart_ray.store.db import RowState, dataset_usage_events, rollout_run
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


def test_stale_rows_are_dropped_and_counted(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "old", 0, [1.0, 0.0, 0.0, 0.0], version=1)
    write_group(log, blobs, "new", 0, [1.0, 0.0, 0.0, 0.0], version=5)
    core = CuratorCore(log, blobs, settings(max_staleness=2, groups_per_step=1))
    core.set_version(6)  # bound: version >= 4
    core.poll()
    assert core.metrics.dropped["stale"] == 4
    step = core.take_step()
    assert step is not None and {
        r for b in step.shards for r in b.column("weight_version").to_pylist()
    } == {5}
    assert core.metrics.staleness == Counter({1: 4})


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


def test_a_replay_older_than_the_bound_never_reaches_a_gradient(
    log: DurableLog, tmp_path: Path
) -> None:
    """The task's newest success was sampled at version 0; the policy is at 5 (bound 2).
    An all-fail group of that task at version 5 trains without it: a replay is a sample like
    any other, and the staleness bound holds for it too (it was replayed from any age)."""
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "t", 0, [1.0, 0.0, 1.0, 0.0])
    params = CurationParams(drop_no_signal=False)  # a group without its replay still trains
    core = CuratorCore(log, blobs, settings(groups_per_step=1, max_staleness=2, params=params))
    core.poll()
    assert core.take_step() is not None
    core.set_version(5)
    write_group(log, blobs, "t", 1, [0.0, 0.0, 0.0, 0.0], version=5)
    core.poll()
    step = core.take_step()
    assert step is not None and core.metrics.replays == 0 and core.metrics.replays_stale == 1
    versions = pa.concat_arrays([b.column("weight_version") for b in step.shards]).to_pylist()
    assert set(versions) == {5} and step.min_version == 5
    # within the bound the replay is used, and the step's oldest version counts it
    write_group(log, blobs, "t", 2, [0.0, 0.0, 0.0, 0.0], version=6)
    write_group(log, blobs, "u", 0, [1.0, 0.0, 0.0, 0.0], version=4)
    write_group(log, blobs, "u", 1, [0.0, 0.0, 0.0, 0.0], version=6)
    core.set_version(6)
    steps = []
    for _ in range(3):  # the queue holds two steps: poll between hand-outs
        core.poll()
        steps.append(core.take_step())
    assert core.metrics.replays == 1
    assert sorted(st.min_version for st in steps if st is not None) == [4, 4, 6]


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


def test_no_row_older_than_the_bound_is_handed_out_wherever_it_waited(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """Rows claimed at version 0 wait: one group in a queued step, one curated and waiting
    for a step partner, one still filling. The policy moves to version 3 (bound 2: rows must
    be from version >= 1): all of them are dropped as stale, none handed out. Before, only
    rows still unclaimed in the log were checked, and the queued step went to the trainer."""
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "queued", 0, [1.0, 0.0, 0.0, 0.0])  # complete -> a step
    write_group(log, blobs, "ready", 0, [1.0, 0.0, 1.0, 0.0])  # complete, waits for a partner
    write_group(log, blobs, "filling", 0, [1.0, 0.0])  # 2 of 4 slots
    core = CuratorCore(
        log, blobs, settings(groups_per_step=1, queue_depth=1, max_staleness=2, min_group=3)
    )
    core.poll()
    assert core.metrics.queue_depth == 1 and core.metrics.pending_groups == 2
    core.set_version(3)
    assert core.take_step() is None  # checked at hand-out, before any poll
    core.poll()
    assert core.take_step() is None
    _, drops, states = settled(engine)
    assert drops == Counter({"stale": 10}) and core.metrics.dropped["stale"] == 10
    assert set(states.values()) == {RowState.DROPPED}
    assert core.metrics.held_rows == 0 and core.metrics.pending_groups == 0
    # fresh rows still flow
    write_group(log, blobs, "fresh", 0, [1.0, 0.0, 0.0, 0.0], version=3)
    core.poll()
    step = core.take_step()
    assert step is not None and step.min_version == 3


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


def _publish(reg: CheckpointRegistry, *versions: int) -> None:
    for v in versions:
        cid = reg.create("run-a", v)
        reg.start(cid)
        reg.complete(cid)


def test_a_new_curator_judges_staleness_against_the_registry_at_once(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """The run has published up to version 5 (bound 2: rows must be >= 3). A curator that
    starts now (Ray restarted it) must drop the version-0 rows a dead curator held, not hand
    them out before the trainer tells it the version. Before, its version was 0 until then,
    the bound -2, and the oldest rows went out first."""
    blobs = BlobStore(tmp_path / "blobs")
    reg = CheckpointRegistry(engine)
    _publish(reg, 1, 2, 3, 4, 5)
    write_group(log, blobs, "old", 0, [1.0, 0.0, 0.0, 0.0], version=0)
    write_group(log, blobs, "new", 0, [1.0, 0.0, 0.0, 0.0], version=5)
    core = CuratorCore(
        log,
        blobs,
        settings(groups_per_step=1, max_staleness=2),
        lineage=lambda: reg.lineage("run-a"),
    )
    assert core.version == 5
    core.poll()
    step = core.take_step()
    assert step is not None and step.min_version == 5 and core.take_step() is None
    _, drops, _ = settled(engine)
    assert drops == Counter({"stale": 4})


def test_samples_of_discarded_versions_are_judged_by_their_distance_through_the_version_tree(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """Versions 1-4 were published; the trainer died and resumed from the durable v2, so
    v3's and v4's weights are gone (`discard_above`) and it published v2's weights as v5.
    A sample of v4 is 2 updates from v2 on the dead branch: at v5 it is 2 behind, at v7 4
    behind, whatever its tag says (bound 3). Before, its tag made it 1 and 3 behind: it
    passed as fresh. Samples queued before the resume, or logged after it by replicas still
    serving v4, are judged the same way."""
    blobs = BlobStore(tmp_path / "blobs")
    reg = CheckpointRegistry(engine)
    _publish(reg, 1, 2, 3, 4)
    core = CuratorCore(
        log,
        blobs,
        settings(groups_per_step=1, max_staleness=3, queue_depth=8),
        lineage=lambda: reg.lineage("run-a"),
    )
    write_group(log, blobs, "queued", 0, [1.0, 0.0, 0.0, 0.0], version=4)
    core.poll()
    assert core.metrics.queue_depth == 1
    assert reg.discard_above("run-a", 2, "resumed from v2") == [3, 4]
    _publish(reg, 5)  # the resumed trainer publishes its weights (v2's) as v5
    core.set_version(5)
    # at v5 (bound: >= 2): v4 is as far as a v3 sample (2 behind), v3 as a v4 (1 behind),
    # and v2's weights are v5's (republished): 0 behind
    assert [core.lineage.effective(v) for v in (2, 3, 4, 5)] == [5, 4, 3, 5]
    for name, v in (("late", 3), ("ancestor", 2), ("fresh", 5)):
        write_group(log, blobs, name, 0, [1.0, 0.0, 0.0, 0.0], version=v)
    core.poll()
    steps = [core.take_step() for _ in range(5)]
    assert sorted(st.min_version for st in steps if st is not None) == [2, 3, 4, 5]
    # at v7 (bound: >= 4): a v4 sample is (4 - 2) + (7 - 5) = 4 behind: stale; v3's is 3
    _publish(reg, 6, 7)
    core.set_version(7)
    write_group(log, blobs, "dead-branch", 1, [1.0, 0.0, 0.0, 0.0], version=4)
    write_group(log, blobs, "near-branch", 1, [1.0, 0.0, 0.0, 0.0], version=3)
    core.poll()
    steps = [core.take_step() for _ in range(2)]
    assert [st.min_version for st in steps if st is not None] == [3]
    _, drops, _ = settled(engine)
    assert drops == Counter({"stale": 4})


def test_a_replay_that_goes_stale_in_the_queue_leaves_only_itself(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """A queued step of two groups; one is an all-fail group of version 2 holding a replayed
    success of version 0 (within the bound at version 2). The policy moves to 3: the replay
    is now past the bound, the step's own rows are not. The step goes out without the
    replay's samples, every row of it still trained. Before, the whole step (8 fresh rows)
    was dropped as stale."""
    blobs = BlobStore(tmp_path / "blobs")
    write_group(log, blobs, "t", 0, [1.0, 0.0, 1.0, 0.0], version=0)
    write_group(log, blobs, "u", 0, [1.0, 0.0, 0.0, 0.0], version=0)
    core = CuratorCore(log, blobs, settings(groups_per_step=2, max_staleness=2))
    core.poll()
    first = core.take_step()
    assert first is not None
    core.ack(first.step_id)
    core.set_version(2)
    write_group(log, blobs, "t", 1, [0.0, 0.0, 0.0, 0.0], version=2)  # replays t#0/2 (v0)
    write_group(log, blobs, "u", 1, [1.0, 0.0, 0.0, 0.0], version=2)
    core.poll()
    assert core.metrics.replays == 1 and core.metrics.queue_depth == 1
    core.set_version(3)
    step = core.take_step()
    assert step is not None and step.num_groups == 2 and len(step.rows) == 7
    ids = pa.concat_arrays([b.column("trajectory_id") for b in step.shards]).to_pylist()
    assert "t#0/2" not in ids and len(ids) == step.num_samples == 14  # 7 rows x 2 steps
    assert step.min_version == 2 and core.metrics.replays_stale == 1
    _, drops, _ = settled(engine)
    assert drops == Counter({"replaced_by_replay": 1})


def test_the_pace_is_rows_leaving_the_queue_per_version_and_versions_per_second(
    log: DurableLog, tmp_path: Path
) -> None:
    """Admission reads the curator's pace. Before two versions: a step's nominal rows (2
    groups of 4 = 8) and no rate. Then: v0 at t=100 with nothing gone yet; a step of 8 rows
    handed out, a group of 4 dropped (no signal); v1 at t=110: 12 rows per version, and at
    t=120 (10 s after v1, nothing new) 1 version in 20 s: 0.05 per second; 8 rows handed per
    version; half the version (10 s of 20) left. Waiting (not yet curated): the 5 unclaimed
    the caller counts; curated: the group of 3 waiting for a partner. Two more groups: one
    packs a step with it, the other waits: 3 + 4 + 4 curated, and a group still filling (2
    of 4 logged) waits."""
    blobs = BlobStore(tmp_path / "blobs")
    core = CuratorCore(log, blobs, settings(groups_per_step=2))
    first = core.pace(available=0)
    assert (first.rows_per_version, first.versions_per_s) == (8.0, 0.0)
    core.set_version(0, now=100.0)
    write_group(log, blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    write_group(log, blobs, "b", 0, [1.0, 1.0, 0.0, 0.0])
    write_group(log, blobs, "flat", 0, [0.0, 0.0, 0.0, 0.0])  # no signal: dropped
    write_group(log, blobs, "three", 0, [1.0, 0.0, 0.0])  # curated, no partner yet
    core.poll(now=100.0)
    assert core.take_step() is not None
    core.set_version(1, now=110.0)
    pace = core.pace(available=5, now=120.0)
    assert pace.version == 1 and pace.rows_per_version == 12.0
    assert pace.versions_per_s == 1 / 20 and pace.handed_per_version == 8.0
    assert pace.training_left == 0.5
    assert (pace.waiting_rows, pace.curated_rows, pace.partner_rows) == (5, 3, 3)
    write_group(log, blobs, "c", 1, [1.0, 0.0, 0.0, 0.0])
    write_group(log, blobs, "d", 1, [1.0, 0.0, 0.0, 0.0])
    t = make_trajectory("e#1/0", task_id="e", reward=1.0, group_id="e#1", group_size=4)
    u = make_trajectory("e#1/1", task_id="e", reward=0.0, group_id="e#1", group_size=4)
    log.append_many([(t, blobs.write(t)), (u, blobs.write(u))])
    core.poll(now=121.0)
    pace = core.pace(available=0, now=121.0)
    assert (pace.waiting_rows, pace.curated_rows) == (2, 3 + 4 + 4)
    assert pace.partner_rows == 4  # the step of "three" and one group packed; one waits


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


def test_rows_of_the_durable_version_are_as_fresh_as_its_republished_weights(
    log: DurableLog, engine: Engine, tmp_path: Path
) -> None:
    """Issue 45, point 4: versions 1-6 were published, the trainer resumed from the durable
    v2 (3-6 discarded) and published v2's weights again as v7. A row of v2 was sampled by
    exactly v7's weights: 0 behind at v7, 1 at v8 (bound 2). Before the fix its tag made it
    5 and 6 behind and it was dropped as stale: every row logged by the durable version
    before the crash was thrown away after a resume."""
    blobs = BlobStore(tmp_path / "blobs")
    reg = CheckpointRegistry(engine)
    _publish(reg, 1, 2, 3, 4, 5, 6)
    assert reg.discard_above("run-a", 2, "resumed from v2") == [3, 4, 5, 6]
    _publish(reg, 7, 8)
    core = CuratorCore(
        log,
        blobs,
        settings(groups_per_step=1, max_staleness=2, queue_depth=8),
        lineage=lambda: reg.lineage("run-a"),
    )
    core.set_version(8)
    assert [core.lineage.effective(v) for v in (1, 2, 4, 7)] == [6, 7, 5, 7]
    write_group(log, blobs, "durable", 0, [1.0, 0.0, 0.0, 0.0], version=2)  # 1 behind
    write_group(log, blobs, "ancestor", 0, [1.0, 0.0, 0.0, 0.0], version=1)  # 2 behind
    write_group(log, blobs, "dead", 0, [1.0, 0.0, 0.0, 0.0], version=4)  # 2 + 1 behind
    core.poll()
    steps = [core.take_step() for _ in range(3)]
    assert sorted(st.min_version for st in steps if st is not None) == [1, 2]
    _, drops, _ = settled(engine)
    assert drops == Counter({"stale": 4})


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


def test_rows_dropped_as_stale_do_not_count_as_the_queue_draining(
    log: DurableLog, tmp_path: Path
) -> None:
    """Issue 44: admission reads how many rows leave the queue per version. Rows dropped as
    stale left it, but only because they waited too long: counted, a queue that drops rows
    looks like one that drains fast, and admission opens more groups, which go stale in
    turn. v0 at t=0, a step of 8 rows handed, a group of 4 stale (tagged v0, bound 0 at v1)
    and one without signal dropped, v1 at t=10: 8 + 4 = 12 rows left per version, not 16."""
    blobs = BlobStore(tmp_path / "blobs")
    core = CuratorCore(log, blobs, settings(groups_per_step=2, max_staleness=1))
    core.set_version(0, now=0.0)
    write_group(log, blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    write_group(log, blobs, "b", 0, [1.0, 0.0, 0.0, 0.0])
    write_group(log, blobs, "flat", 0, [0.0, 0.0, 0.0, 0.0])
    core.poll(now=0.0)
    assert core.take_step() is not None
    write_group(log, blobs, "late", 0, [1.0, 0.0, 0.0, 0.0], version=0)
    core.set_version(2, now=5.0)  # the bound moves to v1: "late" (v0) is stale in the log
    core.poll(now=5.0)
    assert core.metrics.dropped == Counter({"no_signal": 4, "stale": 4})
    core.set_version(3, now=10.0)
    # marks at v0 (0 left), v2 (12 left), v3 (12 left): (12 - 0) / (3 - 0) = 4 per version;
    # counting the stale rows would have made it (16 - 0) / 3
    assert core.pace(available=0, now=10.0).rows_per_version == 4.0
