"""The rollouter's report: environment utilisation is episode time over session time."""

from __future__ import annotations

import pytest

from dart_ray.rollout.report import RolloutReport


def test_occupancy_is_episode_seconds_over_sessions_times_wall() -> None:
    # 4 sessions for 10 s offer 40 session-seconds; 30 of them were inside episodes.
    assert RolloutReport(sessions=4, wall_s=10.0, episode_s=30.0).occupancy == pytest.approx(0.75)


def test_occupancy_of_a_report_that_has_not_run_is_zero() -> None:
    assert RolloutReport(sessions=4).occupancy == 0.0
    assert RolloutReport(wall_s=5.0, episode_s=1.0).occupancy == 0.0
