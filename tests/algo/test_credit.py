"""Step-level (GiGPO) credit against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dart_ray.algo.credit import anchor_advantages, step_credit_advantages, step_returns

SQRT_HALF = math.sqrt(0.5)


def test_step_returns_discount_from_the_end() -> None:
    # A: R = 1 in 2 steps -> [0.9^1, 0.9^0] = [0.9, 1.0]
    # B: R = 0 in 3 steps -> [0, 0, 0]
    # C: R = 2 in 3 steps -> [2 * 0.81, 2 * 0.9, 2] = [1.62, 1.8, 2.0]
    r = step_returns(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([2, 3, 3]), 0.9)
    assert r.tolist() == pytest.approx([0.9, 1.0, 0.0, 0.0, 0.0, 1.62, 1.8, 2.0])
    # gamma = 1: every step carries its trajectory's reward
    one = step_returns(torch.tensor([1.0, 0.0]), torch.tensor([2, 1]), 1.0)
    assert one.tolist() == [1.0, 1.0, 0.0]
    # a trajectory without steps contributes nothing
    assert step_returns(torch.tensor([1.0, 0.5]), torch.tensor([0, 1]), 0.5).tolist() == [0.5]


def test_step_returns_refuse_a_bad_gamma() -> None:
    for gamma in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="gamma"):
            step_returns(torch.tensor([1.0]), torch.tensor([1]), gamma)


def test_anchor_advantages_mean_and_std() -> None:
    # returns [0.9, 1.0, 0.0, 0.0, 0.0] at states [s0, a1, s0, b1, b2]:
    # s0 holds {0.9, 0.0}: mean 0.45 -> +0.45, -0.45; every other state is alone -> 0
    returns = torch.tensor([0.9, 1.0, 0.0, 0.0, 0.0])
    keys = ["s0", "a1", "s0", "b1", "b2"]
    mean = anchor_advantages(returns, keys, "mean")
    assert mean.tolist() == pytest.approx([0.45, 0.0, -0.45, 0.0, 0.0])
    # std: unbiased std of {0.9, 0} = 0.9 / sqrt(2); 0.45 / (0.9 / sqrt(2)) = 1 / sqrt(2)
    std = anchor_advantages(returns, keys, "std", eps=0.0)
    assert std.tolist() == pytest.approx([SQRT_HALF, 0.0, -SQRT_HALF, 0.0, 0.0])


def test_anchor_groups_of_equal_returns_or_unknown_states_get_nothing() -> None:
    # s holds {1, 1, 1}: equal -> 0 (in both norms, no division by a zero std)
    # None states are never grouped, even with each other
    returns = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])
    keys = ["s", "s", "s", None, None]
    for norm in ("mean", "std"):
        assert anchor_advantages(returns, keys, norm).tolist() == [0.0] * 5  # type: ignore[arg-type]


def test_anchor_keys_must_match_the_returns() -> None:
    with pytest.raises(ValueError, match="2 keys for 3 returns"):
        anchor_advantages(torch.zeros(3), ["a", "b"])


def test_two_trajectories_sharing_their_first_state() -> None:
    """The example of the issue: A succeeds in 2 steps (s0 -> a1 -> done, R = 1), B fails in 3
    (s0 -> b1 -> b2 -> done, R = 0), gamma 0.9, omega 1, mean norm.

    returns: A [0.9, 1.0], B [0, 0, 0] (test_step_returns_discount_from_the_end)
    episode: rewards [1, 0], mean 0.5, unbiased std sqrt(0.5) -> A^E = [+0.7071, -0.7071]
    step:    s0 holds {0.9 (A0), 0 (B0)}, mean 0.45 -> A0 +0.45, B0 -0.45; the rest alone, 0
    total:   A [0.7071 + 0.45, 0.7071] = [1.1571, 0.7071]
             B [-0.7071 - 0.45, -0.7071, -0.7071] = [-1.1571, -0.7071, -0.7071]
    The choice made at the shared state gets more credit (and blame) than the steps after it.
    """
    rewards, lengths = torch.tensor([1.0, 0.0]), torch.tensor([2, 3])
    keys = ["s0", "a1", "s0", "b1", "b2"]
    a = step_credit_advantages(rewards, lengths, keys, gamma=0.9, weight=1.0, eps=0.0)
    h = SQRT_HALF
    assert a.tolist() == pytest.approx([h + 0.45, h, -h - 0.45, -h, -h])
    # omega 0 is trajectory-level GRPO, every step carrying its trajectory's advantage
    z = step_credit_advantages(rewards, lengths, keys, gamma=0.9, weight=0.0, eps=0.0)
    assert z.tolist() == pytest.approx([h, h, -h, -h, -h])
    # omega 2 with std norm: A0 = h + 2 * h = 3h, B0 = -3h (s0's step advantage is +-h)
    s = step_credit_advantages(rewards, lengths, keys, gamma=0.9, weight=2.0, norm="std", eps=0.0)
    assert s.tolist() == pytest.approx([3 * h, h, -3 * h, -h, -h])


def test_a_wasted_turn_gets_less_credit_than_the_direct_path() -> None:
    """Three trajectories, gamma 0.9, omega 1, mean norm:

    A: s0 -> s1 -> success          R = 1, returns [0.9, 1.0]
    B: s0 -> s2 -> s2 -> failure    R = 0, returns [0, 0, 0]
    C: s0 -> s0 -> s1 -> success    R = 1, returns [0.81, 0.9, 1.0] (its first click did nothing)

    episode: rewards [1, 0, 1], mean 2/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3,
             std 0.57735 -> A^E = [0.57735, -1.1547, 0.57735]
    s0: {A0 0.9, B0 0, C0 0.81, C1 0.9}, mean 2.61 / 4 = 0.6525
        -> A0 +0.2475, B0 -0.6525, C0 +0.1575, C1 +0.2475
    s1: {A1 1.0, C2 1.0} equal -> 0;  s2: {B1 0, B2 0} equal -> 0
    C's wasted click at s0 (+0.1575) gets less than the clicks from s0 that made progress
    (+0.2475, A's and C's second).
    """
    rewards, lengths = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([2, 3, 3])
    keys = ["s0", "s1", "s0", "s2", "s2", "s0", "s0", "s1"]
    a = step_credit_advantages(rewards, lengths, keys, gamma=0.9, weight=1.0, eps=0.0)
    e1, e0 = 1 / math.sqrt(3), -2 / math.sqrt(3)  # 0.57735, -1.1547
    expected = [
        e1 + 0.2475,
        e1,
        e0 - 0.6525,
        e0,
        e0,
        e1 + 0.1575,
        e1 + 0.2475,
        e1,
    ]
    assert a.tolist() == pytest.approx(expected, abs=1e-6)


def test_step_weighted_episode_statistics_carry_over() -> None:
    # episode_mode is passed to grpo_advantages: rewards [1, 0] with 1 and 3 steps,
    # step_weighted -> A^E = [1.5, -0.5] (test_advantages); no shared state -> no step term
    a = step_credit_advantages(
        torch.tensor([1.0, 0.0]),
        torch.tensor([1, 3]),
        ["x", "y", "z", "w"],
        gamma=0.9,
        weight=1.0,
        episode_mode="step_weighted",
        eps=0.0,
    )
    assert a.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])


def test_a_negative_step_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="step weight"):
        step_credit_advantages(
            torch.tensor([1.0]), torch.tensor([1]), ["s"], gamma=0.9, weight=-1.0
        )
