"""Back-off of tasks without signal: group kinds, streaks and skips on hand-built groups."""

from __future__ import annotations

import pytest

from dart_ray.algo.curriculum import Backoff, Outcome, group_kinds, no_signal_streak
from dart_ray.records import Status

OK, TR, AB, EE, PE = (
    Status.OK,
    Status.TRUNCATED,
    Status.ABORTED,
    Status.ENV_ERROR,
    Status.POLICY_ERROR,
)


def rows(gid: str, size: int, *members: tuple[float, Status]) -> list[Outcome]:
    return [Outcome(gid, size, r, s) for r, s in members]


def test_group_kinds_newest_first() -> None:
    log = [
        # g5: 1 of 4 logged, a fail: nothing decided yet
        *rows("g5", 4, (0.0, OK)),
        # g4: 2 of 4 logged, but 0 and 1 differ already: signal, whatever comes next
        *rows("g4", 4, (1.0, OK), (0.0, TR)),
        # g3: full, all fail (a retried ABORTED attempt fills no slot)
        *rows("g3", 2, (0.0, OK), (0.0, AB), (0.0, TR)),
        # g2: full, all success
        *rows("g2", 2, (1.0, OK), (1.0, OK)),
        # g1: an ENV_ERROR member: the curator trains it in no case
        *rows("g1", 2, (0.0, OK), (0.0, EE)),
        # g0: full, but one trainable member (a policy error fills the other slot)
        *rows("g0", 2, (0.0, OK), (0.0, PE)),
        # no group id: ignored
        Outcome("", 0, 0.0, OK),
    ]
    assert group_kinds(log, threshold=1.0) == ["open", "signal", "failed", "solved", "void", "void"]


def test_group_kinds_order_follows_each_groups_newest_row() -> None:
    # rows of two groups interleave (newest first): b's newest row is newer than a's
    log = [
        Outcome("b", 2, 0.0, OK),
        Outcome("a", 2, 0.0, OK),
        Outcome("b", 2, 0.0, OK),
        Outcome("a", 2, 0.0, OK),
    ]
    assert group_kinds(log, threshold=1.0) == ["failed", "failed"]
    # equal partial rewards below the threshold are a failure; at it, a success
    assert group_kinds(rows("x", 2, (0.5, OK), (0.5, OK)), threshold=1.0) == ["failed"]
    assert group_kinds(rows("x", 2, (0.5, OK), (0.5, OK)), threshold=0.5) == ["solved"]


def test_streak_counts_failed_groups_up_to_the_first_with_signal() -> None:
    kinds = ["open", "failed", "void", "failed", "failed", "signal", "failed"]
    # open and void are passed over; the signal group ends it: 3
    assert no_signal_streak(kinds) == 3  # type: ignore[arg-type]
    # a fresh success to replay makes an all-fail group train: no streak at all
    assert no_signal_streak(kinds, replay=True) == 0  # type: ignore[arg-type]
    # all-success groups end the streak, unless they count too
    mixed = ["failed", "solved", "failed", "signal"]
    assert no_signal_streak(mixed) == 1  # type: ignore[arg-type]
    assert no_signal_streak(mixed, count_solved=True) == 3  # type: ignore[arg-type]
    assert no_signal_streak(["solved", "solved"], count_solved=True, replay=True) == 2
    assert no_signal_streak([]) == 0


def test_skips_double_with_each_retry_that_finds_nothing() -> None:
    b = Backoff(after=3, max_skips=8)
    # streak 0..2: no skip; 3: 1; 4 (the retry found nothing): 2; 5: 4; 6: 8; then capped
    assert [b.skips(s) for s in range(9)] == [0, 0, 0, 1, 2, 4, 8, 8, 8]
    # the skips reach max_skips at streak 3 + log2(8) = 6: the groups worth reading
    assert b.window == 6
    assert Backoff(after=1, max_skips=5).window == 1 + 3  # ceil(log2 5) = 3
    assert [Backoff(after=1, max_skips=5).skips(s) for s in (1, 2, 3, 4, 50)] == [1, 2, 4, 5, 5]
    assert Backoff(after=2, max_skips=1).window == 2
    with pytest.raises(ValueError):
        Backoff(after=0)
    with pytest.raises(ValueError):
        Backoff(max_skips=0)
