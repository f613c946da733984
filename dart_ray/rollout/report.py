"""What a rollouter reports: episodes started and logged, groups, session time, admission."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RolloutReport:
    started: int = 0
    logged: Counter[str] = field(default_factory=Counter)
    """Trajectories logged, by status (retried ABORTED attempts included)."""
    groups_completed: int = 0
    successes: int = 0
    episode_s: float = 0.0
    """Session-seconds spent inside episodes."""
    wall_s: float = 0.0
    """Seconds since the first `run()` began, to the end of the last one: in the synchronous
    baseline this includes the waits for training between iterations, which is the idle time
    the utilisation must count."""
    sessions: int = 0
    groups_held: int = 0
    """Times staleness-aware admission held a new group back while a session was free."""
    held_s: float = 0.0
    """Seconds during which admission held sessions idle (at least one free, none started)."""
    backoff_skips: int = 0
    """Task visits back-off skipped (tasks without signal in their recent groups)."""
    seeds_again: Counter[str] = field(default_factory=Counter)
    """Replay seeds played again by task, once their task's newest success had aged."""

    @property
    def occupancy(self) -> float:
        """Fraction of session time spent in an episode: environment utilisation."""
        return (
            self.episode_s / (self.wall_s * self.sessions) if self.wall_s and self.sessions else 0.0
        )
