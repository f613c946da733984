"""Staleness-aware admission, by hand (dart_ray/rollout/admission.py)."""

from __future__ import annotations

from dart_ray.rollout.admission import Pace, admitted_rows, may_open_group


def test_admitted_rows_is_the_queue_the_bound_leaves_room_for() -> None:
    # 64 rows leave the queue per version, a version every 20 s; bound 2, slack 0.5; episodes
    # take 10 s = 0.5 versions: horizon 2 - 0.5 - 0.5 = 1 version = 64 rows, 40 already wait
    pace = Pace(version=7, rows_per_version=64.0, versions_per_s=0.05, waiting_rows=40)
    assert admitted_rows(pace, max_staleness=2, slack=0.5, episode_s=10.0) == 64 - 40
    # episodes of 30 s (1.5 versions): nothing more can train within the bound
    assert admitted_rows(pace, max_staleness=2, slack=0.5, episode_s=30.0) == -40


def test_a_group_opens_while_the_rollouters_share_holds_it() -> None:
    pace = Pace(version=7, rows_per_version=64.0, versions_per_s=0.05, waiting_rows=40)
    kw = dict(group=8, max_staleness=2, slack=0.5, episode_s=10.0)
    # 24 rows admitted over 2 rollouters: 12 each; 0 + 8 <= 12 opens; 8 + 8 > 12 does not
    assert may_open_group(pace, running=4, rollouters=2, **kw)  # type: ignore[arg-type]
    assert not may_open_group(pace, running=8, rollouters=2, **kw)  # type: ignore[arg-type]
    # one rollouter holds all 24: 16 + 8 <= 24
    assert may_open_group(pace, running=16, rollouters=1, **kw)  # type: ignore[arg-type]


def test_the_run_never_stalls_on_its_own_gate() -> None:
    """A queue longer than the bound allows (a trainer stalled) holds new groups back, but a
    rollouter with nothing running opens one, and without a pace (the curator restarting)
    groups open."""
    full = Pace(version=3, rows_per_version=32.0, versions_per_s=0.0, waiting_rows=500)
    kw = dict(group=8, rollouters=1, max_staleness=2, slack=0.5, episode_s=60.0)
    assert not may_open_group(full, running=8, **kw)  # type: ignore[arg-type]
    assert may_open_group(full, running=0, **kw)  # type: ignore[arg-type]
    assert may_open_group(None, running=64, **kw)  # type: ignore[arg-type]
