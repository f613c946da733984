"""GRPO advantages over the trajectories of one task group.

    A_i = (R_i - mean_j R_j) / (std_j R_j + eps)                      (GRPO, eq. 3 of DeepSeekMath)

`trajectory` mode (the default) gives every trajectory one vote in the group statistics,
whatever its length, and applies A_i to every step of trajectory i. DART-GUI's release
instead computes the statistics over all *steps* of all trajectories (so a 30-step failure
outweighs a 3-step success ten to one) and does so after duplicating samples to fill the
batch; `step_weighted` reproduces the first bias (weights = step counts) for comparison.
The second (duplication) does not arise here: advantages are computed before packing.

std is the unbiased (Bessel-corrected) standard deviation, as in most GRPO implementations;
a group of one, or a group whose rewards are all equal, has advantage 0 for every member.
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageMode = Literal["trajectory", "step_weighted"]


def grpo_advantages(
    rewards: torch.Tensor,
    num_steps: torch.Tensor | None = None,
    *,
    mode: AdvantageMode = "trajectory",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages (G,) for one group of G trajectory rewards (G,).

    With mode `step_weighted`, `num_steps` (G,) weights each trajectory in the mean and std by
    its length, as if each step carried its trajectory's reward.
    """
    r = rewards.to(torch.float64)
    g = r.numel()
    if g < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    if mode == "trajectory":
        mean = r.mean()
        std = r.std(unbiased=True)
    elif mode == "step_weighted":
        if num_steps is None:
            raise ValueError("step_weighted advantages need num_steps")
        w = num_steps.to(torch.float64).clamp(min=1)
        n = w.sum()
        mean = (w * r).sum() / n
        # unbiased over the n weighted (step) samples, as torch.std over the expanded steps
        std = torch.sqrt((w * (r - mean) ** 2).sum() / (n - 1))
    else:
        raise ValueError(f"unknown advantage mode {mode!r}")
    if std < eps:
        return torch.zeros_like(rewards, dtype=torch.float32)
    return ((r - mean) / (std + eps)).to(torch.float32)
