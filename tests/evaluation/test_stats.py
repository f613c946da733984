"""The experiment's interval estimates, against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dart_ray.evaluation.stats import lift_difference, paired_lift


def test_two_tasks_one_seed_give_the_task_bootstrap_by_hand() -> None:
    # differences [1, 0]: a replicate draws 2 tasks with replacement, so its mean is
    # 0 (p 1/4), 0.5 (p 1/2) or 1 (p 1/4): the 2.5% and 97.5% percentiles are 0 and 1
    lift = paired_lift(np.array([0.0, 0.0]), np.array([[1.0, 0.0]]))
    assert (lift.mean, lift.lo, lift.hi) == (0.5, 0.0, 1.0)
    assert lift.per_seed == (0.5,) and lift.spread == (0.5, 0.5)


def test_seeds_that_agree_and_tasks_that_agree_leave_no_width() -> None:
    before = np.zeros(50)
    lift = paired_lift(before, np.ones((3, 50)))
    assert (lift.mean, lift.lo, lift.hi) == (1.0, 1.0, 1.0)


def test_the_interval_widens_with_the_spread_between_seeds() -> None:
    # every seed's lift is 0.3 on 200 tasks (60 flips to success), or 0.0 / 0.3 / 0.6:
    # same mean 0.3, but the seed draws now move the replicate (a draw of three 0.0 seeds
    # has probability 1/27, so the 2.5% point is 0 or near it)
    before = np.zeros(200)
    same = np.zeros((3, 200))
    same[:, :60] = 1.0
    spread = np.zeros((3, 200))
    spread[1, :60] = 1.0
    spread[2, :120] = 1.0
    a, b = paired_lift(before, same), paired_lift(before, spread)
    assert a.mean == pytest.approx(0.3) and b.mean == pytest.approx(0.3)
    assert b.spread == (0.0, 0.6)
    assert (b.hi - b.lo) > 2 * (a.hi - a.lo)
    assert b.lo <= 0.05 and b.hi >= 0.55


def test_paired_by_task_so_a_shared_task_effect_cancels_in_a_difference() -> None:
    # arm A solves tasks 0-99 after, arm B tasks 0-89 (both from nothing): A - B = 10 of 200
    # tasks = 0.05. The shared 90 cancel, so a replicate's difference is (drawn copies of the
    # 10 tasks) / 200 ~ Binomial(200, 0.05) / 200: sd sqrt(.05 x .95 / 200) = 0.015, an
    # interval of about +-0.03; unpaired, each arm's rate alone (sd 0.035) would give +-0.1
    before = np.zeros(200)
    a, b = np.zeros((2, 200)), np.zeros((2, 200))
    a[:, :100] = 1.0
    b[:, :90] = 1.0
    diff, lo, hi = lift_difference(before, a, b)
    assert diff == pytest.approx(0.05)
    assert 0.01 < lo < 0.05 < hi < 0.09


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="seeds, tasks"):
        paired_lift(np.zeros(3), np.zeros((2, 4)))
