"""The run report as a record (`RunReport`): what a run measured, as `report.json` holds it.

The lowest module of `dart_ray.reporting`: the report builder (`report.py`) fills it, the
figures (`figures.py`) and `dart-ray report` read it. It imports nothing of dart-ray.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunReport:
    run_id: str
    mode: str
    wall_s: float
    heldout_before: float | None
    heldout_after: float | None
    heldout_tasks: int
    trajectories: dict[str, int]
    groups_completed: int
    train_steps: int
    versions: int
    samples_trained: int
    rows_trained: int
    dropped: dict[str, int]
    env_utilisation: float
    trainer_utilisation: float
    sync_count: int
    sync_latency_mean_s: float
    sync_latency_max_s: float
    policy_version: int = 0
    """The version the policy server answered with at the end (every publish is confirmed by
    every replica, or the trainer fails)."""
    rewards: list[float] = field(default_factory=list)
    sampled: list[list[int]] = field(default_factory=list)
    """[version, successes, episodes] of the trainable rollouts by weight version (the log)."""
    start_version: int = 0
    """The version the run started from (a resumed run's checkpoint)."""
    off_policy: list[dict[str, float]] = field(default_factory=list)
    """Per published version, the means over its train steps of the trust-region and
    off-policy metrics (`OFF_POLICY_KEYS`)."""
    run_dir: str = ""
    sessions: int = 0
    """Environment sessions of the run (the capacity of the environment utilisation)."""
    staleness: dict[str, int] = field(default_factory=dict)
    """Rows the curator claimed, by how many versions behind the policy they were."""
    trainer_busy: list[list[float]] = field(default_factory=list)
    """[start, end] (unix seconds) of each train step with its weight sync."""
    sync_latency: list[list[float]] = field(default_factory=list)
    """[version, seconds] of each weight publication."""
    simulated: bool = False
    """A timing-mode run (`[timing]`): compute was replaced by calibrated latencies, so its
    times describe the modelled regime, not this machine, and its policy did not learn."""
    rollout_utilisation: float | None = None
    """The policy replicas' accelerators' busy fraction (simulated GPUs in the timing mode)."""
    token_staleness: dict[str, int] = field(default_factory=dict)
    """Response tokens trained (rank 0's shards), by how many versions they were behind the
    weights that trained them: each token's own version under partial rollouts."""
    update_wait_s: float | None = None
    """Mean seconds a weight update waited, per replica, for the generations in flight: to
    finish (drain) or to pause at a token boundary (`policy.interrupt_on_update`)."""
    rollouts_started: int = 0
    """Episodes the rollouters started (retries of aborted ones included)."""
    admission_held_s: float = 0.0
    """Session-free seconds during which staleness-aware admission held new groups back
    (summed over rollouters)."""
    stale_at: dict[str, int] = field(default_factory=dict)
    """Rows dropped as stale by where they waited when the bound passed them
    (`CuratorMetrics.stale_at`: log, filling, ready, queued)."""
    update_blocked_s: float | None = None
    """Mean seconds, per update and replica, new generations were held off (the wait above
    plus the load)."""
    families: list[dict[str, Any]] = field(default_factory=list)
    """Per task family, from the log: tasks, rollouts (trajectories logged), trained (rows
    CONSUMED), no_signal (rows dropped for equal rewards) (`dart_ray.reporting.families`)."""
    backoff_skips: int = 0
    """Task visits the schedulers skipped because the task's recent groups had no signal."""
    quarantined: dict[str, int] = field(default_factory=dict)
    """Rows settled as bad data (`RowState.QUARANTINED`), by where they broke: an unreadable
    blob, a group whose curation raised, samples that could not be packed."""
    replay_seeds: list[dict[str, Any]] = field(default_factory=list)
    """Per task with a written solution (`curation.replay_seeds`): its seed episode's
    `SeedOutcome` (reward, status, whether it seeded replay), with `again` (its seed played
    again once it had aged), `replays` (all-fail groups it gave a success), `rollouts` and
    `trained` (the policy's rows of the task)."""
    heldout_split: str = ""
    """What the before/after evaluation measured: the task file and what holds it out
    (`env.heldout_tasks`, disjoint by content from the training tasks)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def empty(cls, run_id: str) -> RunReport:
        """A report with no numbers yet (a run still going, or one that died before its
        report): what `dart-ray report` fills from the log."""
        return cls(
            run_id=run_id,
            mode="?",
            wall_s=0.0,
            heldout_before=None,
            heldout_after=None,
            heldout_tasks=0,
            trajectories={},
            groups_completed=0,
            train_steps=0,
            versions=0,
            samples_trained=0,
            rows_trained=0,
            dropped={},
            env_utilisation=0.0,
            trainer_utilisation=0.0,
            sync_count=0,
            sync_latency_mean_s=0.0,
            sync_latency_max_s=0.0,
        )
