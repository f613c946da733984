"""Curate one GRPO group: drop what cannot be trained (with a reason), replay a success into
an all-fail group, compute advantages (per trajectory, or per step with `credit = "step"`),
split trajectories into step samples, and keep the high-entropy steps.

With `objective = "rft"` (rejection-sampling fine-tuning, a control) only the successes
train, each with advantage 1: no replay, no group statistics.

Data that cannot be trained (a step without response tokens, a reward that is not a number)
raises ValueError naming the trajectory: the curator quarantines the group.

Every logged row of the group ends in exactly one of two lists: `trained_rows` (its samples go
to the trainer and the row is acknowledged after the optimizer step) or `dropped` (with the
reason, acknowledged as dropped now). Nothing is silently lost.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from dart_ray.algo.advantages import AdvantageMode, grpo_advantages
from dart_ray.algo.credit import CreditMode, StepNorm, step_credit_advantages
from dart_ray.algo.curriculum import replay_into_group
from dart_ray.algo.selection import select_high_entropy
from dart_ray.records import Status, Step, Trajectory
from dart_ray.store.log_rows import LogRow


@dataclass(frozen=True, slots=True)
class StepSample:
    """One assistant turn to train on, with everything the loss needs."""

    trajectory_id: str
    task_id: str
    step_idx: int
    weight_version: int
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    advantage: float
    images: tuple[bytes, ...]
    """The screenshots of the prompt, oldest first."""
    entropy: float = 0.0
    """Mean entropy over the response tokens (0 when the engine did not report it)."""
    token_versions: Sequence[int] = ()
    """Each response token's version where they differ (partial rollouts; `Step`'s)."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True, slots=True)
class CurationParams:
    success_threshold: float = 1.0
    advantage_mode: AdvantageMode = "trajectory"
    success_replay: bool = True
    entropy_top_fraction: float = 1.0
    drop_no_signal: bool = True
    """Drop groups whose rewards are all equal (trajectory advantages all zero): they teach
    nothing. With `credit = "step"` too (see `curate_group`)."""
    credit: CreditMode = "trajectory"
    """`step`: add GiGPO's anchor-state advantage to each step (`dart_ray.algo.credit`)."""
    step_gamma: float = 0.95
    """Discount of the step returns (`credit = "step"`)."""
    step_weight: float = 1.0
    """omega, the weight of the step-level advantage (`credit = "step"`)."""
    step_norm: StepNorm = "mean"
    """Centre the returns of an anchor state (`mean`) or standardise them (`std`)."""
    objective: Literal["grpo", "rft"] = "grpo"
    """`rft`: keep only the successes, each with advantage 1 (their NLL is the loss), drop
    the failures (`rft_failure`) and groups without a success (`no_success`); no replay."""


@dataclass
class GroupOutcome:
    samples: list[StepSample] = field(default_factory=list)
    trained_rows: list[int] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)
    replayed: str | None = None
    """Trajectory id of the success replayed into this group, if any."""
    rewards: list[float] = field(default_factory=list)


def split_steps(t: Trajectory, advantage: float | Sequence[float]) -> list[StepSample]:
    """Every step of a trajectory as a sample carrying the trajectory's advantage, or with a
    sequence, each step its own (step-level credit)."""
    shots = [s.screenshot for s in t.steps]
    advs = advantage if isinstance(advantage, Sequence) else [advantage] * len(t.steps)
    if len(advs) != len(t.steps):
        raise ValueError(
            f"{len(advs)} advantages for the {len(t.steps)} steps of {t.trajectory_id}"
        )
    out = []
    for i, s in enumerate(t.steps):
        if not s.response_ids:  # nothing to train, and a learner would divide by it
            raise ValueError(f"{t.trajectory_id} step {s.step_idx} has no response tokens")
        first = max(0, i - s.num_images + 1)
        ent = sum(s.entropy) / len(s.entropy) if s.entropy else 0.0
        out.append(
            StepSample(
                trajectory_id=t.trajectory_id,
                task_id=t.task.task_id,
                step_idx=s.step_idx,
                weight_version=s.weight_version,
                prompt_ids=s.prompt_ids,
                response_ids=s.response_ids,
                behaviour_logprobs=s.behaviour_logprobs,
                advantage=float(advs[i]),
                images=tuple(shots[first : i + 1]),
                entropy=ent,
                token_versions=s.token_versions,
            )
        )
    return out


def state_key(step: Step) -> bytes | None:
    """The anchor-state key of a step: a digest of the screenshot it acted on (MiniDesk and
    MiniWoB++ render a repeated state to the same PNG bytes), None without a screenshot (such
    a step is never grouped). A 16-byte blake2b: hashing a 1080p PNG once is far cheaper than
    comparing the bytes pairwise, and a collision is out of reach."""
    if not step.screenshot:
        return None
    return hashlib.blake2b(step.screenshot, digest_size=16).digest()


def curate_group(
    members: Sequence[tuple[LogRow, Trajectory]],
    params: CurationParams,
    replay: Trajectory | None = None,
) -> GroupOutcome:
    """Turn one group of (log row, trajectory) into samples; see the module docstring."""
    out = GroupOutcome()
    members = sorted(members, key=lambda m: m[0].id)  # oldest first
    if any(t.status is Status.ENV_ERROR for _, t in members):
        out.dropped = {r.id: "group_env_error" for r, _ in members}
        return out
    keep: list[tuple[LogRow, Trajectory]] = []
    for r, t in members:
        if t.status.trainable:
            keep.append((r, t))
        else:
            out.dropped[r.id] = t.status.value.lower()
    if not keep:
        return out

    if params.objective == "rft":
        return _keep_successes(keep, params, out)

    for _, t in keep:
        if not math.isfinite(t.reward):
            raise ValueError(f"{t.trajectory_id} has reward {t.reward}")
    trajs: list[Trajectory] = [t for _, t in keep]
    rows: list[LogRow | None] = [r for r, _ in keep]
    successes = [t.reward >= params.success_threshold for t in trajs]
    # a replay needs a member of this group beside it: in a group of one it would take the
    # only sample's place (nothing on-policy left, and one member has no advantage anyway)
    if params.success_replay and replay is not None and len(trajs) > 1:
        trajs, replaced = replay_into_group(trajs, successes, replay)
        if replaced is not None:
            row = rows[replaced]
            assert row is not None
            out.dropped[row.id] = "replaced_by_replay"
            rows[replaced] = None
            out.replayed = replay.trajectory_id

    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    num_steps = torch.tensor([t.num_steps for t in trajs])
    adv = grpo_advantages(rewards, num_steps, mode=params.advantage_mode)
    out.rewards = rewards.tolist()
    # The drop looks at the trajectory advantages in both credit modes. With terminal rewards
    # all equal, the step returns at a shared state differ only by their discount: all zero in
    # an all-fail group, and in an all-success group a preference for shorter paths alone,
    # which is no evidence about which action solved the task. Such a group still teaches
    # nothing worth its steps, and a group is dropped (or not) whatever the credit mode.
    if params.drop_no_signal and bool((adv == 0).all()):
        for row in rows:
            if row is not None:
                out.dropped[row.id] = "no_signal"
        return out

    per_traj: list[float] | list[list[float]] = adv.tolist()
    if params.credit == "step":
        # a replayed success is one of the group here: its steps share anchor states with the
        # members' (same task, same start) and enter their statistics like any member's
        keys = [state_key(s) for t in trajs for s in t.steps]  # each screenshot hashed once
        flat = step_credit_advantages(
            rewards,
            num_steps,
            keys,
            gamma=params.step_gamma,
            weight=params.step_weight,
            norm=params.step_norm,
            episode_mode=params.advantage_mode,
        )
        per_traj = [a.tolist() for a in torch.split(flat, num_steps.tolist())]
    samples = [s for t, a in zip(trajs, per_traj, strict=True) for s in split_steps(t, a)]
    # selection comes after the advantages: the group's (and each anchor state's) statistics
    # are over every step, and selection only chooses which of them train
    if params.entropy_top_fraction < 1.0 and samples:
        scores = torch.tensor([s.entropy for s in samples])
        samples = [samples[i] for i in select_high_entropy(scores, params.entropy_top_fraction)]
    out.samples = samples
    out.trained_rows = [row.id for row in rows if row is not None]
    return out


def _keep_successes(
    keep: list[tuple[LogRow, Trajectory]], params: CurationParams, out: GroupOutcome
) -> GroupOutcome:
    """Rejection sampling: the group's successes train with advantage 1, the rest is dropped
    with its reason (every row still ends in exactly one list)."""
    won = [(r, t) for r, t in keep if t.reward >= params.success_threshold]
    lost = "rft_failure" if won else "no_success"
    for r, t in keep:
        if t.reward < params.success_threshold:
            out.dropped[r.id] = lost
    out.rewards = [t.reward for _, t in keep]
    out.samples = [s for _, t in won for s in split_steps(t, 1.0)]
    out.trained_rows = [r.id for r, _ in won]
    return out
