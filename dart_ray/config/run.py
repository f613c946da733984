"""The run itself and where it runs: `[run]` (name, id, mode, budgets, resume) and `[cluster]`
(the Ray cluster to join or start)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from dart_ray.config.base import Section


class RunConfig(Section):
    name: str = "tiny-cpu"
    """Human-readable experiment name; part of the generated run id."""
    run_id: str | None = None
    """Run id to use (or resume). Generated as `<name>-<timestamp>` when unset."""
    root_dir: Path = Path("runs")
    """Folder for run outputs (`<root_dir>/<run_id>/`) and the embedded SQLite log. A relative
    path is taken from the working directory, except in a Ray job with an uploaded working
    directory (see job_root_dir); give an absolute path (shared storage) on a cluster."""
    job_root_dir: Path = Path("~/dart-ray")
    """Where a relative root_dir goes when the run is a Ray job submitted with `--working-dir`:
    Ray runs such a job in a temporary copy of that folder, so outputs there would be lost
    from sight. `~` is the home of the user running Ray on the driver's node."""
    seed: int = 0
    """Seed for task sampling, environments and model initialisation."""
    mode: Literal["decoupled", "sync"] = "decoupled"
    """`decoupled`: rollout and training overlap (DART). `sync`: the synchronous baseline
    (rounds of rollouts at fixed weights, then training, then the weight sync; see
    `sync_sampling`)."""
    sync_sampling: Literal["batch", "dynamic"] = "batch"
    """How a synchronous round rolls out. `batch` (verl's and DART-GUI's synchronous
    pipeline): a full batch of groups that fills every session (max(groups_per_step, sessions
    / n_rollouts) groups), then one step on every group of it that has signal. `dynamic`
    (DAPO's dynamic sampling): every session kept busy at the same weights until the
    step's `groups_per_step` groups with signal are there, then the episodes in flight
    finish and one step trains every group with signal. docs/BENCHMARKS.md compares both."""
    max_versions: int = Field(default=20, ge=1)
    """Stop after this many weight versions have been published."""
    max_minutes: float = Field(default=60.0, gt=0)
    """Wall-clock budget: training stops cleanly (a final durable version) when it runs out."""
    eval_tasks: int = Field(default=16, ge=0)
    """Held-out tasks played greedily before and after training for the report (0: skip)."""
    resume: bool = False
    """Continue `run_id` from its newest durable checkpoint and its unconsumed buffer."""

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v):
            raise ValueError("must be 1-128 characters of letters, digits, '.', '_', '-'")
        return v


class ClusterConfig(Section):
    address: str | None = None
    """Ray cluster address (`auto`: the one $RAY_ADDRESS or the last `ray start` here names;
    `ray://host:10001`); unset starts a local Ray of the run's own, even beside a running one."""
    num_cpus: float | None = None
    """CPUs of a local Ray (unset: all); ignored when joining a cluster."""
    namespace: str = "dart-ray"
    """Ray namespace for the run's named actors."""
    dashboard_host: str = "127.0.0.1"
    """Where a local Ray's dashboard binds."""
    resource_wait_s: float = Field(default=120.0, ge=0)
    """Joining a cluster where no node offers `env.resource`: seconds to wait for the
    autoscaler to add one before the run fails with the fix (a fixed cluster never will)."""
