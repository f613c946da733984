"""The curator's logic, without Ray: claim -> filter -> group -> curate -> pack -> queue -> ack.

`CuratorCore.poll()` does one round: expire and claim rows from the durable log (only while
the queue has room, and never more than `max_held_rows` held in all: that is the
backpressure, and unclaimed rows are the visible "unused buffer"), drop rows older than the staleness bound, read their trajectories from blob
storage, complete groups, curate them, and when enough groups are ready pack one training
step (one Arrow shard per rank). Rows of a step are acknowledged only by `ack(step)`, after
the trainer's optimizer step that used them (the trainer does it, once those weights are in
a durable checkpoint); rows dropped during curation are settled at once with their reason.
The curator renews the leases of rows it holds; once a step is handed out, its trainer
renews them. A dead curator's or trainer's rows return to the pool when their lease ends.

Bad data never stalls the run: a row whose blob cannot be read, a group whose curation raises
and a group whose samples cannot be packed are quarantined (`DurableLog.quarantine`: settled
with the reason, counted by the audit), and the other groups go on.

Staleness is enforced wherever a row waits, not only in the log: every poll drops (reason
`stale`) a pending group, a curated group or a queued step that holds a row older than
`version - max_staleness`, and `take_step` checks again at hand-out, so no sample older than
the bound reaches a gradient. That includes success replays: a task's newest success is
replayed into an all-fail group only while it is within the bound, and a step's oldest
version counts the replayed samples. A group that stays below `min_group` for `group_abandon_s` is
dropped (`group_incomplete`) rather than held forever.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from dart_ray.data.batches import pack
from dart_ray.data.curation import GroupOutcome, curate_group
from dart_ray.data.grouping import GroupBuffer
from dart_ray.data.pace import PaceMeter
from dart_ray.data.staleness import StalenessGuard
from dart_ray.data.steps import CuratorMetrics, CuratorSettings, TrainStep
from dart_ray.records import Status, Trajectory
from dart_ray.rollout.admission import Pace
from dart_ray.store.blobs import BlobStore
from dart_ray.store.checkpoints import Lineage
from dart_ray.store.log import Claim, DurableLog, LeaseLostError
from dart_ray.store.log_rows import LogRow

log = logging.getLogger(__name__)


class CuratorCore(StalenessGuard):
    def __init__(
        self,
        log_: DurableLog,
        blobs: BlobStore,
        settings: CuratorSettings,
        lineage: Callable[[], Lineage] | None = None,
    ) -> None:
        """`lineage` reads the run's versions from the durable registry
        (`CheckpointRegistry.lineage`): at construction, so a curator that Ray restarts
        judges staleness against the newest published version at once, not against 0 until
        the trainer speaks, and at every `set_version`, so it learns of discarded versions."""
        self.log = log_
        self.blobs = blobs
        self.s = settings
        self.groups = self._group_buffer()
        self.version = 0
        self.lineage = Lineage(0, frozenset())
        """The run's versions as the registry knows them (discarded ones judged by distance)."""
        self._lineage = lineage
        self.queue: deque[TrainStep] = deque()
        self.in_flight: dict[int, TrainStep] = {}
        self.metrics = CuratorMetrics()
        self._claims: dict[int, Claim] = {}  # row id -> the claim holding it
        self._trajectories: dict[int, Trajectory] = {}  # row id -> loaded trajectory
        self._versions: dict[int, int] = {}  # row id -> the version that generated it
        self._ready: list[GroupOutcome] = []  # curated, trainable, waiting for a step
        self._next_step = 0
        self._last_renew = time.monotonic()
        self.meter = PaceMeter(float(settings.groups_per_step * settings.group_size))
        """The trainer's pace, from the counters at each new version (admission reads it)."""
        self._read_lineage()

    # ------------------------------------------------------------------ inputs

    def set_version(self, version: int, now: float | None = None) -> None:
        """The newest published weight version; staleness is measured against it (or
        against the registry's newest, whichever is higher: versions only go up)."""
        before = self.version
        self.version = max(self.version, version)
        self._read_lineage()
        if self.version > before or not self.meter.marked:
            now = time.monotonic() if now is None else now
            self.meter.mark(now, self.version, self.metrics)

    def pace(self, available: int, now: float | None = None) -> Pace:
        """The trainer's pace and the queue ahead of a new group, for staleness-aware
        admission (`available`: the log's unclaimed rows, which the caller counts;
        `PaceMeter.pace`)."""
        partners = sum(len(o.trained_rows) for o in self._ready)  # groups awaiting partners
        curated = partners + sum(len(st.rows) for st in self.queue)
        waiting = available + len(self._claims) - curated
        now = time.monotonic() if now is None else now
        return self.meter.pace(self.version, waiting, curated, now, partners)

    def _read_lineage(self) -> None:
        if self._lineage is None:
            return
        self.lineage = self._lineage()
        self.version = max(self.version, self.lineage.newest)

    def poll(self, now: float | None = None, *, whole_round: bool = False) -> int:
        """One round of claiming and curating; returns how many rows were claimed.

        `whole_round`: the synchronous baseline's end of a round (`flush` follows), where every
        row the round logged goes into its one step: claimed whatever `max_held_rows` and the
        queue say (the round itself bounds them; bounded, a round that logged more rows than
        the bound could never be flushed)."""
        now = time.monotonic() if now is None else now
        claimed = 0
        if whole_round or len(self.queue) < self.s.queue_depth:
            claimed = self._claim(now, whole_round)
        for rows in self.groups.pop_abandoned(now):
            self._settle_drops([r.id for r in rows], "group_incomplete")
        self._drop_stale_held()
        self._form_steps(now)
        if now - self._last_renew > self.s.lease_s / 3:
            self._renew()
            self._last_renew = now
        self._update_gauges()
        return claimed

    def _claim(self, now: float, whole_round: bool = False) -> int:
        min_version = self._log_floor()
        stale = self.log.drop_stale(self.s.run_id, min_version)
        if stale:
            self.metrics.dropped["stale"] += stale
            self.metrics.stale_at["log"] += stale
        room = self.s.claim_batch
        if not whole_round:
            room = min(room, self.s.max_held_rows - len(self._claims))
        if room < 1:  # what it holds (filling groups, curated groups, queued steps) is enough
            return 0
        claim = self.log.claim(
            self.s.run_id,
            room,
            consumer=self.s.consumer,
            lease_s=self.s.lease_s,
            min_version=min_version,
        )
        for row in claim.rows:
            self._claims[row.id] = claim
            self._versions[row.id] = row.version_num
            self.metrics.staleness[self.version - self.lineage.effective(row.version_num)] += 1
            try:
                self._trajectories[row.id] = self.blobs.read(row.uri)
            except (FileNotFoundError, ValueError, OSError) as e:
                log.error("trajectory %s unreadable at %s: %s", row.trajectory_id, row.uri, e)
                self._quarantine([row.id], f"blob_unreadable: {type(e).__name__}: {e}")
                continue
            self.groups.add(row, now)
        return len(claim.rows)

    # ------------------------------------------------------------------ curation

    def _replay_for(self, task_id: str) -> Trajectory | None:
        if not self.s.params.success_replay:
            return None
        stats = self.log.task_stat(self.s.run_id, task_id)
        if stats is None or stats.last_success_uri is None:
            return None
        try:
            replay = self.blobs.read(stats.last_success_uri)
        except (FileNotFoundError, ValueError, OSError) as e:
            log.warning("replay blob for task %s unreadable: %s", task_id, e)
            return None
        if self._unfit(replay.min_version):  # the bound holds for replays too
            self.metrics.replays_stale += 1
            return None
        return replay

    def _curate(self, group: list[LogRow]) -> GroupOutcome:
        members = [(r, self._trajectories[r.id]) for r in group if r.id in self._trajectories]
        replay = None
        params = self.s.params
        if params.objective == "grpo" and not any(
            t.reward >= params.success_threshold for _, t in members
        ):
            replay = self._replay_for(group[0].task_id)
        try:
            out = curate_group(members, self.s.params, replay)
        except Exception as e:  # bad data, whatever it breaks: the group, not the run
            log.exception("group %s could not be curated; quarantined", group[0].group_id)
            self._quarantine([r.id for r in group], f"curation: {type(e).__name__}: {e}")
            return GroupOutcome()
        for rid, reason in out.dropped.items():
            self._settle_drop(rid, reason)
        if out.replayed:
            self.metrics.replays += 1
            self.metrics.replays_by_task[group[0].task_id] += 1
        return out

    def _form_steps(self, now: float) -> None:
        """Curate groups as they complete; pack `groups_per_step` trainable ones per step."""
        ready = self.groups.pop_ready(now)
        for i, group in enumerate(ready):
            try:
                out = self._curate(group)
            except BaseException:  # the log failed mid-way: what is still held waits for
                held = [[r for r in g if r.id in self._claims] for g in ready[i:]]
                self.groups.put_back([g for g in held if g], now)  # the next poll
                raise
            if out.samples:
                self._ready.append(out)
        self._pack_steps()

    def _pack_steps(self) -> None:
        if not self.s.pack_as_ready:
            return
        gps = self.s.groups_per_step
        while len(self._ready) >= gps and len(self.queue) < self.s.queue_depth:
            outs, self._ready = self._ready[:gps], self._ready[gps:]
            try:
                step = self._make_step(outs)
            except Exception:  # a sample that cannot be packed: find its group, keep the rest
                log.exception("a step of %d groups could not be packed", len(outs))
                self._ready[:0] = self._packable(outs)
                continue
            self.queue.append(step)
            self.metrics.steps_formed += 1
            self.metrics.samples_formed += step.num_samples

    def _packable(self, outs: list[GroupOutcome]) -> list[GroupOutcome]:
        """The groups that pack alone; each that does not is quarantined with its error."""
        keep = []
        for out in outs:
            try:
                pack(out.samples, self.s.num_ranks)
            except Exception as e:
                self._quarantine(out.trained_rows, f"packing: {type(e).__name__}: {e}")
                continue
            keep.append(out)
        return keep

    def _make_step(self, outs: list[GroupOutcome]) -> TrainStep:
        samples = [s for o in outs for s in o.samples]
        rewards = [r for o in outs for r in o.rewards]
        rows = [r for o in outs for r in o.trained_rows]
        # the oldest sample, a replay's included (the hand-out staleness check reads it)
        oldest = min([self._versions[r] for r in rows] + [s.weight_version for s in samples])
        return TrainStep(
            step_id=-1,
            shards=pack(samples, self.s.num_ranks),
            rows=rows,
            claims=self._sub_claims(rows),
            num_samples=len(samples),
            num_groups=len(outs),
            mean_reward=sum(rewards) / len(rewards),
            min_version=oldest,
            groups=outs,
        )

    def flush(self, now: float | None = None) -> int:
        """The synchronous baseline's end of a round: nothing more will join its groups, so
        every pending group is released as it is (curated with at least `min_group` final
        members, else dropped `group_incomplete`), and every trainable group goes into one
        step, however many or few (a synchronous step trains what its round gave). Returns
        the steps queued."""
        now = time.monotonic() if now is None else now
        for rows in self.groups.pop_where(lambda p: True):
            if sum(r.status is not Status.ABORTED for r in rows) >= self.s.min_group:
                out = self._curate(rows)
                if out.samples:
                    self._ready.append(out)
            else:
                self._settle_drops([r.id for r in rows], "group_incomplete")
        self._drop_stale_held()
        if self._ready and len(self.queue) < self.s.queue_depth:
            outs, self._ready = self._ready, []
            step = self._make_step(outs)
            self.queue.append(step)
            self.metrics.steps_formed += 1
            self.metrics.samples_formed += step.num_samples
        self._update_gauges()
        return len(self.queue)

    # ------------------------------------------------------------------ outputs

    def take_step(self) -> TrainStep | None:
        """Hand the next queued step to a trainer, numbered in order of hand-out.

        From here the trainer owns the step's rows: it renews their leases and acknowledges
        them once the weights they trained are durable. The curator stops renewing them and
        only remembers the step, to `release` it if its trainer goes away."""
        self._drop_stale_queued()
        if not self.queue:
            return None
        step = self.queue.popleft()
        self.metrics.rows_handed += len(step.rows)
        step.step_id = self._next_step
        self._next_step += 1
        self.in_flight[step.step_id] = step
        for rid in step.rows:
            self._forget(rid)
        self._update_gauges()
        return step

    def ack(self, step_id: int) -> int:
        """Acknowledge a handed-out step's rows in the log (when the curator's caller does not
        acknowledge them itself)."""
        step = self.in_flight[step_id]
        for c in step.claims:
            self.log.ack(c)
        self.forget(step_id)
        return len(step.rows)

    def forget(self, step_id: int) -> None:
        """The step's rows were acknowledged (by its trainer): stop tracking it."""
        step = self.in_flight.pop(step_id, None)
        if step is not None:
            self.metrics.steps_acked += 1
            self.metrics.rows_trained += len(step.rows)
        self._update_gauges()

    def release(self, step_id: int) -> int:
        """Its trainer went away before acknowledging: the step's rows go back to the pool
        (those whose lease already expired went back on their own)."""
        step = self.in_flight.pop(step_id, None)
        if step is None:
            return 0
        n = 0
        for c in step.claims:
            try:
                n += self.log.release(c)
            except LeaseLostError:
                log.info("step %d: claim %s already expired back to the pool", step_id, c.claim_id)
        self.metrics.released_rows += n
        self._update_gauges()
        return n

    def release_all(self) -> int:
        """Give every held and handed-out, unacknowledged row back (clean shutdown)."""
        n = sum(self.release(k) for k in list(self.in_flight))
        by_claim: dict[str, tuple[Claim, list[int]]] = {}
        for rid, c in self._claims.items():
            by_claim.setdefault(c.claim_id, (c, []))[1].append(rid)
        for c, ids in by_claim.values():
            n += self.log.release(c, ids)
        self._claims.clear()
        self._trajectories.clear()
        self._versions.clear()
        self.queue.clear()
        self._ready.clear()
        self.groups = self._group_buffer()
        self._update_gauges()
        return n

    @property
    def steps_handed(self) -> int:
        """Steps handed to a trainer so far (the next step's number)."""
        return self._next_step

    # ------------------------------------------------------------------ helpers

    def _group_buffer(self) -> GroupBuffer:
        s = self.s
        return GroupBuffer(s.group_size, s.min_group, s.group_timeout_s, s.group_abandon_s)

    def _settle_drops(self, rids: list[int], reason: str, at: str = "") -> None:
        """Drop rows this curator holds, one log transaction per claim (`at`: where a stale
        row waited, `CuratorMetrics.stale_at`)."""
        by_claim: dict[str, tuple[Claim, list[int]]] = {}
        for rid in rids:
            if rid in self._claims:
                c = self._claims[rid]
                by_claim.setdefault(c.claim_id, (c, []))[1].append(rid)
        for c, ids in by_claim.values():
            self.log.drop(c, ids, reason)
            self.metrics.dropped[reason] += len(ids)
            if reason == "stale":
                self.metrics.stale_at[at] += len(ids)
            for rid in ids:
                self._forget(rid)

    def _quarantine(self, rids: list[int], reason: str) -> None:
        """Settle held rows as bad data (`RowState.QUARANTINED`), one transaction per claim:
        they are accounted for, never trained, and never hold a lease again."""
        by_claim: dict[str, tuple[Claim, list[int]]] = {}
        for rid in rids:
            if rid in self._claims:
                c = self._claims[rid]
                by_claim.setdefault(c.claim_id, (c, []))[1].append(rid)
        for c, ids in by_claim.values():
            self.log.quarantine(c, ids, reason)
            self.metrics.quarantined[reason.split(":", 1)[0]] += len(ids)
            for rid in ids:
                self._forget(rid)

    def _sub_claims(self, rows: list[int]) -> list[Claim]:
        by_claim: dict[str, list[int]] = {}
        for rid in rows:
            by_claim.setdefault(self._claims[rid].claim_id, []).append(rid)
        out = []
        for ids in by_claim.values():
            c = self._claims[ids[0]]
            keep = set(ids)
            held = tuple(r for r in c.rows if r.id in keep)
            out.append(Claim(c.claim_id, c.consumer, c.run_id, held, c.lease_expires_at))
        return out

    def _settle_drop(self, rid: int, reason: str) -> None:
        self.log.drop(self._claims[rid], [rid], reason)
        self.metrics.dropped[reason] += 1
        self._forget(rid)

    def _forget(self, rid: int) -> None:
        self._claims.pop(rid, None)
        self._trajectories.pop(rid, None)
        self._versions.pop(rid, None)

    def _renew(self) -> None:
        claims = {c.claim_id: c for c in self._claims.values()}
        for c in claims.values():
            held = [r for r in c.rows if r.id in self._claims]
            if held:
                sub = Claim(c.claim_id, c.consumer, c.run_id, tuple(held), c.lease_expires_at)
                try:
                    self.log.renew(sub, self.s.lease_s)
                except LeaseLostError as e:  # the trainer will skip steps of these rows
                    log.warning("curator: %s", e)

    def _update_gauges(self) -> None:
        self.metrics.queue_depth = len(self.queue)
        self.metrics.pending_groups = len(self.groups) + len(self._ready)
        self.metrics.filling_groups = len(self.groups)
        self.metrics.ready_groups = len(self._ready)
        self.metrics.held_rows = len(self._claims)
