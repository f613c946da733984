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
    (v9 = v7's). Against the current version c, a sample's distance is its updates to the
    branch point plus the lineage's from there:
      v1: 1 (to v2) + 2 (v5 to v7) + c - 9 = c - 6        v2: c - 7 (its weights are v5's)
      v3: 1 (back to v2) + 2 + c - 9 = c - 6              v4: 2 + 2 + c - 9 = c - 5
      v5: 2 + c - 9 = c - 7     v6: c - 8     v7: c - 9 (= v9's weights)
      v8: 1 (back to v7) + c - 9 = c - 8                  v9, v10: themselves
    so the effective versions are c minus those distances (issue 45, point 4: before, a kept
    version counted as itself, and v2's samples as 3 behind v5 where they are 0)."""
    from dart_ray.store.checkpoints import Lineage

    lin = Lineage(newest=10, discarded=frozenset({3, 4, 8}))
    assert [lin.effective(v) for v in range(1, 11)] == [6, 7, 6, 5, 7, 8, 9, 8, 9, 10]
    # as the lineage went when v5 trained (the resume to v9 had not happened): v2's samples
    # are 0 behind v5, the discarded v3 and v4 are where their branch put them
    assert [lin.effective(v, at=5) for v in range(1, 6)] == [4, 5, 4, 3, 5]
    assert [lin.effective(v, at=2) for v in range(1, 3)] == [1, 2]
