"""The checkpoint status workflow on SQLite and MariaDB."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from dart_ray.store.checkpoints import CheckpointRegistry, CheckpointStateError


def test_workflow_pending_running_completed(engine: Engine) -> None:
    reg = CheckpointRegistry(engine)
    cid = reg.create("run-a", 1, config_yaml="algo: {eps_high: 0.28}\n")
    assert reg.create("run-a", 1) == cid  # idempotent per (run, version)
    assert reg.latest("run-a") is None  # nothing COMPLETED yet
    assert reg.latest("run-a", status=None).status == "PENDING"  # type: ignore[union-attr]
    reg.start(cid)
    reg.start(cid)  # a retried move that already happened is fine
    reg.complete(cid, path="/ckpt/v1")
    done = reg.latest("run-a")
    assert done is not None and (done.version, done.path, done.status) == (
        "v1",
        "/ckpt/v1",
        "COMPLETED",
    )
    assert done.finished_at is not None


def test_failed_keeps_reason_and_latest_skips_it(engine: Engine) -> None:
    reg = CheckpointRegistry(engine)
    ok = reg.create("run-a", 1)
    reg.start(ok)
    reg.complete(ok, "/c/1")
    bad = reg.create("run-a", 2)
    reg.start(bad)
    reg.fail(bad, "gather timed out on rank 1")
    assert reg.latest("run-a").version_num == 1  # type: ignore[union-attr]
    newest = reg.latest("run-a", status=None)
    assert (
        newest is not None
        and newest.status == "FAILED"
        and newest.error == "gather timed out on rank 1"
    )


@pytest.mark.parametrize(
    "moves, illegal",
    [
        ([], "complete"),  # PENDING cannot complete without running
        (["start", "fail"], "complete"),  # FAILED is final
        (["start", "complete"], "fail"),  # COMPLETED cannot fail afterwards
        (["start"], "deprecate"),  # only COMPLETED can be deprecated
    ],
)
def test_illegal_moves_fail_loudly(engine: Engine, moves: list[str], illegal: str) -> None:
    reg = CheckpointRegistry(engine)
    cid = reg.create("run-a", 7)
    for m in moves:
        getattr(reg, m)(cid, *(["boom"] if m == "fail" else []))
    with pytest.raises(CheckpointStateError, match=f"checkpoint {cid} is"):
        getattr(reg, illegal)(cid, *(["boom"] if illegal == "fail" else []))


def test_deprecate_and_soft_delete(engine: Engine) -> None:
    reg = CheckpointRegistry(engine)
    ids = []
    for v in (1, 2):
        cid = reg.create("run-a", v)
        reg.start(cid)
        reg.complete(cid, f"/c/{v}")
        ids.append(cid)
    reg.deprecate(ids[0])
    assert [c.status for c in reg.list("run-a")] == ["DEPRECATED", "COMPLETED"]
    reg.delete(ids[1])
    assert reg.latest("run-a") is None
    assert [c.version_num for c in reg.list("run-a")] == [1]
    with pytest.raises(CheckpointStateError):
        reg.deprecate(ids[1])  # a deleted checkpoint no longer moves


def test_a_discarded_version_counts_by_its_distance_through_the_version_tree() -> None:
    """Resumed from v2 with v3, v4 lost (v5 = v2's weights), later from v7 with v8 lost
    (v9 = v7's). A v4 sample is 2 updates past v2, so as far from the lineage as a v3 one
    (5 - 2); v3 as a v4 (5 - 1); v8 as a v8 (9 - 1). Kept versions are themselves."""
    from dart_ray.store.checkpoints import Lineage

    lin = Lineage(newest=10, discarded=frozenset({3, 4, 8}))
    assert [lin.effective(v) for v in range(1, 11)] == [1, 2, 4, 3, 5, 6, 7, 8, 9, 10]
