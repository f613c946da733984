"""Staleness-aware admission, by hand (dart_ray/rollout/admission.py)."""

from __future__ import annotations

import asyncio

from dart_ray.rollout.admission import Gate, Pace, expected_lag, may_open_group, slow_group_s

KW = dict(max_staleness=2, slack=0.5)


def test_the_queue_drains_packed_steps_a_version_each_the_rest_at_the_rows_leaving() -> None:
    # 100 rows leave per version (64 handed in a step, 36 dropped without signal); one packed
    # step (64 curated rows) = 1 version; 20 rows waiting + 22 running + a group of 8 = 50
    # rows = 0.5 version: 1.5 by place. By time: a group of 60 s at a version per 100 s,
    # half the version being trained left: 0.6 - 0.5 + 1 = 1.1
    pace = Pace(7, 100.0, 0.01, waiting_rows=20, curated_rows=64, handed_per_version=64.0,
                training_left=0.5)  # fmt: skip
    ahead, own = expected_lag(pace, running=22, group=8, group_s=60.0)
    assert (ahead, round(own, 9)) == (1.5, 1.1)
    assert may_open_group(pace, running=22, group=8, rollouters=1, group_s=60.0, **KW)  # type: ignore[arg-type]


def test_two_packed_steps_hold_new_groups_that_one_would_let_open() -> None:
    """The timing benchmark's stale rows all waited in a packed step (queue_depth 2): behind
    a step in training and two packed ones, a row is handed out 3 versions later. Counted at
    the rows leaving (100 a version) two packed steps looked like 1.28 versions."""
    one = Pace(5, 100.0, 0.005, waiting_rows=0, curated_rows=64, handed_per_version=64.0)
    two = Pace(5, 100.0, 0.005, waiting_rows=0, curated_rows=128, handed_per_version=64.0)
    # one step: 1 + (8 + 8) / 100 = 1.16 <= 1.5; two: 2.16 > 1.5
    assert may_open_group(one, running=8, group=8, rollouters=1, group_s=50.0, **KW)  # type: ignore[arg-type]
    assert not may_open_group(two, running=8, group=8, rollouters=1, group_s=50.0, **KW)  # type: ignore[arg-type]


def test_a_group_that_ends_after_the_second_version_waits_however_short_the_queue() -> None:
    # an empty queue, a version every 100 s, 0.2 of it left: a group of 100 s ends after the
    # next version, before the one after: handed out at lag 2 (1.0 - 0.2 + 1 = 1.8);
    # a group of 150 s ends after two more and goes out at lag 3 (1.5 - 0.2 + 1 = 2.3 > 2)
    pace = Pace(3, 64.0, 0.01, waiting_rows=0, handed_per_version=64.0, training_left=0.2)
    assert may_open_group(pace, running=8, group=8, rollouters=1, group_s=100.0, **KW)  # type: ignore[arg-type]
    assert not may_open_group(pace, running=8, group=8, rollouters=1, group_s=150.0, **KW)  # type: ignore[arg-type]


def test_each_rollouter_keeps_to_its_share() -> None:
    # 100 rows per version, an empty queue: 1.5 versions = 150 rows over all; 2 rollouters
    # each running 64 + a group of 8: 2 x 72 = 144 fits, 3 x 72 does not
    pace = Pace(2, 100.0, 0.01, waiting_rows=0, handed_per_version=64.0)
    assert may_open_group(pace, running=64, group=8, rollouters=2, group_s=10.0, **KW)  # type: ignore[arg-type]
    assert not may_open_group(pace, running=64, group=8, rollouters=3, group_s=10.0, **KW)  # type: ignore[arg-type]


def test_the_slow_groups_are_the_90th_percentile_of_the_last() -> None:
    assert slow_group_s([]) == 0.0
    assert slow_group_s([5.0]) == 5.0
    assert slow_group_s([float(i) for i in range(1, 11)]) == 10.0  # index 9 of 10
    assert slow_group_s([float(i) for i in range(1, 21)]) == 19.0  # index 18 of 20


def test_the_run_never_stalls_on_its_own_gate() -> None:
    """A queue longer than the bound allows (a trainer stalled) holds new groups back, even
    from a rollouter with nothing running (the queue drains as the trainer publishes); with
    less than a version's rows waiting (the trainer would wait for data) a rollouter with
    nothing running opens one, however long its groups take; without a pace (the curator
    restarting) groups open."""
    full = Pace(version=3, rows_per_version=32.0, versions_per_s=0.0, waiting_rows=500)
    short = Pace(version=3, rows_per_version=32.0, versions_per_s=0.1, waiting_rows=24)
    kw = dict(group=8, rollouters=1, group_s=60.0, **KW)
    assert not may_open_group(full, running=8, **kw)  # type: ignore[arg-type]
    assert not may_open_group(full, running=0, **kw)  # type: ignore[arg-type]
    assert not may_open_group(short, running=8, **kw)  # 60 s x 0.1 + 1 = 7 versions  # type: ignore[arg-type]
    assert may_open_group(short, running=0, **kw)  # type: ignore[arg-type]
    assert may_open_group(None, running=64, **kw)  # type: ignore[arg-type]


def test_a_group_that_fills_every_session_waits_for_a_full_queue() -> None:
    """The default run (8 sessions, groups of 8, a step of 4 groups: 32 rows a version):
    each group finishes with nothing else running, and nothing running always opened the
    next one, so the gate never held and 11% of the rollouts went stale behind two packed
    steps. Two packed steps (2 versions) and a step in training: a group opened now goes out
    at lag 3; one packed step less, it opens."""
    full = Pace(9, 32.0, 0.4, waiting_rows=0, curated_rows=64, handed_per_version=32.0)
    room = Pace(9, 32.0, 0.4, waiting_rows=0, curated_rows=32, handed_per_version=32.0)
    kw = dict(group=8, rollouters=1, group_s=0.3, **KW)
    assert not may_open_group(full, running=0, **kw)  # type: ignore[arg-type]
    assert may_open_group(room, running=0, **kw)  # type: ignore[arg-type]


def test_groups_waiting_for_partners_never_hold_the_group_they_wait_for() -> None:
    """The rft arm of the default experiment: a curated group keeps only its successes, so a
    step (4 groups) hands about 8 rows; three curated groups with 12 successes waited for a
    fourth, counted as 1.5 versions, and held every new group with nothing running: two of
    three runs sat held 97% of their 8 minutes (3 and 14 versions against 217)."""
    stalled = Pace(9, 48.0, 0.0, waiting_rows=0, curated_rows=12, handed_per_version=8.0,
                   partner_rows=12)  # fmt: skip
    kw = dict(group=8, rollouters=1, group_s=1.0, **KW)
    assert may_open_group(stalled, running=0, **kw)  # type: ignore[arg-type]
    assert not may_open_group(stalled, running=8, **kw)  # with a group running, it may wait
    # a packed step of the same rows is a version the trainer can take: that holds
    packed = Pace(9, 48.0, 0.0, waiting_rows=0, curated_rows=12, handed_per_version=8.0)
    assert not may_open_group(packed, running=0, **kw)  # type: ignore[arg-type]


def test_rows_logged_since_the_pace_was_read_count_as_waiting() -> None:
    """The default run's stale rows: a rollouter reads the pace once a second and finished a
    group every 0.3 s; the groups it logged since the read were in neither `running` nor the
    pace, so it saw a short queue and opened groups that went out at lag 3. 32 rows a
    version, one step curated: 1 + (8 + 8) / 32 = 1.5 fits; 16 rows logged since the read
    make it 2.0 > 1.5."""
    pace = Pace(9, 32.0, 0.5, waiting_rows=0, curated_rows=32, handed_per_version=32.0)
    kw = dict(group=8, rollouters=1, group_s=0.3, **KW)
    assert may_open_group(pace, running=8, **kw)  # type: ignore[arg-type]
    assert not may_open_group(pace, running=8, logged=16, **kw)  # type: ignore[arg-type]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _gate(paces: list[Pace | None], clock: _Clock) -> tuple[Gate, list[float]]:
    """A gate whose curator answers `paces` in turn; the times it was asked."""
    asked: list[float] = []

    async def read() -> Pace | None:
        asked.append(clock.t)
        return paces.pop(0)

    gate = Gate(read, group=8, rollouters=1, max_staleness=2, slack=0.5, clock=clock)
    return gate, asked


def test_the_gate_reads_the_pace_once_a_period_and_counts_rows_logged_since_the_read() -> None:
    # the pace of the test above: 8 running fit (1.5); 16 rows logged since the read do not
    # (2.0); once the pace is read again it holds them, and 8 running fit again
    pace = Pace(9, 32.0, 0.5, waiting_rows=0, curated_rows=32, handed_per_version=32.0)
    clock = _Clock()
    gate, asked = _gate([pace, pace], clock)
    asyncio.run(gate.refresh())
    assert gate.admits(8)
    for _ in range(16):
        gate.logged()
    assert not gate.admits(8)
    clock.t = 0.9
    asyncio.run(gate.refresh())  # within the period: not read again
    assert asked == [0.0] and not gate.admits(8)
    clock.t = 1.0
    asyncio.run(gate.refresh())
    assert asked == [0.0, 1.0] and gate.admits(8)


def test_with_the_curator_away_the_gate_lets_groups_open_and_keeps_its_count() -> None:
    pace = Pace(9, 32.0, 0.5, waiting_rows=0, curated_rows=32, handed_per_version=32.0)
    clock = _Clock()
    gate, _ = _gate([pace, None, pace], clock)
    asyncio.run(gate.refresh())
    for _ in range(16):
        gate.logged()
    clock.t = 1.0
    asyncio.run(gate.refresh())  # away: no pace, any group may open
    assert gate.pace is None and gate.admits(64)
    clock.t = 2.0
    asyncio.run(gate.refresh())  # back: the 16 rows logged before the failed read are in it
    assert gate.admits(8)


def test_the_gate_waits_for_its_slow_groups_and_counts_the_time_it_held() -> None:
    # a version every 10 s with nothing left of it: a group of 25 s goes out at lag
    # 2.5 - 1 + 1 = 2.5 > 2, one of 15 s at 1.5
    pace = Pace(3, 64.0, 0.1, waiting_rows=0, handed_per_version=64.0, training_left=1.0)
    clock = _Clock()
    gate, _ = _gate([pace], clock)
    asyncio.run(gate.refresh())
    gate.group_done(15.0)
    assert gate.admits(8)
    gate.group_done(25.0)  # the slow groups are the 90th percentile: now 25 s
    assert not gate.admits(8)
    gate.holding(True)
    clock.t = 1.0
    gate.holding(True)  # the same hold
    clock.t = 3.0
    gate.holding(False)
    gate.holding(False)
    clock.t = 4.0
    gate.holding(True)
    clock.t = 4.5
    gate.holding(False)
    assert (gate.groups_held, gate.held_s) == (2, 3.5)
