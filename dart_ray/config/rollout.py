"""The data side of a run: `[rollout]` (how trajectories are played) and `[curation]` (how they
are grouped, filtered and claimed into training steps)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dart_ray.config.base import Section


class RolloutConfig(Section):
    in_flight: int = Field(default=8, ge=1)
    """Trajectories kept in flight at once by each rollouter (K)."""
    rollouters: int = Field(default=1, ge=1)
    """Rollouter actors; tasks and sessions are sharded between them, all feed one curator."""
    n_rollouts: int = Field(default=8, ge=1)
    """Default rollouts per task (the GRPO group size)."""
    max_steps: int = Field(default=8, ge=1)
    """Default step limit per episode (DART-GUI: 30 on OSWorld)."""
    max_retries: int = Field(default=2, ge=0)
    """Retries of an aborted trajectory on a fresh session before it is ENV_ERROR."""
    on_invalid_action: Literal["penalise", "end", "retry"] = "penalise"
    """Unparseable model output: count a no-op step (`penalise`), end the episode, or resample.
    An action the environment cannot carry out (its step says `invalid action: ...`) is a
    no-op step too, or ends the episode with `end` (`retry` cannot take back what was sent)."""
    success_threshold: float = 1.0
    """A trajectory with reward >= this counts as a success (task statistics, replay)."""
    admission: bool = True
    """Staleness-aware admission (decoupled mode): open a new group only while the rows
    running and waiting can still train within `curation.max_staleness`, at the trainer's
    measured pace (`dart_ray/rollout/admission.py`). Off, rollouters start episodes as fast
    as sessions free up, and what the trainer cannot take in time is dropped as stale. The
    synchronous mode never runs ahead, so it ignores this."""
    admission_slack: float = Field(default=0.5, ge=0)
    """Versions of margin admission keeps below `curation.max_staleness` for a group's place
    in the queue (which groups will carry signal, and how full steps leave, are estimates)."""
    backoff: bool = False
    """Back off tasks without signal (off until its learning runs are measured: it changes
    which tasks are rolled out, docs/LEARNING.md): a task whose last `backoff_after` groups all had equal
    rewards (all fail with no fresh success to replay, or all succeed with `backoff_solved`)
    is skipped for 1, 2, 4, ... of its visits (at most `backoff_max_skips`), then retried
    with an ordinary group; a group with signal ends it. Never skips every task: when all
    are backed off the one whose back-off ends soonest runs (`dart_ray/algo/curriculum.py`)."""
    backoff_after: int = Field(default=3, ge=1)
    """Groups without signal in a row before a task is first skipped."""
    backoff_max_skips: int = Field(default=8, ge=1)
    """Most visits of a task skipped in a row: a backed-off task is still retried at least
    once in every `backoff_max_skips + 1` of its visits."""
    backoff_scope: Literal["task", "family"] = "task"
    """What back-off counts groups without signal over and skips visits of. `task`: each task
    alone (a task must come round `backoff_after` times before it is first skipped, which a
    short run over many tasks never reaches). `family`: the task's family (its
    `config["family"]`, else the family its id names, `dart_ray.reporting.families`): the
    newest `backoff_after` groups of any task of the family, so a family no sample solves is
    skipped after a few groups, whatever its tasks; a task with a fresh success to replay is
    never skipped (its all-fail group trains)."""
    backoff_solved: bool = False
    """Back off all-success tasks too. Off by default: the dynamic rollout budget already
    cuts a solved task to its minimum group, and those rollouts are what notices a
    regression."""


class CurationConfig(Section):
    group_size: int = Field(default=8, ge=1)
    """Trajectories per task group used for GRPO advantages."""
    min_group: int = Field(default=2, ge=1)
    """Smallest group trained when the group timeout passes."""
    group_timeout_s: float = Field(default=120.0, gt=0)
    """Seconds to wait for a full group before training a partial one."""
    group_abandon_s: float = Field(default=600.0, gt=0)
    """Seconds after which a group still below min_group is dropped (reason
    `group_incomplete`): its missing members are lost, and holding it would hold its rows."""
    max_held_rows: int | None = Field(default=None, ge=1)
    """Most rows the curator holds claimed but not yet handed to the trainer (its memory
    bound; the rest stay AVAILABLE in the log). None: (queue_depth + 1) x groups_per_step x
    group_size for curated steps, plus rollouters x in_flight x max(group_size, n_rollouts)
    for the groups still filling (at most that many are open at once, so a full group can
    always form)."""
    max_staleness: int = Field(default=2, ge=0)
    """Drop trajectories whose oldest step is more than this many versions behind."""
    success_replay: bool = True
    """Give an all-fail group the newest success of its task (DART-GUI's experience replay)."""
    replay_seeds: str | None = None
    """A JSONL file of written solutions (the script engine's format, e.g. OSWorld's from
    `dart_ray.envs.osworld.solutions`) that seeds the replay pool: at the run's start each
    training task with one is played once in the run's environments, its responses
    teacher-forced through the policy server (tokens and log-probs of the starting weights),
    and a success becomes the task's newest success to replay (`dart_ray.rollout.seeding`).
    Needs `success_replay` and `policy.engine = "hf"`. None: no seeds."""
    drop_no_signal: bool = True
    """Drop groups whose rewards are all equal (zero advantage: no policy gradient). Off, they
    are trained anyway (only the KL term moves the weights): for pipeline tests."""
    entropy_top_fraction: float = Field(default=1.0, gt=0, le=1)
    """Keep this fraction of steps with the highest mean token entropy (1.0 keeps all)."""
    dynamic_rollouts: bool = True
    """Fewer rollouts for tasks the policy already solves (dynamic rollout budget)."""
    queue_depth: int = Field(default=2, ge=1)
    """Training steps queued before the curator stops claiming (backpressure)."""
    groups_per_step: int = Field(default=4, ge=1)
    """Trainable task groups packed into one optimizer step (DART-GUI: 6-8 tasks)."""
    lease_s: float = Field(default=600.0, gt=0)
    """Seconds a claim holds rows before they return to the pool unless acknowledged."""
