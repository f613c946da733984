"""High-entropy step selection: train on the steps where the policy was most uncertain.

A step's score is the mean entropy of its response tokens, over real tokens only. DART-GUI's
(commented-out) version averaged over the padded length too, which ranks short responses as
low-entropy whatever their content; here padding never counts.
"""

from __future__ import annotations

import math

import torch

from dart_ray.algo.losses import masked_mean


def step_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) token entropies and mask -> (N,) mean entropy over each step's real tokens."""
    return masked_mean(entropy, mask, dim=1)


def select_high_entropy(scores: torch.Tensor, top_fraction: float) -> torch.Tensor:
    """Indices (ascending) of the ceil(top_fraction * N) highest scores; ties keep order."""
    if not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
    n = scores.numel()
    k = min(n, math.ceil(top_fraction * n))
    if k == n:
        return torch.arange(n)
    order = torch.argsort(-scores, stable=True)
    return order[:k].sort().values
