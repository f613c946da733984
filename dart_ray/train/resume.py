"""Where a resumed or restarted trainer starts, and the log made to agree with it first.

A trainer resumes from the newest durable checkpoint; the rows that checkpoint trained are
consumed even if the trainer that wrote it died before acknowledging them, and versions
published above it are discarded (their weights are gone). The driver calls this before the
policy server starts, so replicas serve the resumed weights from their first request.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dart_ray.store import Store
from dart_ray.train.checkpointing import TrainerState, read_trainer_state

log = logging.getLogger(__name__)


def settle_lineage(store: Store, run_id: str, path: str) -> int:
    """Before a trainer resumes from the durable checkpoint at `path`: its rows are consumed,
    even if the trainer that wrote it died before acknowledging them (returns how many of
    them it had not acknowledged)."""
    state = read_trainer_state(Path(path))
    n = store.log.consume_lineage(run_id, state.rows, state.version)
    if n:
        log.warning(
            "checkpoint v%d: %d trained rows were never acknowledged; settled", state.version, n
        )
    return n


def resume_from_durable(store: Store, run_id: str) -> tuple[str | None, TrainerState]:
    """Where a resumed or restarted trainer starts (`resume_point`), with the log made to
    agree with it first: the rows its checkpoint trained are consumed (`settle_lineage`),
    and every version published above the durable one is DISCARDED: those weights are gone,
    so the samples they generated (logged, queued, or still being rolled out on replicas
    that serve them) are outside the lineage and must not pass as fresh. The curator reads
    the discarded versions from the registry and drops their rows."""
    path, state = resume_point(store, run_id)
    if path is not None:
        settle_lineage(store, run_id, path)
    if state.durable_version is not None:
        gone = store.checkpoints.discard_above(
            run_id,
            state.durable_version,
            f"weights lost: the trainer resumed from v{state.durable_version}",
        )
        if gone:
            log.warning(
                "versions %s were never made durable; their samples will not be trained", gone
            )
    return path, state


def resume_point(store: Store, run_id: str) -> tuple[str | None, TrainerState]:
    """Where a resumed trainer starts: the newest COMPLETED checkpoint with files (None when
    there is none yet: the base weights) at its step, with the version counter at the highest
    version the run ever published, so versions only go up (a version published after the
    last durable save is not reused). A run stopped or restarted before its first durable
    checkpoint therefore starts again from step 0 on the base weights and publishes above
    what the replicas already serve, instead of re-publishing version 1 to replicas that are
    past it. `durable_version` marks a counter above the durable weights: the trainer then
    trains on until its newest version is durable (`should_train`)."""
    cps = store.checkpoints.list(run_id)
    top = max((c.version_num for c in cps), default=0)
    for cp in reversed(cps):
        if cp.status == "COMPLETED" and cp.path and Path(cp.path, "trainer_state.json").is_file():
            state = read_trainer_state(Path(cp.path))
            durable = state.version if state.version < top else None
            return cp.path, TrainerState(step=state.step, version=top, durable_version=durable)
    return None, TrainerState(step=0, version=top, durable_version=0 if top else None)
