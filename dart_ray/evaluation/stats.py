"""Interval estimates of a learning claim over seeds and tasks (`dart-ray experiment`).

A run's lift is the change of success on the same held-out tasks before and after training:
paired by task. Runs of one arm differ by seed (and, in the decoupled mode, by timing: a run
is not reproducible by its seed), so an arm's lift is the mean over its runs, and its
uncertainty has two sources: which runs we happened to get, and which tasks the held-out set
happened to draw. The interval resamples both (a two-level bootstrap, as Agarwal et al.,
NeurIPS 2021, recommend for few runs): each replicate draws the arm's seeds with replacement
and, shared by every seed, the tasks with replacement, and takes the mean paired difference.

    lift* = mean_{s in S*} mean_{t in T*} (after[s, t] - before[t])

Comparing two arms resamples each arm's seeds on its own and the tasks once for both (the
arms were scored on the same tasks), so the task-to-task variation common to both cancels.
With one seed only the tasks are resampled: that is the evaluation's interval alone, and it
says nothing of the run-to-run spread (the JSON says how many seeds each arm had). With
three seeds the seed level has only ten distinct draws; the spread (min, max) is reported
beside the interval so a reader can see the runs themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_BOOT = 10_000


@dataclass(frozen=True)
class Lift:
    """An arm's paired lift on one split (success rates in 0..1)."""

    mean: float
    lo: float
    hi: float
    per_seed: tuple[float, ...]

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.per_seed), max(self.per_seed))


def _check(before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(before, dtype=np.float64)
    a = np.asarray(after, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 1 or a.shape[1] != b.shape[0] or a.shape[0] == 0:
        raise ValueError(f"after must be (seeds, tasks) and before (tasks,): {a.shape}, {b.shape}")
    return b, a


def _replicates(
    before: np.ndarray, after: np.ndarray, tasks: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """(n_boot,) replicate lifts, the task draw `tasks` (n_boot, T) given."""
    n_boot, s = tasks.shape[0], after.shape[0]
    seeds = rng.integers(0, s, size=(n_boot, s))
    diff = after - before  # (S, T)
    # mean over the drawn seeds of the mean over the drawn tasks, in two gathers
    per_seed = np.take_along_axis(diff[seeds], tasks[:, None, :], axis=2).mean(axis=2)
    return per_seed.mean(axis=1)


def paired_lift(
    before: np.ndarray, after: np.ndarray, *, n_boot: int = N_BOOT, seed: int = 0
) -> Lift:
    """Mean paired lift of `after` (seeds x tasks, 0/1 or rewards) over `before` (tasks) with
    its 95% percentile interval from the two-level bootstrap (the module docstring)."""
    b, a = _check(before, after)
    rng = np.random.default_rng(seed)
    tasks = rng.integers(0, b.shape[0], size=(n_boot, b.shape[0]))
    reps = _replicates(b, a, tasks, rng)
    per_seed = tuple(float(x) for x in (a - b).mean(axis=1))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return Lift(float(np.mean(per_seed)), float(lo), float(hi), per_seed)


def lift_difference(
    before: np.ndarray,
    after: np.ndarray,
    other: np.ndarray,
    *,
    other_before: np.ndarray | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean, lo, hi): the lift of `after` minus that of `other` (both seeds x tasks on the
    same tasks; `other_before` when the other arm started from another model), each arm's
    seeds resampled apart, the tasks once for both."""
    b, a = _check(before, after)
    ob, o = _check(before if other_before is None else other_before, other)
    rng = np.random.default_rng(seed)
    tasks = rng.integers(0, b.shape[0], size=(n_boot, b.shape[0]))
    reps = _replicates(b, a, tasks, rng) - _replicates(ob, o, tasks, rng)
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return float((a - b).mean() - (o - ob).mean()), float(lo), float(hi)
