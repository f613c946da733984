"""GRPO advantages against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dart_ray.algo.advantages import grpo_advantages


def test_trajectory_mode_one_vote_per_trajectory() -> None:
    # rewards [1, 0, 0, 0]: mean 0.25; unbiased var = (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5
    # A = [(1 - 0.25) / 0.5, (0 - 0.25) / 0.5 x3] = [1.5, -0.5, -0.5, -0.5]
    a = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), eps=0.0)
    assert a.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # the step counts do not matter in trajectory mode
    b = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([3, 30, 30, 30]), eps=0.0)
    assert b.tolist() == a.tolist()


def test_step_weighted_mode_lets_long_trajectories_dominate() -> None:
    # rewards [1, 0] with 1 and 3 steps: as the 4 step samples [1, 0, 0, 0] -> mean 0.25,
    # unbiased std over 4 samples 0.5 (as above): A = [1.5, -0.5]
    a = grpo_advantages(
        torch.tensor([1.0, 0.0]), torch.tensor([1, 3]), mode="step_weighted", eps=0.0
    )
    assert a.tolist() == pytest.approx([1.5, -0.5])
    # trajectory mode on the same group: mean 0.5, std sqrt(0.5) -> A = +-0.5/0.7071 = +-0.7071
    t = grpo_advantages(torch.tensor([1.0, 0.0]), eps=0.0)
    assert t.tolist() == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)])


def test_degenerate_groups_have_zero_advantage() -> None:
    assert grpo_advantages(torch.tensor([1.0])).tolist() == [0.0]
    assert grpo_advantages(torch.tensor([0.0, 0.0, 0.0])).tolist() == [0.0, 0.0, 0.0]
    assert grpo_advantages(torch.tensor([1.0, 1.0])).tolist() == [0.0, 0.0]


def test_advantages_are_zero_mean_and_unit_std() -> None:
    r = torch.tensor([0.2, 0.9, 0.4, 1.0, 0.0, 0.7])
    a = grpo_advantages(r, eps=0.0)
    assert float(a.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(a.std()) == pytest.approx(1.0, abs=1e-5)


def test_step_weighted_needs_steps() -> None:
    with pytest.raises(ValueError, match="need num_steps"):
        grpo_advantages(torch.tensor([1.0, 0.0]), mode="step_weighted")
