"""Step-level credit assignment inside a task group (GiGPO's form: Feng et al. 2025,
"Group-in-Group Policy Optimization for LLM Agent Training").

Trajectory-level GRPO gives every step of a trajectory the same advantage, so the one click
that decided the episode and the clicks that were incidental get equal credit. GiGPO adds a
second, finer comparison that needs no critic and no extra rollouts: the G trajectories of a
group start from the same state, so they often pass through the same states again (the start
screen, a dialog every path opens). Steps that act on one such *anchor state* form a group of
their own, and comparing their discounted returns says which action taken *there* did better.

For trajectory i of T_i steps with terminal reward R_i (rewards here are terminal only):

    R_{i,t}  = gamma^(T_i - 1 - t) * R_i                      discounted return of step t
    A^S_{i,t} = (R_{i,t} - mean_{s} R_s) [/ std_{s} R_s]       over the steps s at its state
    A_{i,t}  = A^E_i + omega * A^S_{i,t}                        A^E_i: trajectory-level GRPO

A step alone at its state, or at a state whose steps all have the same return, has A^S = 0:
it keeps exactly its trajectory's advantage. The discount makes the return of a step depend
on how far the episode still went: at a shared state, the action that led to success sooner
gets more credit, and a step that came back to a state it had already visited (a wasted turn)
gets less than the later visit from which the episode went on.

The std is unbiased (Bessel-corrected), as in `grpo_advantages`. Steps are laid out flat and
trajectory-major: the steps of trajectory 0 in order, then those of trajectory 1, and so on.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch

from dart_ray.algo.advantages import AdvantageMode, grpo_advantages

CreditMode = Literal["trajectory", "step"]
StepNorm = Literal["mean", "std"]


def step_returns(rewards: torch.Tensor, lengths: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return (N,) of every step, N = sum(lengths), for G terminal rewards (G,) and
    trajectory lengths (G,): step t of trajectory i gets gamma^(T_i - 1 - t) * R_i (its last
    step gets R_i undiscounted)."""
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    lengths = lengths.to(torch.long)
    if rewards.shape != lengths.shape:
        raise ValueError(f"{rewards.numel()} rewards for {lengths.numel()} lengths")
    traj = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    t = torch.arange(traj.numel()) - starts[traj]
    to_go = (lengths[traj] - 1 - t).to(torch.float64)
    r = rewards.to(torch.float64)[traj]
    return (r * torch.pow(torch.tensor(gamma, dtype=torch.float64), to_go)).to(torch.float32)


def anchor_advantages(
    returns: torch.Tensor,
    keys: Sequence[Hashable | None],
    norm: StepNorm = "mean",
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Step-level advantages (N,): each step's return (N,) centred on the mean return of the
    steps with the same key (its anchor state), divided by their std too with norm `std`.

    A key of None is a step whose state is unknown: it is never grouped with another (A = 0).
    A group of one step, or one whose returns agree to within eps, has A = 0 for its steps.
    """
    if norm not in ("mean", "std"):
        raise ValueError(f"unknown step norm {norm!r}")
    n = returns.numel()
    if len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} returns")
    ids: dict[Hashable, int] = {}
    gid = []
    for k in keys:
        if k is None:  # an unknown state: a fresh group of its own
            k = object()
        gid.append(ids.setdefault(k, len(ids)))
    g = torch.tensor(gid, dtype=torch.long)
    m = len(ids)
    r = returns.to(torch.float64)
    count = torch.zeros(m, dtype=torch.float64).index_add_(0, g, torch.ones(n, dtype=torch.float64))
    mean = torch.zeros(m, dtype=torch.float64).index_add_(0, g, r) / count
    centred = r - mean[g]
    sq = torch.zeros(m, dtype=torch.float64).index_add_(0, g, centred**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    flat = std[g] <= eps  # groups of one (sq = 0) and groups of equal returns
    if norm == "std":
        centred = centred / torch.where(flat, 1.0, std[g] + eps)
    return torch.where(flat, 0.0, centred).to(torch.float32)


def step_credit_advantages(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    keys: Sequence[Hashable | None],
    *,
    gamma: float,
    weight: float,
    norm: StepNorm = "mean",
    episode_mode: AdvantageMode = "trajectory",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GiGPO's per-step advantage (N,): the trajectory's GRPO advantage (`grpo_advantages`,
    `episode_mode`) plus `weight` (omega) times the step's anchor-state advantage.

    rewards (G,) and lengths (G,) describe the group's trajectories; keys (N,) name each
    step's state, trajectory-major (see the module docstring)."""
    if weight < 0:
        raise ValueError(f"the step weight must be >= 0, got {weight}")
    lengths = lengths.to(torch.long)
    episode = grpo_advantages(rewards, lengths, mode=episode_mode, eps=eps)
    per_step = torch.repeat_interleave(episode, lengths)
    step = anchor_advantages(step_returns(rewards, lengths, gamma), keys, norm, eps=eps)
    return per_step + weight * step
