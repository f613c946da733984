"""Where a resumed or restarted trainer starts, from the checkpoint registry (SQLite and
MariaDB): versions only go up, with or without a durable checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy.engine import Engine

from dart_ray.store.blobs import BlobStore
from dart_ray.store.checkpoints import CheckpointRegistry, Lineage
from dart_ray.store.db import RowState
from dart_ray.store.log import DurableLog
from dart_ray.train.checkpointing import TrainerState
from dart_ray.train.resume import resume_from_durable, resume_point
from dart_ray.train.worker import should_train
from tests.factories import make_trajectory


def _published(reg: CheckpointRegistry, version: int, path: str | None = None) -> None:
    cid = reg.create("run-a", version)
    reg.start(cid)
    reg.complete(cid, path)


def test_before_the_first_durable_checkpoint_versions_still_go_up(engine: Engine) -> None:
    """Versions 1-3 were published (save_every > 1: no files yet) when the trainer died. The
    restarted trainer starts from the base weights at step 0, but its next version is 4: the
    replicas serve version 3 and refuse anything older. Before, this case returned nothing
    and the trainer published version 1 again, which the replicas refused, and the run died
    (CheckpointStateError / 'older than the loaded')."""
    reg = CheckpointRegistry(engine)
    assert resume_point(SimpleNamespace(checkpoints=reg), "run-a") == (None, TrainerState(0, 0))  # type: ignore[arg-type]
    for v in (1, 2, 3):
        _published(reg, v)
    start = resume_point(SimpleNamespace(checkpoints=reg), "run-a")  # type: ignore[arg-type]
    assert start == (None, TrainerState(0, 3, durable_version=0))


def test_from_the_newest_durable_checkpoint(engine: Engine, tmp_path: Path) -> None:
    reg = CheckpointRegistry(engine)
    durable = tmp_path / "v2"
    durable.mkdir()
    (durable / "trainer_state.json").write_text(json.dumps({"step": 7, "version": 2}))
    _published(reg, 1)
    _published(reg, 2, str(durable))
    _published(reg, 3)
    path, state = resume_point(SimpleNamespace(checkpoints=reg), "run-a")  # type: ignore[arg-type]
    assert (path, state) == (str(durable), TrainerState(step=7, version=3, durable_version=2))


def test_a_version_published_and_never_made_durable_is_not_an_end() -> None:
    """The trainer of a run with max_versions=6 published version 6 and was SIGKILLed while
    writing its files; the resumed trainer starts from the durable v5 with its counter at 6.
    Before, it took 6 >= 6 as the end and trained nothing, so the run finished on weights that
    existed nowhere (seen in tests/test_faults.py: the final run ended in 23 s, no step)."""
    assert should_train(version=6, durable=5, max_versions=6)  # to v7, saved: the run's end
    assert not should_train(version=7, durable=7, max_versions=6)
    assert should_train(version=3, durable=3, max_versions=6)  # an ordinary run
    assert should_train(version=4, durable=2, max_versions=6)
    assert not should_train(version=6, durable=6, max_versions=6)


def test_a_resume_settles_its_checkpoints_rows_and_discards_the_versions_above_it(
    engine: Engine, tmp_path: Path
) -> None:
    """The trainer made v1 durable (its lineage: both rows), published v2 and v3 without
    files, and died before acknowledging anything. `resume_from_durable`, what the driver's
    restart and `--resume` call, starts from v1 with the counter at 3, consumes v1's rows
    (or the next trainer would train them twice) and marks v2 and v3 DISCARDED (their
    weights are gone: their samples must not pass as fresh). Before, the call sites settled
    the lineage themselves and nothing marked the lost versions."""
    log = DurableLog(engine, success_threshold=1.0)
    blobs = BlobStore(tmp_path / "blobs")
    store = SimpleNamespace(log=log, checkpoints=CheckpointRegistry(engine))
    for tid in ("t1", "t2"):
        log.append(make_trajectory(tid), blobs.write(make_trajectory(tid)))
    claim = log.claim("run-a", 10, consumer="trainer", lease_s=0.2)
    durable = tmp_path / "v1"
    durable.mkdir()
    state = {"step": 4, "version": 1, "rows": list(claim.row_ids)}
    (durable / "trainer_state.json").write_text(json.dumps(state))
    _published(store.checkpoints, 1, str(durable))
    _published(store.checkpoints, 2)
    _published(store.checkpoints, 3)
    time.sleep(0.3)  # its lease lapses
    path, start = resume_from_durable(store, "run-a")  # type: ignore[arg-type]
    assert (path, start) == (str(durable), TrainerState(step=4, version=3, durable_version=1))
    assert log.claim("run-a", 10, consumer="next", lease_s=60).rows == ()
    assert log.buffer("run-a") == {(0, RowState.CONSUMED): 2}
    assert [c.status for c in store.checkpoints.list("run-a")] == [
        "COMPLETED",
        "DISCARDED",
        "DISCARDED",
    ]
    assert store.checkpoints.lineage("run-a") == Lineage(newest=3, discarded=frozenset({2, 3}))
    assert resume_from_durable(store, "run-a") == (path, start)  # idempotent
