"""The Curator actor on a real local Ray, over a real SQLite log and Parquet blobs."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow as pa
import pytest
import ray
import sqlalchemy as sa

from actors.curator import Curator
from dart_ray.config import load_config
from dart_ray.records import SAMPLE_SCHEMA
from dart_ray.store import open_store
from dart_ray.store.db import RowState, dataset_usage_events
from tests.data.curator_support import write_group

pytestmark = pytest.mark.usefixtures("ray_local")


def setup(tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    cfg = load_config(None, [f"run.root_dir={tmp_path}", "curation.group_size=4", *overrides])
    return cfg, open_store(cfg, init=True)


def test_ranks_get_shards_of_one_step_and_ack_consumes(tmp_path: Path) -> None:
    cfg, store = setup(tmp_path, "curation.groups_per_step=2")
    cur = Curator.remote(cfg, "run-a", 2, 0.05)  # type: ignore[attr-defined]
    # rank 0 asks before anything is logged: it waits, then times out with None
    assert ray.get(cur.get_shard.remote(1, 0, 0, timeout_s=0.3)) is None
    pending = cur.get_shard.remote(1, 0, 1, timeout_s=60)  # waits until step 0 exists
    write_group(store.log, store.blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    write_group(store.log, store.blobs, "b", 0, [1.0, 1.0, 0.0, 0.0])
    shard1, info1 = ray.get(pending)
    shard0, info0 = ray.get(cur.get_shard.remote(1, 0, 0, timeout_s=60))
    assert info0 == info1 and info0.num_groups == 2 and info0.num_rows == 8
    assert shard0.schema.equals(SAMPLE_SCHEMA) and isinstance(shard1, pa.RecordBatch)
    assert shard0.num_rows + shard1.num_rows == info0.num_samples == 16
    ids0 = set(shard0.column("trajectory_id").to_pylist())
    ids1 = set(shard1.column("trajectory_id").to_pylist())
    assert ids0 | ids1 == {f"{g}#0/{i}" for g in "ab" for i in range(4)}
    assert store.log.buffer("run-a") == {(0, RowState.CLAIMED): 8}  # not yet trained
    assert ray.get(cur.ack_step.remote(1, 0)) == 8
    assert store.log.buffer("run-a") == {(0, RowState.CONSUMED): 8}
    m = ray.get(cur.metrics.remote())
    assert m["steps_acked"] == 1 and m["rows_trained"] == 8
    assert ray.get(cur.shutdown.remote()) == 0
    ray.kill(cur)
    store.dispose()


def test_a_new_trainer_session_gets_the_old_sessions_unacked_rows(tmp_path: Path) -> None:
    cfg, store = setup(tmp_path, "curation.groups_per_step=1")
    write_group(store.log, store.blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    cur = Curator.remote(cfg, "run-a", 1, 0.05)  # type: ignore[attr-defined]
    _, old = ray.get(cur.get_shard.remote(10, 0, 0, timeout_s=60))
    # the trainer of session 10 dies before acknowledging; session 11 starts over at step 0
    shard, new = ray.get(cur.get_shard.remote(11, 0, 0, timeout_s=60))
    assert shard.num_rows == 8 and new.num_rows == 4
    assert {c.claim_id for c in new.claims}.isdisjoint({c.claim_id for c in old.claims})
    with pytest.raises(ray.exceptions.RayTaskError, match="superseded"):
        ray.get(cur.get_shard.remote(10, 1, 0, timeout_s=1))  # the old session is refused
    for c in new.claims:
        store.log.ack(c)
    ray.get(cur.forget_steps.remote(11, [0]))
    ev = dataset_usage_events.c
    with store.engine.connect() as c:
        kinds = Counter(c.scalars(sa.select(ev.event_type)))
    # each of the 4 rows: inserted, claimed twice, released once, acknowledged once
    assert kinds == Counter({"INSERT": 4, "CLAIM": 8, "RELEASE": 4, "ACK": 4})
    assert ray.get(cur.metrics.remote())["released_rows"] == 4
    ray.kill(cur)
    store.dispose()


def _kill_and_wait(actor: object) -> None:
    """SIGKILL the actor's process and wait until it is gone: `ray.kill` is asynchronous, and
    a call made right after it could still be answered by the old process."""
    import os

    pid = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))  # type: ignore[attr-defined]
    proc = psutil.Process(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_killed_curator_restarts_and_nothing_is_handed_out_twice(tmp_path: Path) -> None:
    cfg, store = setup(tmp_path, "curation.groups_per_step=1", "curation.lease_s=1")
    write_group(store.log, store.blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    cur = Curator.remote(cfg, "run-a", 1, 0.05)  # type: ignore[attr-defined]
    write_group(store.log, store.blobs, "b", 0, [1.0, 0.0, 0.0, 0.0])
    shard, first = ray.get(cur.get_shard.remote(1, 0, 0, timeout_s=60))
    assert shard.num_rows == 8
    _kill_and_wait(cur)  # the actor restarts (max_restarts=-1) with empty state
    # Step 0 is still being trained; the trainer acks it straight into the log, which works
    # although the curator that handed it out is gone.
    for claim in first.claims:
        store.log.ack(claim)
    # The restarted curator hands out the other group (the first is consumed), and after the
    # 1 s lease it also finds the rows its previous life held but never handed out.
    shard, second = ray.get(cur.get_shard.remote(1, 1, 0, timeout_s=60))
    assert {c.claim_id for c in second.claims}.isdisjoint({c.claim_id for c in first.claims})
    assert ray.get(cur.ack_step.remote(1, 1)) == 4
    assert ray.get(cur.ack_step.remote(1, 0)) == 0  # unknown to the new life: nothing acked twice
    assert store.log.buffer("run-a") == {(0, RowState.CONSUMED): 8}
    ray.kill(cur)
    store.dispose()


def test_shutdown_during_a_poll_leaves_nothing_claimed(tmp_path: Path) -> None:
    """The poller's database work runs in a thread that cancelling the poller cannot stop:
    shutdown must wait for it, or the rows that poll claims after the release stay CLAIMED
    (seen at the end of a sync-mode run in CI)."""
    cfg, store = setup(tmp_path, "curation.groups_per_step=1")
    cur = Curator.remote(cfg, "run-a", 1, 0.05)  # type: ignore[attr-defined]

    def slow_polls(self_: object) -> None:
        core = self_.core  # type: ignore[attr-defined]
        poll = core.poll

        def slow(now: float | None = None) -> int:
            time.sleep(1.0)
            return poll(now)

        core.poll = slow

    ray.get(cur.__ray_call__.remote(slow_polls))  # type: ignore[attr-defined]
    ray.get(cur.start.remote())
    write_group(store.log, store.blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    time.sleep(1.5)  # a poll is inside its 1 s sleep now, in its worker thread
    ray.get(cur.shutdown.remote())
    time.sleep(1.5)  # had shutdown not waited, that poll has claimed by now
    assert RowState.CLAIMED not in {state for _, state in store.log.buffer("run-a")}
    ray.kill(cur)
    store.dispose()


def test_metrics_never_miss_rows_a_poll_has_claimed(tmp_path: Path) -> None:
    """A poll claims rows in the log, then reads their blobs. Metrics read in between said
    `held_rows == 0` while the log said the rows were claimed: the sync driver took that for
    "nothing is forming" and rolled out a second group with the same weights (CI's sync-mode
    step without on-policy samples). Metrics wait for the poll in progress."""
    cfg, store = setup(tmp_path, "curation.groups_per_step=1")
    cur = Curator.remote(cfg, "run-a", 1, 0.05)  # type: ignore[attr-defined]

    def slow_blobs(self_: object) -> None:
        blobs = self_.core.blobs  # type: ignore[attr-defined]
        read = blobs.read

        def slow(uri: str):  # type: ignore[no-untyped-def]
            time.sleep(0.5)
            return read(uri)

        blobs.read = slow

    ray.get(cur.__ray_call__.remote(slow_blobs))  # type: ignore[attr-defined]
    write_group(store.log, store.blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    ray.get(cur.start.remote())
    deadline = time.monotonic() + 10
    while RowState.CLAIMED not in {s for _, s in store.log.buffer("run-a")}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    m = ray.get(cur.metrics.remote())  # the poll is reading the claimed rows' blobs
    assert m["held_rows"] + m["queue_depth"] > 0, m
    ray.get(cur.shutdown.remote())
    ray.kill(cur)
    store.dispose()


def test_a_restarted_curator_judges_staleness_against_the_published_version(
    tmp_path: Path,
) -> None:
    """The run has published up to version 5 (bound 2). Ray restarts the curator; before any
    trainer speaks to it, its first step must not be the version-0 rows. Before, the actor
    started at version 0 (bound -2) and handed the oldest rows out first."""
    cfg, store = setup(tmp_path, "curation.groups_per_step=1", "curation.max_staleness=2")
    for v in range(1, 6):
        cid = store.checkpoints.create("run-a", v)
        store.checkpoints.start(cid)
        store.checkpoints.complete(cid)
    cur = Curator.remote(cfg, "run-a", 1, 0.05)  # type: ignore[attr-defined]
    ray.get(cur.metrics.remote())
    ray.kill(cur, no_restart=False)  # Ray restarts it: its constructor runs again
    write_group(store.log, store.blobs, "old", 0, [1.0, 0.0, 0.0, 0.0], version=0)
    write_group(store.log, store.blobs, "new", 0, [1.0, 0.0, 0.0, 0.0], version=5)
    shard, info = ray.get(cur.get_shard.remote(1, 0, 0, timeout_s=60))
    assert set(shard.column("weight_version").to_pylist()) == {5} and info.num_rows == 4
    assert ray.get(cur.metrics.remote())["dropped"] == {"stale": 4}
    ray.kill(cur)
    store.dispose()


def test_the_pace_counts_rows_logged_since_the_last_poll(tmp_path: Path) -> None:
    """Admission reads the queue from `pace()`; rows logged after a poll are waiting all the
    same. Before, it read the count the last poll left (refreshed every 2 s at best), and a
    rollouter finishing groups faster than that saw a short queue and overfilled it."""
    cfg, store = setup(tmp_path, "curation.groups_per_step=1")
    cur = Curator.remote(cfg, "run-a", 1, 30.0)  # type: ignore[attr-defined]
    assert ray.get(cur.pace.remote()).waiting_rows == 0  # starts the poller: one poll, then 30 s
    ray.get(cur.metrics.remote())  # that poll is over (it holds the lock metrics waits for)
    write_group(store.log, store.blobs, "a", 0, [1.0, 0.0, 0.0, 0.0])
    assert ray.get(cur.pace.remote()).waiting_rows == 4
    ray.kill(cur)
    store.dispose()


def test_settle_claims_a_round_larger_than_the_held_row_bound(tmp_path: Path) -> None:
    """The synchronous baseline's `settle` trains every row its round logged. The claim was
    bounded by `curation.max_held_rows` (the decoupled run's memory bound): a dynamic round
    that logged more rows than the bound (its sessions sample until a step's groups have
    signal, then the episodes in flight finish) could never be flushed, and `make test`'s
    sync-dynamic run waited in `settle` until pytest's timeout."""
    cfg, store = setup(
        tmp_path, "run.mode=sync", "curation.groups_per_step=1", "curation.max_held_rows=4"
    )
    for task in "abc":
        write_group(store.log, store.blobs, task, 0, [1.0, 0.0, 0.0, 0.0])
    cur = Curator.remote(cfg, "run-a", 1, 0.05)  # type: ignore[attr-defined]
    assert ray.get(cur.settle.remote(timeout_s=10)) == 1
    shard, info = ray.get(cur.get_shard.remote(1, 0, 0, timeout_s=60))
    assert info.num_groups == 3 and info.num_rows == 12 and shard.num_rows == info.num_samples
    ray.kill(cur)
    store.dispose()


def test_metrics_of_a_curator_that_quarantined_rows_are_plain_counts(tmp_path: Path) -> None:
    """A group whose curation raises (a step without response tokens) is quarantined, and the
    actor's metrics say so by reason. Before, `metrics()` passed the core's Counter through
    `asdict`, which rebuilt it from its (reason, count) pairs: {("curation", 4): 1}, and the
    run's report.json failed to write at the end of the seeded fault schedule."""
    from dataclasses import replace

    from tests.factories import make_trajectory

    cfg, store = setup(tmp_path, "curation.groups_per_step=1")
    items = []
    for i in range(4):
        t = make_trajectory(
            f"poison#0/{i}", task_id="poison", reward=float(i % 2), group_id="poison#0",
            group_size=4,
        )  # fmt: skip
        if i == 0:
            bad = replace(t.steps[0], response_ids=(), behaviour_logprobs=(), entropy=())
            t = replace(t, steps=(bad, *t.steps[1:]))
        items.append((t, store.blobs.write(t)))
    store.log.append_many(items)
    write_group(store.log, store.blobs, "good", 0, [1.0, 0.0, 0.0, 0.0])
    cur = Curator.remote(cfg, "run-a", 1, 0.05)  # type: ignore[attr-defined]
    shard, _ = ray.get(cur.get_shard.remote(1, 0, 0, timeout_s=60))
    assert set(shard.column("trajectory_id").to_pylist()) <= {f"good#0/{i}" for i in range(4)}
    m = ray.get(cur.metrics.remote())
    assert m["quarantined"] == {"curation": 4}
    assert json.loads(json.dumps(m))["quarantined"] == {"curation": 4}  # report.json's way
    ray.kill(cur)
    store.dispose()
