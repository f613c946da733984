"""Collect claimed trajectories into GRPO groups.

A group is one rollout round of one task (`group_id`, stamped by the rollouter, with its
`group_size` slots). It is complete when every slot has a final trajectory: OK, TRUNCATED or
ENV_ERROR (retries that ended ABORTED ride along but do not fill a slot). Rows logged without
a group id fall back to grouping by task with the configured size. A group that waits longer
than the timeout is released partial if it has at least `min_group` final members; one that
still has fewer after `abandon_s` is given up (`pop_abandoned`: the curator drops its rows
with the reason `group_incomplete`, instead of holding them forever).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dart_ray.records import Status
from dart_ray.store.log_rows import LogRow


@dataclass
class PendingGroup:
    target: int
    first_seen: float
    rows: list[LogRow] = field(default_factory=list)

    @property
    def final(self) -> int:
        return sum(1 for r in self.rows if r.status is not Status.ABORTED)


class GroupBuffer:
    def __init__(
        self, default_size: int, min_group: int, timeout_s: float, abandon_s: float = float("inf")
    ) -> None:
        self.default_size = default_size
        self.min_group = min_group
        self.timeout_s = timeout_s
        self.abandon_s = abandon_s
        self._pending: dict[str, PendingGroup] = {}

    @staticmethod
    def key(row: LogRow) -> str:
        return row.group_id or f"task:{row.task_id}"

    def add(self, row: LogRow, now: float) -> None:
        k = self.key(row)
        p = self._pending.get(k)
        if p is None:
            target = row.group_size if row.group_id and row.group_size > 0 else self.default_size
            p = self._pending[k] = PendingGroup(target=target, first_seen=now)
        p.rows.append(row)

    def pop_ready(self, now: float) -> list[list[LogRow]]:
        """Groups that are complete, or timed out with enough members; oldest first."""
        ready = []
        for k, p in sorted(self._pending.items(), key=lambda kv: kv[1].first_seen):
            if p.final >= p.target or (
                now - p.first_seen >= self.timeout_s and p.final >= self.min_group
            ):
                ready.append(k)
        return [self._pending.pop(k).rows for k in ready]

    def put_back(self, groups: list[list[LogRow]], now: float) -> None:
        """Return popped groups that were not curated (the caller failed on an earlier one),
        complete as they were: the next `pop_ready` hands them out again."""
        for rows in groups:
            for row in rows:
                self.add(row, now)
            self._pending[self.key(rows[0])].first_seen = now - self.timeout_s

    def pop_abandoned(self, now: float) -> list[list[LogRow]]:
        """Groups that waited `abandon_s` and are still below `min_group`: they will never
        train (their other members are lost or were dropped)."""
        return self.pop_where(
            lambda p: now - p.first_seen >= self.abandon_s and p.final < self.min_group
        )

    def pop_where(self, pred: Callable[[PendingGroup], bool]) -> list[list[LogRow]]:
        """Remove and return the rows of every pending group matching `pred`."""
        gone = [k for k, p in self._pending.items() if pred(p)]
        return [self._pending.pop(k).rows for k in gone]

    def pending_rows(self) -> list[LogRow]:
        return [r for p in self._pending.values() for r in p.rows]

    def __len__(self) -> int:
        return len(self._pending)
