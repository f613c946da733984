"""The curator and staleness against the real log (SQLite and MariaDB): no row older than the
bound reaches a gradient wherever it waited, distance through the version tree, the pace."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
from sqlalchemy.engine import Engine

from dart_ray.data.curation import CurationParams
from dart_ray.data.curator import CuratorCore
from dart_ray.store.blobs import BlobStore
from dart_ray.store.checkpoints import CheckpointRegistry
from dart_ray.store.db import RowState
from dart_ray.store.log import DurableLog
from tests.data.curator_support import settings, settled, write_group
from tests.factories import make_trajectory


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
