"""The staleness bound, wherever a row waits: the curator's half that judges and drops.

`CuratorCore` inherits it. It reads the core's version and lineage, its settings (the bound),
the versions of the rows it holds, its curated groups and queued steps, and drops through the
core's `_settle_drops`; `_make_step` and `_pack_steps` repack what a dropped group leaves.
The rule itself: no sample older than `version - max_staleness` reaches a gradient, judged by
its distance through the version tree (`Lineage.effective`), wherever it waits: the log, a
group filling, a curated group, a queued step, or a replay riding in a group.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from dart_ray.data.curation import GroupOutcome
from dart_ray.data.grouping import PendingGroup

if TYPE_CHECKING:
    from dart_ray.data.grouping import GroupBuffer
    from dart_ray.data.steps import CuratorMetrics, CuratorSettings, TrainStep
    from dart_ray.store.checkpoints import Lineage


class StalenessGuard:
    version: int
    lineage: Lineage
    s: CuratorSettings
    metrics: CuratorMetrics
    groups: GroupBuffer
    queue: deque[TrainStep]
    _ready: list[GroupOutcome]
    _versions: dict[int, int]

    def _settle_drops(self, rids: list[int], reason: str, at: str = "") -> None:
        raise NotImplementedError

    def _make_step(self, outs: list[GroupOutcome]) -> TrainStep:
        raise NotImplementedError

    def _pack_steps(self) -> None:
        raise NotImplementedError

    @property
    def min_version(self) -> int:
        """The oldest version a row may come from to reach a gradient now."""
        return self.version - self.s.max_staleness

    def _log_floor(self) -> int:
        """The lowest version tag that may still train, for the log's own filter (a SQL
        bound on tags): the bound, or lower where a tag below it is near enough through the
        version tree (a discarded tag, or an ancestor of weights a resume republished,
        `Lineage.effective`). Rows it lets through are judged exactly once held."""
        reach = len(self.lineage.discarded) * 2  # no tag is shifted by more than this
        lower = range(self.min_version - 1, self.min_version - 1 - reach, -1)
        return min([self.min_version, *(v for v in lower if not self._unfit(v))])

    def _unfit(self, version: int) -> str | None:
        """Why a sample of `version` may not reach a gradient now, or None: older than the
        bound, a discarded version by its distance through the version tree."""
        return "stale" if self.lineage.effective(version) < self.min_version else None

    def _keep_group(self, out: GroupOutcome, at: str) -> bool:
        """Whether a curated group may still train. Its own rows are judged as a whole (a
        GRPO group never trains with part of its members): one unfit row drops them all. A
        replay that went unfit is only taken out: it was an extra sample, and the members'
        advantages stay valid (the replay only moved their baseline)."""
        for why in filter(None, (self._unfit(self._versions[r]) for r in out.trained_rows)):
            self._settle_drops(out.trained_rows, why, at=at)
            return False
        if out.replayed is not None:
            replay = [s for s in out.samples if s.trajectory_id == out.replayed]
            if replay and self._unfit(min(s.weight_version for s in replay)):
                out.samples = [s for s in out.samples if s.trajectory_id != out.replayed]
                out.replayed = None
                self.metrics.replays_stale += 1
        return True

    def _drop_stale_held(self) -> None:
        """Drop every held row that may no longer train, wherever it waits: a group still
        filling, a curated group, a queued step."""

        def unfit(p: PendingGroup) -> bool:
            return any(self._unfit(r.version_num) for r in p.rows)

        for rows in self.groups.pop_where(unfit):
            why = next(filter(None, (self._unfit(r.version_num) for r in rows)))
            self._settle_drops([r.id for r in rows], why, at="filling")
        self._ready = [out for out in self._ready if self._keep_group(out, at="ready")]
        self._drop_stale_queued()

    def _drop_stale_queued(self) -> None:
        """A queued step keeps its groups that may still train; one that lost a group gives
        the rest back to the front of the ready groups, to form a step again; one that only
        lost a stale replay is packed again without it."""
        keep: deque[TrainStep] = deque()
        back: list[GroupOutcome] = []
        for st in self.queue:
            samples = st.num_samples
            groups = [g for g in st.groups if self._keep_group(g, at="queued")]
            if len(groups) < len(st.groups):
                back.extend(groups)
                self.metrics.steps_formed -= 1
                self.metrics.samples_formed -= samples
            elif sum(len(g.samples) for g in groups) < samples:
                repacked = self._make_step(groups)
                self.metrics.samples_formed -= samples - repacked.num_samples
                keep.append(repacked)
            else:
                keep.append(st)
        self.queue = keep
        if back:
            self._ready[:0] = back
            self._pack_steps()
