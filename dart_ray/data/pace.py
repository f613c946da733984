"""The trainer's pace as the curator sees it, for staleness-aware admission
(`dart_ray.rollout.admission`): rows leaving the queue and versions published, over the last
few versions."""

from __future__ import annotations

from collections import deque

from dart_ray.data.steps import CuratorMetrics
from dart_ray.rollout.admission import Pace


def rows_left(metrics: CuratorMetrics) -> tuple[int, int]:
    """Rows that have left the queue so far (handed to a trainer, or dropped for what they
    are: no signal, an environment error, ...), and those handed. Rows dropped as stale do
    not count: admission is there to produce none, and counting them would read a queue that
    drops its rows as one that drains fast, and open more groups the more went stale (the
    feedback the default run showed: 27% of rollouts stale)."""
    handed = metrics.rows_handed
    gone = sum(n for why, n in metrics.dropped.items() if why != "stale")
    return handed + gone, handed


class PaceMeter:
    """(time, version, rows left, rows handed) at each new version, the newest 8."""

    def __init__(self, nominal_rows: float) -> None:
        self.nominal = nominal_rows
        """A step's rows (groups_per_step x group_size): the pace before it is measured."""
        self._marks: deque[tuple[float, int, tuple[int, int]]] = deque(maxlen=8)

    @property
    def marked(self) -> bool:
        return bool(self._marks)

    def mark(self, now: float, version: int, metrics: CuratorMetrics) -> None:
        self._marks.append((now, version, rows_left(metrics)))

    def pace(self, version: int, waiting: int, curated: int, now: float, partners: int = 0) -> Pace:
        """The pace over the marks: rows leaving per version, rows handed per version,
        versions per second (counting the time since the newest version, so it falls while
        the trainer stalls) and what is left of the version in training. Before two
        versions are marked: a step's nominal rows per version and no rate."""
        rpv, hpv, vps, left = self.nominal, self.nominal, 0.0, 0.0
        if len(self._marks) >= 2:
            (t0, v0, (r0, h0)), (t1, v1, (r1, h1)) = self._marks[0], self._marks[-1]
            rpv = (r1 - r0) / (v1 - v0) or self.nominal
            hpv = (h1 - h0) / (v1 - v0) or self.nominal
            vps = (v1 - v0) / max(now - t0, 1e-9)
            left = max(0.0, 1.0 - (now - t1) * vps)
        return Pace(version, rpv, vps, waiting, curated, hpv, left, partners)
