"""The curator as a Ray actor: a thin async wrapper around `dart_ray.data.curator.CuratorCore`.

Trainer ranks call `get_shard(session, step, rank)`; every rank asking for the same step
number gets its own shard of the same curated step (the first request binds the next queued
step to that number). The trainer acknowledges the rows in the log once the weights they
trained are durable and then calls `forget_steps`; a trainer that starts with a newer
session number makes the curator give the previous trainer's unacknowledged steps back. A background task
polls the durable log; database and blob I/O run in a worker thread under one lock, so the
actor stays responsive to the trainer while it curates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields

import pyarrow as pa
import ray
from ray.util import metrics as ray_metrics

from dart_ray.config import Config
from dart_ray.data.curation import CurationParams
from dart_ray.data.curator import CuratorCore, CuratorSettings, TrainStep
from dart_ray.rollout.admission import Pace
from dart_ray.store import Claim, open_store
from dart_ray.store.db import RowState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInfo:
    step: int
    num_samples: int
    num_groups: int
    num_rows: int
    mean_reward: float
    claims: tuple[Claim, ...]
    """What to acknowledge after the optimizer step (`DurableLog.ack` each), so the ack
    does not depend on this actor surviving until then."""


def max_held_rows(config: Config) -> int:
    """`curation.max_held_rows`, or the bound it defaults to (see its docstring)."""
    cur, ro = config.curation, config.rollout
    if cur.max_held_rows is not None:
        return cur.max_held_rows
    steps = (cur.queue_depth + 1) * cur.groups_per_step * cur.group_size
    return steps + ro.rollouters * ro.in_flight * max(cur.group_size, ro.n_rollouts)


def settings_from_config(config: Config, run_id: str, num_ranks: int) -> CuratorSettings:
    cur = config.curation
    return CuratorSettings(
        run_id=run_id,
        num_ranks=num_ranks,
        group_size=cur.group_size,
        min_group=cur.min_group,
        group_timeout_s=cur.group_timeout_s,
        group_abandon_s=cur.group_abandon_s,
        groups_per_step=cur.groups_per_step,
        max_staleness=cur.max_staleness,
        queue_depth=cur.queue_depth,
        lease_s=cur.lease_s,
        max_held_rows=max_held_rows(config),
        consumer=f"curator:{run_id}",
        pack_as_ready=config.run.mode == "decoupled",
        params=CurationParams(
            success_threshold=config.rollout.success_threshold,
            advantage_mode=config.algo.advantage,
            success_replay=cur.success_replay,
            entropy_top_fraction=cur.entropy_top_fraction,
            drop_no_signal=cur.drop_no_signal,
            credit=config.algo.credit,
            step_gamma=config.algo.step_gamma,
            step_weight=config.algo.step_weight,
            step_norm=config.algo.step_norm,
            objective=config.algo.objective,
        ),
    )


class _BufferMetrics:
    """The buffer's health on the dashboard: unused rows in the log, rows the curator holds,
    steps queued, staleness of what it claimed, drops by reason."""

    def __init__(self, run_id: str) -> None:
        tags = {"run_id": run_id}

        def gauge(name: str, doc: str) -> ray_metrics.Gauge:
            g = ray_metrics.Gauge(name, doc, ("run_id",))
            g.set_default_tags(tags)
            return g

        self.available = gauge("dart_buffer_unused_rows", "Logged trajectories not yet claimed")
        self.held = gauge("dart_curator_held_rows", "Claimed rows waiting to be trained")
        self.queue = gauge("dart_curator_queue_depth", "Curated steps waiting for the trainer")
        self.staleness = gauge("dart_staleness_mean", "Mean version lag of the rows claimed so far")
        self.dropped = ray_metrics.Gauge(
            "dart_dropped_rows", "Rows dropped so far, by reason", ("run_id", "reason")
        )
        self.dropped.set_default_tags(tags)

    def update(self, core: CuratorCore, available: int | None) -> None:
        m = core.metrics
        if available is not None:
            self.available.set(available)
        self.held.set(m.held_rows)
        self.queue.set(m.queue_depth)
        n = sum(m.staleness.values())
        if n:
            self.staleness.set(sum(lag * k for lag, k in m.staleness.items()) / n)
        for reason, k in m.dropped.items():
            self.dropped.set(k, tags={"reason": reason})


NUM_CPUS = 0.25
"""CPUs the curator reserves."""


@ray.remote(num_cpus=NUM_CPUS, max_restarts=-1, max_task_retries=-1)
class Curator:
    def __init__(
        self, config: Config, run_id: str, num_ranks: int, poll_interval_s: float = 0.5
    ) -> None:
        store = open_store(config, wait=True)
        self.core = CuratorCore(
            store.log,
            store.blobs,
            settings_from_config(config, run_id, num_ranks),
            # the durable source of versions: a restarted curator judges staleness against
            # the newest published version from its first poll, and drops discarded ones
            lineage=lambda: store.checkpoints.lineage(run_id),
        )
        self.poll_interval_s = poll_interval_s
        self._lock = asyncio.Lock()
        self._bound: dict[int, TrainStep] = {}
        self._session = -1
        self._changed = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._run_id = run_id
        self._gauges = _BufferMetrics(run_id)
        self._buffer_read_at = 0.0
        self._available = 0
        """The log's unclaimed rows at the last read (every 2 s, with the gauges)."""

    def _export(self) -> None:
        """Gauges after a poll; the log's unused count at most every 2 s (one GROUP BY)."""
        available = None
        if time.monotonic() - self._buffer_read_at > 2.0:
            self._buffer_read_at = time.monotonic()
            buffer = self.core.log.buffer(self._run_id)
            available = sum(n for (_, st), n in buffer.items() if st == RowState.AVAILABLE)
            self._available = available
        self._gauges.update(self.core, available)

    async def _ensure_poller(self) -> None:
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def _poll_forever(self) -> None:
        while True:
            try:
                async with self._lock:
                    await asyncio.to_thread(self.core.poll)
                    await asyncio.to_thread(self._export)
                self._changed.set()
            except Exception:  # keep curating; the error is logged with its traceback
                log.exception("curator poll failed; retrying")
            await asyncio.sleep(self.poll_interval_s)

    async def start(self) -> None:
        await self._ensure_poller()

    async def _enter_session(self, session: int) -> bool:
        """Requests carry the trainer's session (a number that grows with each trainer start).
        A newer session means the previous trainer is gone: its steps that were never
        acknowledged go back to the pool. Requests of an older session are refused."""
        if session < self._session:
            return False
        if session > self._session:
            async with self._lock:
                for ts in self._bound.values():
                    await asyncio.to_thread(self.core.release, ts.step_id)
            self._bound.clear()
            self._session = session
        return True

    async def get_shard(
        self, session: int, step: int, rank: int, timeout_s: float | None = None
    ) -> tuple[pa.RecordBatch, StepInfo] | None:
        """Rank `rank`'s shard of training step `step`; None if nothing is ready in time."""
        await self._ensure_poller()
        if not await self._enter_session(session):
            raise RuntimeError(f"trainer session {session} was superseded by {self._session}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while step not in self._bound:
            async with self._lock:
                ts = None
                if step not in self._bound:  # hand-out may drop stale steps: log I/O
                    ts = await asyncio.to_thread(self.core.take_step)
                if ts is not None:
                    self._bound[step] = ts
            if step in self._bound:
                break
            if deadline is not None and loop.time() >= deadline:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=self.poll_interval_s)
        ts = self._bound[step]
        info = StepInfo(
            step, ts.num_samples, ts.num_groups, len(ts.rows), ts.mean_reward, tuple(ts.claims)
        )
        return ts.shards[rank], info

    async def forget_steps(self, session: int, steps: list[int]) -> None:
        """The trainer acknowledged these steps in the log itself."""
        if session != self._session:
            return
        for k in steps:
            ts = self._bound.pop(k, None)
            if ts is not None:
                self.core.forget(ts.step_id)

    async def release_step(self, session: int, step: int) -> int:
        """The trainer will not train step `step` (its rows were no longer all held): give
        back what is still held and forget the step."""
        ts = self._bound.pop(step, None) if session == self._session else None
        if ts is None:
            return 0
        async with self._lock:
            return await asyncio.to_thread(self.core.release, ts.step_id)

    async def ack_step(self, session: int, step: int) -> int:
        """Acknowledge step `step` through the curator (for trainers that do not do it
        themselves). Returns 0 for a step this actor does not know (it restarted after
        handing it out): the trainer then acknowledges through `StepInfo.claims`."""
        ts = self._bound.pop(step, None) if session == self._session else None
        if ts is None:
            log.warning(
                "ack for step %d of session %d, which this curator did not hand out", step, session
            )
            return 0
        async with self._lock:
            return await asyncio.to_thread(self.core.ack, ts.step_id)

    async def settle(self, timeout_s: float = 600.0) -> int:
        """The synchronous baseline, once a round's episodes are all logged: claim and curate
        every row the log holds for the run (polling back to back, not at the poll interval),
        then pack every trainable group into one step (`CuratorCore.flush`). Returns the
        steps queued (0: the round gave nothing to train)."""
        await self._ensure_poller()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            async with self._lock:
                await asyncio.to_thread(self.core.poll, whole_round=True)
                buffer = await asyncio.to_thread(self.core.log.buffer, self._run_id)
                waiting = sum(n for (_, st), n in buffer.items() if st == RowState.AVAILABLE)
                if waiting == 0:
                    queued = await asyncio.to_thread(self.core.flush)
                    self._changed.set()
                    return queued
            if loop.time() >= deadline:
                raise TimeoutError(f"{waiting} rows still unclaimed after {timeout_s:g} s")
            await asyncio.sleep(0.01)

    async def set_version(self, version: int) -> None:
        """The trainer's newest version; the core also reads the registry (database I/O:
        in a worker thread, between polls)."""
        async with self._lock:
            await asyncio.to_thread(self.core.set_version, version)

    async def pace(self) -> Pace:
        """The trainer's pace and the rows waiting (admission, `dart_ray.rollout.admission`),
        as they are now: the log's unclaimed rows counted at the call (one indexed count),
        between polls (a poll mid-way holds rows the log calls claimed and the core does not
        yet). The count a poll leaves is up to 2 s old: a rollouter finishing a group every
        0.3 s against a step every 2 s read a short queue and opened groups that waited two
        versions in it (16% of the default run's rollouts dropped stale)."""
        await self._ensure_poller()
        async with self._lock:
            available = await asyncio.to_thread(self.core.log.available, self._run_id)
            return self.core.pace(available)

    async def metrics(self) -> dict[str, object]:
        """The core's counters, read between polls: a poll updates them when it ends, so a
        read during one would see rows claimed in the log but not yet counted as held."""
        async with self._lock:
            return self._metrics()

    def _metrics(self) -> dict[str, object]:
        m = asdict(self.core.metrics)
        # asdict rebuilds a Counter from its (key, count) pairs, which a Counter counts as
        # keys: every Counter field is read back as the plain dict it is
        for f in fields(self.core.metrics):
            if isinstance(c := getattr(self.core.metrics, f.name), Counter):
                m[f.name] = dict(c)
        m["in_flight_steps"] = len(self.core.in_flight)
        m["steps_handed"] = self.core.steps_handed
        return m

    async def shutdown(self) -> int:
        """Stop polling and give every unacknowledged row back to the pool. The lock is
        taken first: cancelling the poller cannot stop a poll already running in its thread,
        and rows that poll claimed after the release would stay CLAIMED until their lease
        ran out."""
        async with self._lock:
            if self._poller is not None:
                self._poller.cancel()
            return await asyncio.to_thread(self.core.release_all)
