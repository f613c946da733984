"""Staleness-aware admission: start only the episodes whose data can still train in time.

A row trains when every row ahead of it has left the queue (trained, or dropped by the
curator). In the decoupled mode a rollouter that starts episodes as fast as its sessions free
up outruns a slow trainer, and a third of what it rolls out waits until it is older than
`curation.max_staleness` and is dropped (the timing benchmark: 2,348 of 7,118 rows): GPUs and
desktops spent for nothing. AReaL avoids it by not running ahead of the trainer; so does this.

An episode started now at version v0 logs its row after its duration d; then the rows ahead
of it (those waiting now, and those running or planned beside it) leave the queue at the
trainer's pace, `rows_per_version` per published version. Its lag when trained is about

    d * versions_per_s  +  (waiting + running) / rows_per_version

which must stay within `max_staleness - slack`. So the rows allowed running or planned, over
all rollouters, are

    admitted = rows_per_version * (max_staleness - slack - d * versions_per_s) - waiting

The pace is measured by the curator (`CuratorCore.pace`), the episode duration by the
rollouter. Admission is decided per group (a GRPO group trains only whole), and a rollouter
with nothing running always opens one group, so a run can never stall on its own gate.
Dropping stale rows stays the guarantee; admission only avoids producing them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pace:
    """The trainer's pace and the queue ahead of a new episode, as the curator sees them."""

    version: int
    """The newest published version."""
    rows_per_version: float
    """Rows that leave the queue (handed to the trainer, or dropped) per published version."""
    versions_per_s: float
    """Published versions per second (0 until measured, or while the trainer is stalled)."""
    waiting_rows: int
    """Logged rows not yet handed to the trainer: unclaimed in the log, or held by the
    curator (groups filling, curated groups, queued steps)."""


def admitted_rows(pace: Pace, *, max_staleness: int, slack: float, episode_s: float) -> float:
    """Rows that may be running or planned across all rollouters (see the module docstring);
    negative when the queue alone is already as long as the bound allows."""
    horizon = max_staleness - slack - episode_s * pace.versions_per_s
    return pace.rows_per_version * horizon - pace.waiting_rows


def may_open_group(
    pace: Pace | None,
    *,
    running: int,
    group: int,
    rollouters: int,
    max_staleness: int,
    slack: float,
    episode_s: float,
) -> bool:
    """Whether a rollouter with `running` rows running or planned may open a group of `group`
    more: its share (1 / rollouters) of the admitted rows must hold them, or nothing of its
    own is running (so the run always moves). Without a pace yet (the curator not reachable),
    it may."""
    if pace is None or running == 0:
        return True
    share = admitted_rows(
        pace, max_staleness=max_staleness, slack=slack, episode_s=episode_s
    ) / max(1, rollouters)
    return running + group <= share
