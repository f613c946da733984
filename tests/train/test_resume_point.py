"""Where a resumed or restarted trainer starts, from the checkpoint registry (SQLite and
MariaDB): versions only go up, with or without a durable checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy.engine import Engine

from dart_ray.store.checkpoints import CheckpointRegistry
from dart_ray.train.checkpointing import TrainerState
from dart_ray.train.worker import resume_point, should_train


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
