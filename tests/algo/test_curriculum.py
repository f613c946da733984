"""Selection, rollout budget, step limits and replay against hand-derived numbers."""

from __future__ import annotations

import pytest
import torch

from dart_ray.algo.curriculum import replay_into_group, rollout_budget, step_limit
from dart_ray.algo.selection import select_high_entropy, step_entropy


def test_step_entropy_ignores_padding() -> None:
    # step 0: real tokens [1.0, 3.0] -> 2.0 (padding 9.0 ignored; DART-GUI's mean would be 4.33)
    # step 1: real token [0.5] -> 0.5
    ent = torch.tensor([[1.0, 3.0, 9.0], [0.5, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert step_entropy(ent, mask).tolist() == pytest.approx([2.0, 0.5])


def test_select_high_entropy_top_fraction() -> None:
    scores = torch.tensor([0.1, 0.9, 0.5, 0.9, 0.3])
    # rho 0.4 of 5 -> 2 steps: the two 0.9s (indices 1 and 3)
    assert select_high_entropy(scores, 0.4).tolist() == [1, 3]
    # rho 0.5 -> ceil(2.5) = 3: 1, 3 and 2 (0.5)
    assert select_high_entropy(scores, 0.5).tolist() == [1, 2, 3]
    assert select_high_entropy(scores, 1.0).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        select_high_entropy(scores, 0.0)


@pytest.mark.parametrize(
    "sr, n",
    # 9/sr - 7: 1.0 -> 2 ; 0.9 -> 3 ; 0.8 -> 4.25 -> 4 ; 0.7 -> 5.86 -> 5 ; 0.61 -> 7.75 -> 7
    [(1.0, 2), (0.9, 3), (0.8, 4), (0.7, 5), (0.61, 7), (0.6, 8), (0.2, 8), (0.0, 8), (None, 8)],
)
def test_dart_rollout_budget(sr: float | None, n: int) -> None:
    assert rollout_budget(sr) == n


def test_linear_rollout_budget() -> None:
    # n = round(8 - 7 * sr): sr 0 -> 8, 0.5 -> 4.5 -> 4 (banker's rounding), 1 -> 1
    assert [rollout_budget(s, rule="linear") for s in (0.0, 0.5, 1.0)] == [8, 4, 1]


def test_step_limit_from_successes() -> None:
    assert step_limit([], global_max=15) == 15
    # longest success 4 -> ceil(1.5 * 4) + 2 = 8
    assert step_limit([2, 4, 3], global_max=15) == 8
    assert step_limit([12], global_max=15) == 15  # never above the global limit


def test_replay_replaces_the_oldest_member_of_an_all_fail_group() -> None:
    group, idx = replay_into_group(["old", "mid", "new"], [False, False, False], "win")
    assert (group, idx) == (["win", "mid", "new"], 0)
    group, idx = replay_into_group(["a", "b"], [False, True], "win")
    assert (group, idx) == (["a", "b"], None)  # a group with a success is left alone
    assert replay_into_group(["a"], [False], None) == (["a"], None)  # nothing to replay
