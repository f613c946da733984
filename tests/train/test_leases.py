"""The trainer keeps the leases of trained-but-not-durable rows alive while it waits for data
(SQLite and MariaDB): with save_every > 1 the rows wait several steps for their ack."""

from __future__ import annotations

import time

import pytest

from dart_ray.store.log import DurableLog, LeaseLostError
from dart_ray.train.leases import LeaseKeeper
from tests.factories import make_trajectory


def test_heartbeat_keeps_held_rows_through_a_long_wait(log: DurableLog) -> None:
    """Leases of 0.6 s, a trainer that waits 2 s for its next shard (heartbeat every 0.1 s
    from the wait loop): the rows are never swept back, and the late ack succeeds. Before,
    leases were renewed only after an optimizer step, so a wait longer than the lease lost
    the rows to the pool and they were trained a second time."""
    log.append_many([(make_trajectory(f"t{i}", run_id="r"), f"/b/{i}") for i in range(4)])
    claim = log.claim("r", 4, consumer="curator", lease_s=0.6)
    keeper = LeaseKeeper(log, lease_s=0.6)
    keeper.hold(0, (claim,))
    t0 = time.monotonic()
    renewals = 0
    while time.monotonic() - t0 < 2.0:
        renewals += keeper.heartbeat()
        assert log.claim("r", 4, consumer="thief", lease_s=60).rows == ()  # sweeps, finds none
        time.sleep(0.1)
    assert renewals >= 5
    (held,) = keeper.held[0]
    assert log.ack(held) == 4
    keeper.clear()
    assert keeper.held == {}


def test_heartbeat_is_quiet_until_a_third_of_the_lease_passed(log: DurableLog) -> None:
    now = [0.0]
    keeper = LeaseKeeper(log, lease_s=30, clock=lambda: now[0])
    now[0] = 9.9
    assert keeper.heartbeat() is False
    now[0] = 10.1
    assert keeper.heartbeat() is True  # nothing held: renews nothing, restarts the period
    now[0] = 15.0
    assert keeper.heartbeat() is False


def test_a_step_whose_rows_are_no_longer_held_is_not_taken(log: DurableLog) -> None:
    """A resume settled these rows as trained into a durable checkpoint while the curator
    still had them queued: the trainer must not train them again, so `take` refuses the
    step. Rows of an already trained step that were lost make the trainer restart."""
    log.append_many([(make_trajectory(f"t{i}", run_id="r"), f"/b/{i}") for i in range(4)])
    trained = log.claim("r", 2, consumer="curator", lease_s=60)
    queued = log.claim("r", 2, consumer="curator", lease_s=60)
    keeper = LeaseKeeper(log, lease_s=60)
    assert keeper.take(0, (trained,))
    assert log.consume_lineage("r", queued.row_ids, in_version=3) == 2
    assert keeper.take(1, (queued,)) is False
    assert list(keeper.held) == [0]
    # now the trained step's rows go too (a resume settled them): the next take raises
    log.consume_lineage("r", trained.row_ids, in_version=3)
    with pytest.raises(LeaseLostError):
        keeper.take(2, ())


def test_the_heartbeat_thread_renews_while_the_trainer_is_busy(log: DurableLog) -> None:
    """The trainer blocks for 2 s (an optimizer step, a publish, a save: no call into the
    keeper) with leases of 0.6 s; the keeper's own thread renews them, so no sweep finds
    them and the late ack succeeds. A renewal that finds rows gone is raised by the trainer's
    next `renew`."""
    log.append_many([(make_trajectory(f"t{i}", run_id="r"), f"/b/{i}") for i in range(4)])
    claim = log.claim("r", 4, consumer="curator", lease_s=0.6)
    keeper = LeaseKeeper(log, lease_s=0.6).start(period_s=0.05)
    keeper.hold(0, (claim,))
    time.sleep(2.0)  # busy, the keeper is not called
    assert log.claim("r", 4, consumer="thief", lease_s=60).rows == ()
    (held,) = keeper.held[0]
    assert log.ack(held) == 4  # the rows are settled behind the keeper's back ...
    time.sleep(0.5)  # ... so its next renewal finds them gone
    keeper.stop()
    with pytest.raises(LeaseLostError):
        keeper.renew()


def test_a_heartbeat_during_the_acks_of_a_durable_save_loses_no_lease(
    log: DurableLog,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 45, point 3, at its call site (`Publisher.make_durable`): the publisher acks
    each held claim, then tells the curator, then lets go of the claims. A heartbeat that fell
    in between renewed claims already acknowledged (their rows CONSUMED), recorded a lost
    lease, and the trainer's next `take` restarted it for nothing. Leases of 1.5 s (the
    tests'), a beat every 0.05 s, and acks slowed to 0.6 s each: a beat falls between them."""
    import dart_ray.train.publisher as worker
    from dart_ray.store.checkpoints import CheckpointRegistry
    from dart_ray.train.checkpointing import TrainerState

    log.append_many([(make_trajectory(f"t{i}", run_id="r"), f"/b/{i}") for i in range(4)])
    claims = [log.claim("r", 2, consumer="curator", lease_s=1.5) for _ in range(2)]
    keeper = LeaseKeeper(log, lease_s=1.5)
    for step, c in enumerate(claims):
        assert keeper.take(step, (c,))
    keeper.start(period_s=0.05)

    class SlowLog:
        def ack(self, claim, in_version=None):  # type: ignore[no-untyped-def]
            n = log.ack(claim, in_version=in_version)
            time.sleep(0.6)
            return n

    class Curator:
        class forget_steps:  # an actor method's shape
            @staticmethod
            def remote(session: int, steps: list[int]) -> list[int]:
                return steps

    registry = CheckpointRegistry(log.engine, log.retry)
    store = type("S", (), {"log": SlowLog(), "checkpoints": registry})()
    job = type("J", (), {"run_dir": str(tmp_path), "model_dir": str(tmp_path), "session": 1})()
    pub = object.__new__(worker.Publisher)
    pub.job, pub.store, pub.curator, pub.leases, pub.adapter = job, store, Curator(), keeper, None
    pub.trained_at = {0: 1, 1: 1}
    monkeypatch.setattr(worker, "save_checkpoint", lambda out, *a, **k: out)
    monkeypatch.setattr(worker.ray, "get", lambda x: x)
    cid = registry.create("r", 1, source="train")
    registry.start(cid)
    try:
        pub.make_durable(cid, None, {}, {}, TrainerState(step=2, version=1))  # type: ignore[arg-type]
        time.sleep(0.3)  # beats after the save find nothing held
        keeper.renew()  # raised LeaseLostError before the fix
    finally:
        keeper.stop()
    assert keeper.held == {}
