"""A `rollout_run` row as the log's Python side sees it: the `LogRow` record, the columns a
row is read with (`ROW_COLS`) and turned into a record by (`log_row`), the values a finished
trajectory is inserted with (`row_values`); and a `Claim` of rows with its two errors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from dart_ray.records import Status, Trajectory
from dart_ray.store.db import RowState, rollout_run


@dataclass(frozen=True, slots=True)
class LogRow:
    """One trajectory as the log knows it (the steps live in the blob at `uri`)."""

    id: int
    run_id: str
    trajectory_id: str
    task_id: str
    trace_id: str
    group_id: str
    group_size: int
    uri: str
    reward: float
    num_steps: int
    status: Status
    version_num: int
    model_version: str
    instruction: str


ROW_COLS = (
    rollout_run.c.id,
    rollout_run.c.run_id,
    rollout_run.c.trajectory_id,
    rollout_run.c.task_id,
    rollout_run.c.trace_id,
    rollout_run.c.group_id,
    rollout_run.c.group_size,
    rollout_run.c.uri,
    rollout_run.c.reward,
    rollout_run.c.num_steps,
    rollout_run.c.status,
    rollout_run.c.version_num,
    rollout_run.c.model_version,
    rollout_run.c.instruction,
)


def log_row(r: sa.Row[Any]) -> LogRow:
    return LogRow(
        id=r.id,
        run_id=r.run_id,
        trajectory_id=r.trajectory_id,
        task_id=r.task_id,
        trace_id=r.trace_id,
        group_id=r.group_id,
        group_size=r.group_size,
        uri=r.uri,
        reward=r.reward,
        num_steps=r.num_steps,
        status=Status(r.status),
        version_num=r.version_num,
        model_version=r.model_version,
        instruction=r.instruction,
    )


def model_version_name(version: int) -> str:
    return f"v{version}" if version >= 0 else ""


def row_values(t: Trajectory, uri: str, now: datetime) -> dict[str, Any]:
    """The `rollout_run` row a newly appended trajectory gets (AVAILABLE, never used)."""
    return {
        "run_id": t.run_id,
        "trajectory_id": t.trajectory_id,
        "task_id": t.task.task_id,
        "trace_id": t.trace_id,
        "group_id": t.group_id,
        "group_size": t.group_size,
        "uri": uri,
        "reward": float(t.reward),
        "num_steps": t.num_steps,
        "status": t.status.value,
        "state": RowState.AVAILABLE,
        "used": 0,
        "model_version": model_version_name(t.min_version),
        "version_num": t.min_version,
        "instruction": t.task.instruction,
        "created_at": now,
    }


class LeaseLostError(RuntimeError):
    """Rows of a claim are no longer held by it (the lease expired and they went back)."""


class ClaimRaceError(RuntimeError):
    """A claim selected rows that another transaction had already taken: nothing was
    claimed (the transaction rolled back); claiming again is safe."""


@dataclass(frozen=True, slots=True)
class Claim:
    claim_id: str
    consumer: str
    run_id: str
    rows: tuple[LogRow, ...]
    lease_expires_at: datetime

    @property
    def row_ids(self) -> list[int]:
        return [r.id for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)
