"""Staleness-aware admission: start only the episodes whose data can still train in time.

In the decoupled mode a rollouter that starts episodes as fast as its sessions free up
outruns a slow trainer, and a third of what it rolls out waits until it is older than
`curation.max_staleness` and is dropped (the timing benchmark: 2,348 of 7,118 rows): GPUs and
desktops spent for nothing. AReaL avoids it by not running ahead of the trainer; so does this.

A row trains when its step is handed to the trainer, and the trainer takes a step as it
publishes a version; at hand-out a row's lag is the versions published since it started.
With a step in training, the next step handed goes out one version later, the one after it
two, and so on. A group opened now at version v lands in the step its place in the queue
gives it, counted in steps (versions):

    ahead = curated_rows / handed_per_version + (waiting_rows + running + group) / rows_per_version

the curated groups and packed steps leaving at the trainer's rows per step, the rows not yet
curated (its own group's included) at the rows per version that leave the queue at all,
dropped ones included (a group without signal leaves without a step). That must stay within
`max_staleness - slack`: the slack covers what the count estimates (which groups will carry
signal, steps that leave partly filled). And the group must be done in time: its step cannot
go out before its slowest episode ends, so its lag is at least one more than the versions
published while it runs,

    own = group_s * versions_per_s - training_left + 1

(`group_s` the slow groups' duration, first episode started to last one logged: the 90th
percentile the rollouter measured, so no slack again; `training_left` what remains of the
version being trained). A group opens while both are within the bound.

The counts are the curator's (`CuratorCore.pace`, the log's unclaimed rows counted at the
call), the group duration the rollouter's. A rollouter reads the pace once a second and
finishes groups faster than that (a one-click group in 0.3 s against a step every 2 s): the
rows it logged since the read are not in the pace yet and count with the running ones.
Admission is decided per group (a GRPO group trains only whole), and a rollouter with nothing
running opens one group whenever the queue holds less than a version's rows, so a run can
never stall on its own gate (and a rollouter held with nothing running waits, reading the
pace, rather than ending its run). Dropping stale rows
stays the guarantee; admission only avoids producing them.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pace:
    """The trainer's pace and the queue ahead of a new group, as the curator sees them."""

    version: int
    """The newest published version."""
    rows_per_version: float
    """Rows that leave the queue (handed to the trainer, or dropped) per published version."""
    versions_per_s: float
    """Published versions per second (0 until measured, or while the trainer is stalled)."""
    waiting_rows: int
    """Logged rows not yet curated: unclaimed in the log, or in groups still filling."""
    curated_rows: int = 0
    """Rows of curated groups waiting for partners and of packed steps waiting for a trainer."""
    handed_per_version: float = 0.0
    """Rows handed to the trainer per published version (a step's rows; 0: not measured, then
    `rows_per_version` stands for it)."""
    training_left: float = 0.0
    """What is left of the version being trained, in versions (0 to 1): 1 - the time since the
    newest version x `versions_per_s`."""
    partner_rows: int = 0
    """Of `curated_rows`, those of curated groups waiting for partners to fill a step: they
    train only once more groups come."""

    def versions_ahead(self, rows: int, *, partners: bool = True) -> float:
        """Steps (versions) the queue holds up to `rows` more started now behind it;
        `partners=False` leaves out the groups waiting for partners (no step without more)."""
        rpv = max(self.rows_per_version, 1e-9)
        hpv = self.handed_per_version or rpv
        curated = self.curated_rows - (0 if partners else self.partner_rows)
        return curated / hpv + (self.waiting_rows + rows) / rpv


def expected_lag(pace: Pace, *, running: int, group: int, group_s: float) -> tuple[float, float]:
    """The versions a group opened now is behind when handed to the trainer (the module
    docstring): by its place in the queue, and by its own duration."""
    own = group_s * pace.versions_per_s - pace.training_left + 1.0
    return pace.versions_ahead(running + group), own


def may_open_group(
    pace: Pace | None,
    *,
    running: int,
    group: int,
    logged: int = 0,
    rollouters: int,
    max_staleness: int,
    slack: float,
    group_s: float,
) -> bool:
    """Whether a rollouter with `running` rows running or planned, and `logged` rows logged
    since `pace` was read, may open a group of `group` more: each of the `rollouters` is
    taken to run as much as this one (so a rollouter keeps to its share), and the group must
    still train within the bound. The run never stalls on the gate: a rollouter with nothing
    running may open a group whenever the queue holds less than a version's rows (the trainer
    would wait for data); with more, nothing it opens could train sooner than what waits, and
    the queue drains as the trainer publishes. Curated groups waiting for partners are not
    such a version: no step forms without more groups, so counting them held the very group
    they waited for (the rft arm: curated groups hold only their successes, fewer rows than a
    step's, and two of its three runs sat 97% of their 8 minutes held). Without a pace yet
    (the curator not reachable), it may.

    Before, nothing running always opened a group: where one group fills every session (the
    default run: 8 sessions, groups of 8) the gate never held at all, and 11% of the default
    run's rollouts went stale in a full queue."""
    if pace is None:
        return True
    if running == 0 and pace.versions_ahead(logged, partners=False) < 1.0:
        return True
    n = max(1, rollouters)
    mine = (running + logged) * n
    ahead, own = expected_lag(pace, running=mine, group=group * n, group_s=group_s)
    return ahead <= max_staleness - slack and own <= max_staleness


def slow_group_s(durations: Sequence[float]) -> float:
    """The slow groups' duration: the 90th percentile of the last groups' (0 before any)."""
    if not durations:
        return 0.0
    ordered = sorted(durations)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


class Gate:
    """One rollouter's admission: the pace it last read (at most every `period` s), the rows
    it logged since, its last groups' durations, and how long it held sessions idle. No Ray:
    `read_pace` is the rollouter's call to the curator (None while it is away)."""

    def __init__(
        self,
        read_pace: Callable[[], Awaitable[Pace | None]],
        *,
        group: int,
        rollouters: int,
        max_staleness: int,
        slack: float,
        period: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_pace = read_pace
        self._group, self._rollouters = group, rollouters
        self._max_staleness, self._slack = max_staleness, slack
        self._period, self._clock = period, clock
        self.pace: Pace | None = None
        self._read_at = -math.inf
        self._logged = 0
        self._logged_at_read = 0
        """Rows logged when the pace in hand was asked for (those since are not in it)."""
        self._durations: deque[float] = deque(maxlen=32)
        """The last groups' durations, first slot planned to last member logged."""
        self._held_since: float | None = None
        self.groups_held = 0
        """Times a new group was held back while a session was free."""
        self.held_s = 0.0
        """Seconds sessions were held idle (at least one free, none started)."""

    async def refresh(self) -> None:
        """Read the pace again if the one in hand is `period` old."""
        if self._clock() - self._read_at < self._period:
            return
        self._read_at = self._clock()
        asked_at = self._logged
        self.pace = await self._read_pace()
        if self.pace is not None:
            self._logged_at_read = asked_at

    def logged(self) -> None:
        """A row was logged."""
        self._logged += 1

    def group_done(self, seconds: float) -> None:
        """A group finished, `seconds` after its first slot was planned."""
        self._durations.append(seconds)

    def admits(self, running: int) -> bool:
        """Whether a group may open with `running` rows running or planned (`may_open_group`)."""
        return may_open_group(
            self.pace,
            running=running,
            group=self._group,
            logged=self._logged - self._logged_at_read,
            rollouters=self._rollouters,
            max_staleness=self._max_staleness,
            slack=self._slack,
            group_s=slow_group_s(self._durations),
        )

    def holding(self, held: bool) -> None:
        """Whether sessions are held idle now: counts the holds and their time."""
        now = self._clock()
        if held and self._held_since is None:
            self._held_since = now
            self.groups_held += 1
        elif not held and self._held_since is not None:
            self.held_s += now - self._held_since
            self._held_since = None
