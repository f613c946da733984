"""`dart-ray audit`: each check fires on the breach it is for and stays quiet on a clean run
(SQLite and MariaDB), and the CLI exits non-zero on a breach."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.cli import main
from dart_ray.store import BlobStore, CheckpointRegistry, DurableLog, EpisodeLedger, EpisodeStart
from dart_ray.store.audit import audit
from dart_ray.store.db import RetryPolicy, dataset_usage_events, rollout_run
from dart_ray.store.episodes import log_unfinished
from dart_ray.store.runs import register_run
from tests.factories import make_trajectory

RUN = "run-a"


class _Store:
    """What `log_unfinished` needs of a Store."""

    def __init__(self, engine: Engine, tmp: Path) -> None:
        self.engine = engine
        self.log = DurableLog(engine, success_threshold=1.0)
        self.blobs = BlobStore(str(tmp / "blobs"))
        self.episodes = EpisodeLedger(engine, RetryPolicy())
        self.checkpoints = CheckpointRegistry(engine, RetryPolicy())


def _start(store: _Store, tid: str) -> None:
    store.episodes.start(EpisodeStart(RUN, tid, "task-0", "g", 2, tid, "rollouter-0", 0))


def _clean_run(store: _Store, tmp: Path) -> None:
    """Two episodes started and logged; one trained into durable v1, one dropped."""
    for tid in ("t1", "t2"):
        _start(store, tid)
        store.log.append(make_trajectory(tid), store.blobs.write(make_trajectory(tid)))
    claim = store.log.claim(RUN, 10, consumer="c", lease_s=60)
    cid = store.checkpoints.create(RUN, 1, source="train")
    store.checkpoints.start(cid)
    (tmp / "v1").mkdir()
    store.checkpoints.complete(cid, str(tmp / "v1"))
    t1 = [r.id for r in claim.rows if r.trajectory_id == "t1"]
    t2 = [r.id for r in claim.rows if r.trajectory_id == "t2"]
    store.log.ack(claim, t1, in_version=1)
    store.log.drop(claim, t2, "no_signal")


def test_a_clean_run_passes(engine: Engine, tmp_path: Path) -> None:
    store = _Store(engine, tmp_path)
    _clean_run(store, tmp_path)
    r = audit(engine, RUN)
    assert r.ok, r.breaches
    assert r.episodes_started == 2 and r.trajectories == {"OK": 2}
    assert r.states == {"consumed": 1, "dropped": 1} and r.drops == {"no_signal": 1}
    assert r.versions == [1] and r.acks == 1


def test_a_lost_episode_is_a_breach_until_logged_as_aborted(engine: Engine, tmp_path: Path) -> None:
    store = _Store(engine, tmp_path)
    _clean_run(store, tmp_path)
    _start(store, "t3")  # started, then its rollouter died
    assert audit(engine, RUN, live=True).ok
    r = audit(engine, RUN)
    assert not r.ok and "t3" in r.breaches[0]
    assert log_unfinished(store, RUN, "rollouter died", rollouter="rollouter-1") == []
    assert log_unfinished(store, RUN, "rollouter died", rollouter="rollouter-0") == ["t3"]
    r = audit(engine, RUN)
    assert r.ok and r.trajectories == {"OK": 2, "ABORTED": 1}


def test_double_training_lost_acks_and_undurable_acks_are_breaches(
    engine: Engine, tmp_path: Path
) -> None:
    store = _Store(engine, tmp_path)
    _clean_run(store, tmp_path)
    with engine.begin() as c:
        row = c.execute(sa.select(rollout_run.c.id).where(rollout_run.c.trajectory_id == "t1"))
        rid = row.scalar_one()
        # a second ACK of the same row, naming a checkpoint that does not exist
        c.execute(
            dataset_usage_events.insert().values(
                run_id=RUN, trajectory_id="t1", row_id=rid, event_type="ACK", reason="v7"
            )
        )
    r = audit(engine, RUN)
    assert any("more than once" in b for b in r.breaches)
    assert any("without a durable COMPLETED checkpoint" in b for b in r.breaches)
    with engine.begin() as c:  # the acknowledged row went back to the pool: lost
        c.execute(rollout_run.update().where(rollout_run.c.id == rid).values(state=0))
    assert any("acknowledged data lost" in b for b in audit(engine, RUN).breaches)


def test_versions_must_only_go_up(engine: Engine, tmp_path: Path) -> None:
    store = _Store(engine, tmp_path)
    _clean_run(store, tmp_path)
    with engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO checkpoint (name, version, version_num, run_id, status) "
                "VALUES ('x', 'v0', 0, :r, 'COMPLETED')"
            ),
            {"r": RUN},
        )
    assert any("only go up" in b for b in audit(engine, RUN).breaches)


def test_cli_exits_non_zero_on_a_breach(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from dart_ray.store.db import create_engine, init_schema

    engine = create_engine(f"sqlite:///{tmp_path / 'dart-ray.sqlite'}")
    init_schema(engine)
    register_run(engine, RUN, "test", {})
    store = _Store(engine, tmp_path)
    _clean_run(store, tmp_path)
    args = ["audit", RUN, f"run.root_dir={tmp_path}"]
    assert main(args) == 0
    assert "audit of run run-a: OK" in capsys.readouterr().out
    _start(store, "t9")
    assert main(args) == 1
    assert "BREACH: episodes started but never logged: t9" in capsys.readouterr().out
    assert main([*args, "--live"]) == 0
    assert main(["audit", "no-such-run", f"run.root_dir={tmp_path}"]) == 2
    engine.dispose()


def test_the_audit_reads_one_moment_of_a_live_run(engine: Engine, tmp_path: Path) -> None:
    """The live audit joins several queries; under MariaDB's READ COMMITTED a row acked
    between two of them read as "acknowledged but not CONSUMED" (a false breach seen in the
    fault suite). Inside `snapshot` a commit made meanwhile is not seen."""
    import pytest

    from dart_ray.store.db import snapshot

    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite's BEGIN IMMEDIATE excludes writers for the whole read already")
    store = _Store(engine, tmp_path)
    register_run(engine, RUN, "audit", {})
    store.log.append(make_trajectory("t1"), "/b/t1")
    claim = store.log.claim(RUN, 10, consumer="c", lease_s=60)
    rr = rollout_run.c
    with snapshot(engine) as c:
        states = list(c.scalars(sa.select(rr.state).where(rr.run_id == RUN)))
        store.log.ack(claim)  # another connection commits the ack meanwhile
        acks = c.scalar(
            sa.select(sa.func.count()).where(
                dataset_usage_events.c.run_id == RUN, dataset_usage_events.c.event_type == "ACK"
            )
        )
    assert states == [1] and acks == 0  # claimed, and not yet acknowledged: one moment
    assert audit(engine, RUN, live=True).acks == 1  # a fresh read sees the ack


def _durable(store: _Store, tmp: Path, version: int, rows: list[int]) -> None:
    """A COMPLETED checkpoint with files whose trainer_state.json records its lineage."""
    import json

    cid = store.checkpoints.create(RUN, version, source="train")
    store.checkpoints.start(cid)
    d = tmp / f"v{version}"
    d.mkdir()
    (d / "trainer_state.json").write_text(
        json.dumps({"step": version, "version": version, "rows": rows})
    )
    store.checkpoints.complete(cid, str(d))


def test_a_crash_between_checkpoint_and_acks_trains_nothing_twice(
    engine: Engine, tmp_path: Path
) -> None:
    """The trainer completed durable v1 (its lineage: both rows) and died before acking them.
    Their lease lapses and they go back to the pool. The resume settles them from v1's
    lineage, so the next trainer cannot claim them again; without it they are trained into
    v2 as well, and the audit names them."""
    from dart_ray.train.resume import settle_lineage

    store = _Store(engine, tmp_path)
    for tid in ("t1", "t2"):
        store.log.append(make_trajectory(tid), store.blobs.write(make_trajectory(tid)))
    claim = store.log.claim(RUN, 10, consumer="trainer", lease_s=0.2)
    _durable(store, tmp_path, 1, claim.row_ids)
    import time

    time.sleep(0.3)  # the trainer is gone; its lease lapses

    # without the repair: the rows come back and are trained into v2 too -> a breach
    again = store.log.claim(RUN, 10, consumer="next", lease_s=60)
    assert sorted(again.row_ids) == sorted(claim.row_ids)
    store.log.release(again)
    twin = tmp_path / "twin"
    twin.mkdir()
    _durable(_Store(engine, twin), twin, 2, claim.row_ids)
    bad = audit(engine, RUN)
    assert any("lineage of two durable checkpoints" in b for b in bad.breaches), bad.breaches

    # the repair a resume runs first: v1's rows are consumed, once, and nothing is claimable
    assert settle_lineage(store, RUN, str(tmp_path / "v1")) == 2  # type: ignore[arg-type]
    assert settle_lineage(store, RUN, str(tmp_path / "v1")) == 0  # type: ignore[arg-type]
    assert store.log.claim(RUN, 10, consumer="next", lease_s=60).rows == ()
    with engine.connect() as c:
        acks = c.execute(
            sa.select(dataset_usage_events.c.row_id, dataset_usage_events.c.reason).where(
                dataset_usage_events.c.event_type == "ACK"
            )
        ).all()
    assert sorted(a.row_id for a in acks) == sorted(claim.row_ids)
    assert {a.reason for a in acks} == {"v1"}


def test_a_row_trained_beyond_the_bound_is_a_breach_discarded_ones_by_distance(
    engine: Engine, tmp_path: Path
) -> None:
    """The run's bound is 3 (its config snapshot); a resume from v2 discarded v3's weights
    and v4 carried v2's on. Durable v6's lineage says v6 trained each row: a version-5 row is
    1 behind; a version-0 row (2 - 0) + (6 - 4) = 4 through the version tree (beyond the
    bound; its tag says 6); the version-3 row, tagged 3 behind, is (3 - 2) + (6 - 4) = 3
    behind through the version tree (within it)."""
    import json

    from dart_ray.store.runs import register_run

    store = _Store(engine, tmp_path)
    register_run(engine, RUN, "t", {"curation": {"max_staleness": 3}})
    for tid, v in (("fresh", 5), ("old", 0), ("branch", 3)):
        t = make_trajectory(tid, version=v)
        store.log.append(t, store.blobs.write(t))
    claim = store.log.claim(RUN, 10, consumer="c", lease_s=60)
    ids = {r.trajectory_id: r.id for r in claim.rows}
    store.checkpoints.create(RUN, 3)
    assert store.checkpoints.discard_above(RUN, 2, "resumed from v2") == [3]
    for v in (4, 5):
        store.checkpoints.create(RUN, v)
    cid = store.checkpoints.create(RUN, 6)
    store.checkpoints.start(cid)
    d = tmp_path / "v6"
    d.mkdir()
    rows = sorted(ids.values())
    state = {"step": 1, "version": 6, "rows": rows, "trained_at": {"6": rows}}
    (d / "trainer_state.json").write_text(json.dumps(state))
    store.checkpoints.complete(cid, str(d))
    store.log.ack(claim, in_version=6)
    r = audit(engine, RUN)
    assert r.max_staleness == 3 and r.trained_lags == {1: 1, 3: 1, 4: 1}
    assert r.breaches == [f"rows trained beyond the staleness bound (3): {ids['old']} (1)"]


def test_quarantined_rows_are_accounted_for_with_their_reason(
    engine: Engine, tmp_path: Path
) -> None:
    """Bad data settled QUARANTINED is no breach and is counted by where it broke; one
    without a reason is a breach (settled rows always say why)."""
    store = _Store(engine, tmp_path)
    _clean_run(store, tmp_path)
    for tid in ("t3", "t4"):
        _start(store, tid)
        store.log.append(make_trajectory(tid), store.blobs.write(make_trajectory(tid)))
    claim = store.log.claim(RUN, 10, consumer="c", lease_s=60)
    store.log.quarantine(claim, claim.row_ids, "curation: KeyError: 'x'" + "!" * 100)
    r = audit(engine, RUN)
    assert r.ok, r.breaches
    assert r.states["quarantined"] == 2 and r.quarantined == {"curation": 2}
    with engine.begin() as c:
        c.execute(
            rollout_run.update().where(rollout_run.c.trajectory_id == "t4").values(drop_reason=None)
        )
    r = audit(engine, RUN)
    assert not r.ok and "without a reason" in r.breaches[0]


def test_a_row_beyond_the_bound_stays_a_breach_after_a_later_resume(
    engine: Engine, tmp_path: Path
) -> None:
    """Bound 3. Durable v5 trained a version-0 row (5 behind: a breach). Later a resume from v6
    discarded v7 and v8 and published v6's weights again as v9. The row trained before that
    resume: its lag is 5 still. Before, the audit moved it by the later block (0 -> 3) and
    read 2 behind: the seeded fault schedule's audit counted rows -14 to -1 behind, and a
    breach before any resume could pass unseen."""
    import json

    store = _Store(engine, tmp_path)
    register_run(engine, RUN, "t", {"curation": {"max_staleness": 3}})
    t = make_trajectory("old", version=0)
    store.log.append(t, store.blobs.write(t))
    claim = store.log.claim(RUN, 10, consumer="c", lease_s=60)
    rid = claim.rows[0].id
    for v in range(1, 5):
        store.checkpoints.create(RUN, v)
    cid = store.checkpoints.create(RUN, 5)
    store.checkpoints.start(cid)
    d = tmp_path / "v5"
    d.mkdir()
    state = {"step": 1, "version": 5, "rows": [rid], "trained_at": {"5": [rid]}}
    (d / "trainer_state.json").write_text(json.dumps(state))
    store.checkpoints.complete(cid, str(d))
    store.log.ack(claim, in_version=5)
    for v in (6, 7, 8):
        store.checkpoints.create(RUN, v)
    assert store.checkpoints.discard_above(RUN, 6, "resumed from v6") == [7, 8]
    store.checkpoints.create(RUN, 9)
    r = audit(engine, RUN)
    assert r.trained_lags == {5: 1}
    assert r.breaches == [f"rows trained beyond the staleness bound (3): {rid} (1)"]
