"""The durable log on SQLite and on real MariaDB: appends, exactly-once claims, leases."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.records import Status
from dart_ray.store.db import RowState, rollout_run
from dart_ray.store.log import Claim, ClaimRaceError, DurableLog, LeaseLostError, db_now
from tests.factories import make_trajectory
from tests.store.log_support import all_row_ids, events, fill, log_module_cols, stored_rows

REPO = Path(__file__).resolve().parents[2]


def test_append_is_idempotent(log: DurableLog, engine: Engine) -> None:
    t = make_trajectory("t1", reward=1.0)
    assert log.append(t, "/b/t1") is True
    assert log.append(t, "/b/t1") is False
    assert log.append_many([(t, "/b/t1"), (t, "/b/t1")]) == 0
    assert len(all_row_ids(engine)) == 1
    assert sum(events(engine, "INSERT").values()) == 1
    [stats] = log.task_stats("run-a")
    assert (stats.attempts, stats.successes) == (1, 1)  # counted once, not three times


def test_task_stats_follow_appends(log: DurableLog) -> None:
    log.append_many(
        [
            (make_trajectory("a", reward=1.0, n_steps=3, version=2), "/b/a"),
            (make_trajectory("b", reward=0.0), "/b/b"),
            (make_trajectory("c", reward=1.0, n_steps=5, version=4), "/b/c"),
            (make_trajectory("d", status=Status.ENV_ERROR, n_steps=0), "/b/d"),
            (make_trajectory("e", task_id="other", reward=0.0), "/b/e"),
        ]
    )
    log.append(make_trajectory("f", reward=0.0, n_steps=1), "/b/f")
    by_task = {s.task_id: s for s in log.task_stats("run-a")}
    s = by_task["task-0"]
    # 4 trainable attempts (a, b, c, f); 2 successes with 3 + 5 steps; d is an env failure.
    assert (s.attempts, s.successes, s.failures_env) == (4, 2, 1)
    assert (s.success_steps_total, s.success_steps_max) == (8, 5)
    assert s.success_rate == pytest.approx(0.5)
    # the newest success stays the replay candidate after a later failure (f)
    assert (s.last_success_trajectory_id, s.last_success_uri, s.last_success_version) == (
        "c",
        "/b/c",
        4,
    )
    assert (by_task["other"].attempts, by_task["other"].successes) == (1, 0)
    # one task's row alone, what a rollouter reads per visit
    assert (
        log.task_stat("run-a", "task-0") == s
        and log.task_stat("run-a", "other") == by_task["other"]
    )
    assert (
        log.task_stat("run-a", "never-tried") is None and log.task_stat("run-b", "task-0") is None
    )
    assert log.recent_outcomes("run-a", "task-0", 2) == [0.0, 1.0]  # f, then c


def test_claim_marks_rows_and_ack_consumes(log: DurableLog, engine: Engine) -> None:
    fill(log, 10)
    claim = log.claim("run-a", 4, consumer="c1", lease_s=60)
    assert len(claim) == 4
    assert [r.trajectory_id for r in claim.rows] == ["t0", "t1", "t2", "t3"]  # oldest first
    again = log.claim("run-a", 10, consumer="c2", lease_s=60)
    assert set(again.row_ids).isdisjoint(claim.row_ids) and len(again) == 6
    assert log.ack(claim) == 4
    assert log.ack(claim) == 0  # a retried ack is a no-op, not a second use
    buf = log.buffer("run-a")
    assert buf == {(0, RowState.CONSUMED): 4, (0, RowState.CLAIMED): 6}
    assert events(engine, "ACK") == Counter({i: 1 for i in claim.row_ids})
    with engine.connect() as c:
        used = c.scalars(sa.select(rollout_run.c.used).where(rollout_run.c.id.in_(claim.row_ids)))
        assert set(used) == {1}


def test_claim_with_same_id_returns_the_same_rows(log: DurableLog) -> None:
    fill(log, 6)
    first = log.claim("run-a", 3, consumer="c", lease_s=60, claim_id="fixed-claim")
    retry = log.claim("run-a", 3, consumer="c", lease_s=60, claim_id="fixed-claim")
    assert retry.row_ids == first.row_ids


def test_min_version_and_drop_stale(log: DurableLog, engine: Engine) -> None:
    fill(log, 3, version=1)
    log.append_many([(make_trajectory(f"n{i}", version=5), f"/b/n{i}") for i in range(3)])
    fresh = log.claim("run-a", 10, consumer="c", lease_s=60, min_version=4)
    assert {r.version_num for r in fresh.rows} == {5} and len(fresh) == 3
    assert log.drop_stale("run-a", min_version=4) == 3
    assert log.claim("run-a", 10, consumer="c", lease_s=60).rows == ()
    assert sum(events(engine, "DROP").values()) == 3
    with engine.connect() as c:
        reasons = set(
            c.scalars(
                sa.select(rollout_run.c.drop_reason).where(rollout_run.c.state == RowState.DROPPED)
            )
        )
    assert reasons == {"stale"}


def test_drop_release_and_foreign_rows(log: DurableLog) -> None:
    fill(log, 6)
    claim = log.claim("run-a", 6, consumer="c", lease_s=60)
    ids = claim.row_ids
    assert log.drop(claim, ids[:2], reason="group_env_error") == 2
    assert log.release(claim, ids[2:4]) == 2
    assert log.ack(claim, ids[4:]) == 2
    with pytest.raises(ValueError, match="not in it"):
        log.ack(claim, [10_000])
    with pytest.raises(LeaseLostError):
        log.ack(claim, ids[2:4])  # released rows are no longer held by this claim
    back = log.claim("run-a", 6, consumer="c2", lease_s=60)
    assert back.row_ids == ids[2:4]


def test_threads_claim_every_row_exactly_once(log: DurableLog, engine: Engine) -> None:
    fill(log, 240)
    taken: list[list[int]] = []
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            while True:
                claim = log.claim("run-a", 7, consumer=f"thread-{k}", lease_s=120)
                if not claim.rows:
                    return
                log.ack(claim)
                taken.append(claim.row_ids)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    flat = [i for batch in taken for i in batch]
    assert len(flat) == len(set(flat)) == 240
    assert set(flat) == all_row_ids(engine)
    assert events(engine, "CLAIM") == Counter({i: 1 for i in flat})
    assert events(engine, "ACK") == Counter({i: 1 for i in flat})


def test_processes_claim_every_row_exactly_once(
    log: DurableLog, engine: Engine, db_url: str
) -> None:
    fill(log, 150)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.store.claimer", db_url, "run-a", "--n", "6"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    acked: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        acked += [int(x) for line in out.splitlines() for x in line.split()[1:]]
    assert len(acked) == len(set(acked)) == 150
    assert events(engine, "ACK") == Counter({i: 1 for i in all_row_ids(engine)})


def test_dead_claimer_rows_return_after_lease(log: DurableLog, engine: Engine, db_url: str) -> None:
    fill(log, 8)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.store.claimer",
            db_url,
            "run-a",
            "--n",
            "5",
            "--lease",
            "1",
            "--die",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out[0] == "CLAIM"
    dead_claim_id, dead_ids = out[1], [int(x) for x in out[2:]]
    # within the lease the rows stay with the dead claimer
    live = log.claim("run-a", 10, consumer="live", lease_s=60)
    assert set(live.row_ids).isdisjoint(dead_ids) and len(live) == 3
    log.ack(live)
    time.sleep(1.2)
    back = log.claim("run-a", 10, consumer="live", lease_s=60)
    assert sorted(back.row_ids) == sorted(dead_ids)
    log.ack(back)
    # a late ack from the dead claimer's claim is refused: nothing is trained twice
    ghost = Claim(dead_claim_id, "ghost", "run-a", back.rows, back.lease_expires_at)
    with pytest.raises(LeaseLostError):
        log.ack(ghost)
    assert events(engine, "EXPIRE") == Counter({i: 1 for i in dead_ids})
    assert events(engine, "ACK") == Counter({i: 1 for i in all_row_ids(engine)})


def test_renew_keeps_rows_past_the_lease(log: DurableLog) -> None:
    fill(log, 3)
    claim = log.claim("run-a", 3, consumer="c", lease_s=0.5)
    claim = log.renew(claim, lease_s=60)
    time.sleep(0.7)
    assert log.claim("run-a", 3, consumer="other", lease_s=60).rows == ()
    assert log.ack(claim) == 3


def test_a_late_ack_is_refused_before_any_sweep(log: DurableLog, engine: Engine) -> None:
    """The lease ran out but nothing has swept the rows back yet (no other claimer came):
    the holder's ack is still refused, so a row whose lease lapsed is never trained on the
    strength of it. Before, only the claim id and state were checked."""
    fill(log, 2)
    claim = log.claim("run-a", 2, consumer="slow", lease_s=0.3)
    time.sleep(0.5)
    with pytest.raises(LeaseLostError, match="no longer held"):
        log.ack(claim)
    with pytest.raises(LeaseLostError):
        log.renew(claim, lease_s=60)
    assert events(engine, "ACK") == Counter()
    assert log.release(claim) == 2  # giving them back is fine: that is where they go
    again = log.claim("run-a", 2, consumer="next", lease_s=60)
    assert log.ack(again) == 2


@pytest.mark.parametrize("skew_s", [-60, 60])
def test_leases_run_on_the_database_clock(
    log: DurableLog, engine: Engine, monkeypatch: pytest.MonkeyPatch, skew_s: int
) -> None:
    """A claimer whose clock is a minute off still holds its rows for exactly its lease, by
    the database's clock: a client 60 s slow used to write leases that had already run out,
    and one 60 s fast to keep rows 60 s too long."""
    import dart_ray.store.log as log_module

    real = log_module.utcnow
    monkeypatch.setattr(log_module, "utcnow", lambda: real() + timedelta(seconds=skew_s))
    fill(log, 4)
    claim = log.claim("run-a", 2, consumer="skewed", lease_s=30)
    with engine.connect() as c:
        server = db_now(c)
    expires = {r.lease_expires_at for r in stored_rows(engine, claim.row_ids)}
    assert len(expires) == 1
    assert abs(((expires.pop() - server).total_seconds()) - 30) < 5
    assert log.claim("run-a", 4, consumer="other", lease_s=30).row_ids == sorted(
        set(all_row_ids(engine)) - set(claim.row_ids)
    )  # the skewed claim's rows are not swept back early
    assert log.ack(claim) == 2


def test_a_claim_never_takes_rows_another_transaction_took(
    log: DurableLog, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the SELECT ever returned rows that are no longer available (a locking mode that
    does not hold), the claim rolls back instead of handing them out a second time."""
    fill(log, 3)
    first = log.claim("run-a", 2, consumer="first", lease_s=60)
    rr = rollout_run.c
    everything = sa.select(*log_module_cols()).where(rr.run_id == "run-a").order_by(rr.id)
    monkeypatch.setattr(log, "claim_query", lambda *a, **k: everything)
    with pytest.raises(ClaimRaceError, match="2 of 3 selected rows were taken"):
        log.claim("run-a", 3, consumer="second", lease_s=60)
    monkeypatch.undo()
    assert events(engine, "CLAIM") == Counter({i: 1 for i in first.row_ids})
    rest = log.claim("run-a", 3, consumer="second", lease_s=60)
    assert set(rest.row_ids).isdisjoint(first.row_ids) and len(rest) == 1


def test_episode_intervals_pair_each_start_with_its_logged_row(
    log: DurableLog, engine: Engine
) -> None:
    """The environment-utilisation timeline: an episode is busy from its start (written
    before its reset) until its row is logged; one still running has no interval yet."""
    from dart_ray.store.episodes import EpisodeLedger, EpisodeStart

    ledger = EpisodeLedger(engine)
    for tid in ("t0", "t1", "running"):
        ledger.start(EpisodeStart("run-a", tid, "task", "", 0, tid, "rollouter-0", 0))
    time.sleep(0.05)
    for tid in ("t0", "t1"):
        log.append(make_trajectory(tid, run_id="run-a"), f"/b/{tid}")
    got = log.episode_intervals("run-a")
    # to the microsecond: SQLite's default timestamp had whole seconds, which made every
    # episode up to a second longer on the timeline
    assert len(got) == 2 and all(0 < (b - a).total_seconds() < 0.5 for a, b in got), got
    assert log.episode_intervals("run-b") == []


def test_task_usage_counts_rollouts_trained_and_no_signal(log: DurableLog) -> None:
    # type-field: a group of 3 all fail (dropped no_signal) and an ABORTED retry;
    # click-button: a group of 2 with signal (trained) and one row still available
    log.append_many(
        [
            (make_trajectory(f"f{i}", task_id="minidesk/type-field/t1/0"), f"/b/f{i}")
            for i in range(3)
        ]
        + [
            (
                make_trajectory("fa", task_id="minidesk/type-field/t1/0", status=Status.ABORTED),
                "/b/fa",
            ),
            (make_trajectory("c0", task_id="minidesk/click-button/t1/4", reward=1.0), "/b/c0"),
            (make_trajectory("c1", task_id="minidesk/click-button/t1/4"), "/b/c1"),
            (make_trajectory("c2", task_id="minidesk/click-button/t2/5"), "/b/c2"),
        ]
    )
    claim = log.claim("run-a", 10, consumer="test", lease_s=60)
    ids = {r.trajectory_id: r.id for r in claim.rows}
    log.drop(claim, [ids["f0"], ids["f1"], ids["f2"]], "no_signal")
    log.drop(claim, [ids["fa"]], "aborted")
    log.ack(claim, [ids["c0"], ids["c1"]])
    log.release(claim, [ids["c2"]])
    assert log.task_usage("run-a") == {
        "minidesk/type-field/t1/0": (4, 0, 3),
        "minidesk/click-button/t1/4": (2, 2, 0),
        "minidesk/click-button/t2/5": (1, 0, 0),
    }
    assert log.task_usage("run-other") == {}


def test_recent_group_rows_give_the_no_signal_streak(log: DurableLog) -> None:
    from dart_ray.algo.curriculum import group_kinds, no_signal_streak

    def group(gid: str, rewards: list[float], size: int = 2) -> None:
        log.append_many(
            [
                (make_trajectory(f"{gid}-{i}", reward=r, group_id=gid, group_size=size), f"/{i}")
                for i, r in enumerate(rewards)
            ]
        )

    group("g0", [1.0, 0.0])  # signal
    group("g1", [0.0, 0.0])  # three all-fail groups after it
    group("g2", [0.0, 0.0])
    group("g3", [0.0, 0.0])
    group("g4", [0.0], size=2)  # still filling
    rows = log.recent_group_rows("run-a", "task-0", 9)  # every row, newest first
    assert [r.group_id for r in rows] == ["g4", "g3", "g3", "g2", "g2", "g1", "g1", "g0", "g0"]
    assert (rows[0].group_size, rows[0].reward, rows[0].status) == (2, 0.0, Status.OK)
    kinds = group_kinds(rows, threshold=1.0)
    assert kinds == ["open", "failed", "failed", "failed", "signal"]
    assert no_signal_streak(kinds) == 3
    # a window that cuts g1 in half: g1 reads as open, so the streak is 2 (never more)
    cut = log.recent_group_rows("run-a", "task-0", 6)
    assert no_signal_streak(group_kinds(cut, threshold=1.0)) == 2
