"""The rollouter: keeps K episodes in flight over the session pool, and logs every one.

Each finished episode is written to blob storage and appended to the durable log, whatever
its status. An ABORTED episode (the environment crashed) is retried on the next free session
with the same trace id, up to `rollout.max_retries` times; then the slot is recorded as
ENV_ERROR, and the curator will not train its group. The next episode starts the moment one
finishes (rollout-wise sampling).

Every episode is recorded in the episode ledger before it starts. A rollouter restarted
by Ray (it has unlimited restarts) first logs the episodes of its earlier life that never
finished as ABORTED; the driver then calls `run()` again.

Decoupled mode calls `run()` once and the rollouter never waits for training. The
synchronous baseline calls `run(max_groups=n)` per iteration: it opens n groups, finishes
them, and returns, so every part waits for the slowest.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import ray
from ray import serve
from ray.util import metrics

from actors.env_host import resolve_session
from dart_ray.algo.curriculum import Backoff
from dart_ray.config import Config
from dart_ray.engines.base import SamplingParams
from dart_ray.records import PackedTasks, Status, Task, Trajectory
from dart_ray.rollout.admission import Gate, Pace
from dart_ray.rollout.episode import (
    EpisodeSettings,
    RaySession,
    ServePolicy,
    Slot,
    new_trajectory_id,
    run_episode,
)
from dart_ray.rollout.history import LogHistory
from dart_ray.rollout.report import RolloutReport
from dart_ray.rollout.scheduler import PlannedSlot, Scheduler, TaskHistory
from dart_ray.rollout.seeding import ReplaySeeder, ScriptedPolicy, SeedOutcome
from dart_ray.store import EpisodeStart, open_store
from dart_ray.store.episodes import log_unfinished

log = logging.getLogger(__name__)


class _Metrics:
    def __init__(self, run_id: str) -> None:
        tags = {"run_id": run_id}
        self.in_flight = metrics.Gauge(
            "dart_trajectories_in_flight", "Episodes running now", ("run_id",)
        )
        self.total = metrics.Counter(
            "dart_trajectories_total", "Trajectories logged, by status", ("run_id", "status")
        )
        self.occupancy = metrics.Gauge(
            "dart_env_utilisation", "Fraction of session time inside episodes", ("run_id",)
        )
        self.reward = metrics.Gauge(
            "dart_reward_mean", "Mean reward of recent trajectories", ("run_id",)
        )
        for m in (self.in_flight, self.total, self.occupancy, self.reward):
            m.set_default_tags(tags)


NUM_CPUS = 0.1
"""CPUs a rollouter reserves (it mostly awaits sessions and the policy)."""


@ray.remote(num_cpus=NUM_CPUS, max_restarts=-1)
class Rollouter:
    def __init__(
        self,
        config: Config,
        run_id: str,
        tasks: PackedTasks,
        sessions: list[Any],
        policy_app: str,
        shard: tuple[int, int] = (0, 1),
        pool: str | None = None,
        curator: str | None = None,
    ) -> None:
        """`curator`: the name of the run's Curator actor, whose `pace()` admission reads
        (None: no admission)."""
        self.c = config
        self.run_id = run_id
        self.store = open_store(config, wait=True)
        mine = tasks.unpack()[shard[0] :: shard[1]]
        self._tasks = {t.task_id: t for t in mine}
        self.name = f"rollouter-{shard[0]}"
        self._index = shard[0]
        self._pool = pool
        """Name of the EnvPoolGrower actor that hands this rollouter more sessions, if any."""
        r = config.rollout
        self._backoff = (
            Backoff(after=r.backoff_after, max_skips=r.backoff_max_skips) if r.backoff else None
        )
        self._histories = LogHistory(self.store.log, run_id, config, mine, self._backoff)
        self.scheduler = Scheduler(
            mine,
            n_rollouts=config.rollout.n_rollouts,
            max_steps=config.rollout.max_steps,
            history=self._history,
            dynamic=config.curation.dynamic_rollouts,
            seed=config.run.seed + shard[0],
            incarnation=f"{uuid.uuid4().hex[:6]}-",
            backoff=self._backoff,
            backoff_key=self._histories.key,
        )
        self.policy = ServePolicy(serve.get_deployment_handle("PolicyServer", policy_app))
        # names, looked up here (the run passes names: an actor handle among a restartable
        # actor's constructor arguments makes Ray print an E line, ray#53727), or handles
        sessions = [resolve_session(s) for s in sessions]
        self.sessions = sessions
        self.idle: asyncio.Queue[Any] = asyncio.Queue()
        for s in sessions:
            self.idle.put_nowait(s)
        p = config.policy
        self.settings = EpisodeSettings(
            max_steps=config.rollout.max_steps,
            sampling=SamplingParams(p.temperature, p.top_p, p.max_new_tokens, top_k=p.top_k),
            history_images=p.history_images,
            history_turns=p.history_turns,
            on_invalid=config.rollout.on_invalid_action,
        )
        self.report = RolloutReport(sessions=len(sessions))
        self.version = 0
        self._stop = False
        self._remaining: dict[str, int] = {}
        self._opened: dict[str, float] = {}  # group id -> when its first slot was planned
        self._rewards: list[float] = []
        self._metrics = _Metrics(run_id)
        self._active = 0
        self._first_run: float | None = None
        self._curator = curator
        self._seeder: ReplaySeeder | None = None
        """The replay pool's seeds, once `seed` has been called (`curation.replay_seeds`)."""
        self.gate = Gate(
            self._pace,
            group=r.n_rollouts,
            rollouters=r.rollouters,
            max_staleness=config.curation.max_staleness,
            slack=r.admission_slack,
        )
        """Staleness-aware admission (`dart_ray.rollout.admission`); used in decoupled runs."""
        self.reconciled = self._reconcile()

    def _reconcile(self) -> int:
        """Log as ABORTED every episode this rollouter started in an earlier life (it was
        killed, or the run was) that never reached the log; returns how many."""
        lost = log_unfinished(
            self.store,
            self.run_id,
            "in flight when its rollouter stopped (killed, or the run was)",
            rollouter=self.name,
            tasks=self._tasks,
            env_kind=self.c.env.kind,
        )
        self.report.logged[Status.ABORTED.value] += len(lost)
        if lost:
            log.warning(
                "%s: %d episodes of an earlier life logged as ABORTED", self.name, len(lost)
            )
        return len(lost)

    def _history(self, task_id: str) -> TaskHistory:
        # by family, as many of the family's groups may be filling as there are sessions
        filling = len(self.sessions) if self._histories.by_family else 2
        return self._histories(task_id, version=self.version, filling=filling)

    # ------------------------------------------------------------------ control

    async def stop(self) -> None:
        """Start no new episode; `run` returns once the ones in flight are logged."""
        self._stop = True

    async def set_version(self, version: int) -> None:
        self.version = max(self.version, version)

    async def stats(self) -> RolloutReport:
        self.report.backoff_skips = self.scheduler.visits_skipped
        self._publish_occupancy()  # wall_s as of now, also while admission holds every session
        return self.report

    async def _adopt_pool_sessions(self) -> None:
        """Take back the sessions the pool handed this rollouter before it restarted (Ray
        restarts it with its constructor's arguments: the sessions of the run's start)."""
        if self._pool is None:
            return
        try:
            pool = ray.get_actor(self._pool, namespace=self.c.cluster.namespace)
        except ValueError:  # no pool (yet)
            return
        await self.add_sessions(await pool.sessions_for.remote(self._index))

    async def add_sessions(self, sessions: list[Any]) -> int:
        """Take more sessions (a growing pool, `actors/env_pool.py`); used from the next start.
        A session already held is ignored (the pool and a restart may both deliver it)."""
        held = {s._actor_id for s in self.sessions}
        sessions = [s for s in sessions if s._actor_id not in held]
        self.sessions.extend(sessions)
        for s in sessions:
            self.idle.put_nowait(s)
        self.report.sessions = len(self.sessions)
        return len(self.sessions)

    async def seed(self, scripts: dict[str, list[str]]) -> list[SeedOutcome]:
        """Seed the replay pool with written solutions of this rollouter's tasks, at the
        current version, before `run` (`dart_ray.rollout.seeding`); `run` seeds a task again
        when a group of it opens and its newest success has aged. A task with a fresh
        success already (a resumed run) keeps it."""
        await self._adopt_pool_sessions()
        store = self.store

        def last_success(task_id: str) -> int | None:
            stats = store.log.task_stat(self.run_id, task_id)
            return None if stats is None else stats.last_success_version

        def record(t: Trajectory) -> bool:
            if not store.log.is_success(t):
                return False
            store.log.record_seed(t, store.blobs.write(t))
            return True

        self._seeder = ReplaySeeder(
            ScriptedPolicy(self.policy, scripts),
            self.settings,
            run_id=self.run_id,
            bound=self.c.curation.max_staleness,
            last_success=last_success,
            record=record,
        )
        sessions = [RaySession(s) for s in self.sessions]
        outcomes = await self._seeder.play(list(self._tasks.values()), sessions, self.version)
        log.info(
            "%s: %d of %d seeds succeeded",
            self.name,
            sum(o.seeded for o in outcomes),
            len(outcomes),
        )
        return outcomes

    async def _reseed(self, task: Task) -> None:
        """Play `task`'s seed again on a free session if its newest success has aged (before
        a group of it opens): the replay pool's seeds age as any success does."""
        if self._seeder is None or not await self._seeder.due(task, self.version):
            return
        session = await self.idle.get()
        t0 = time.monotonic()
        try:
            (outcome,) = await self._seeder.play([task], [RaySession(session)], self.version)
        finally:
            self.report.episode_s += time.monotonic() - t0  # the session was busy
            self.idle.put_nowait(session)
        self.report.seeds_again[task.task_id] += outcome.seeded

    # ------------------------------------------------------------------ the loop

    async def run(self, max_groups: int | None = None) -> RolloutReport:
        """Keep `rollout.in_flight` episodes going until stopped, or until `max_groups` new
        groups have all finished (the synchronous baseline)."""
        self._stop = False
        await self._adopt_pool_sessions()
        if self._first_run is None:
            self._first_run = time.monotonic()
        opened_at_start = self.scheduler.groups_opened
        running: set[asyncio.Task[None]] = set()
        admit = (
            max_groups is None
            and self.c.run.mode == "decoupled"  # a synchronous round never runs ahead
            and self.c.rollout.admission
            and self._curator is not None
        )

        def may_start() -> bool:
            if self._stop:
                return False
            if max_groups is None:
                pending = self.scheduler.pending_slots() > 0
                return not admit or pending or self.gate.admits(len(running))
            opened = self.scheduler.groups_opened - opened_at_start
            return opened < max_groups or self.scheduler.pending_slots() > 0

        try:
            while True:
                if admit:
                    await self.gate.refresh()
                # read each time: a growing pool adds sessions while the loop runs
                room = min(self.c.rollout.in_flight, len(self.sessions))
                while len(running) < room and may_start():
                    slot = await asyncio.to_thread(self.scheduler.next_slot)
                    first = slot.group_id not in self._remaining
                    self._remaining.setdefault(slot.group_id, slot.group_size)
                    self._opened.setdefault(slot.group_id, time.monotonic())
                    running.add(asyncio.create_task(self._slot(slot, first)))
                held = admit and len(running) < room and not self._stop
                if not running and not held:
                    break
                self.gate.holding(held)
                # while admission holds a group back, look at the pace again every second
                if not running:  # held with nothing running: the queue drains meanwhile
                    await asyncio.sleep(1.0)
                    continue
                done, running = await asyncio.wait(
                    running, timeout=1.0 if held else None, return_when=asyncio.FIRST_COMPLETED
                )
                for d in done:
                    d.result()  # surface bugs; environment and policy failures never raise
        finally:
            self.gate.holding(False)
            self._publish_occupancy()
        return self.report

    async def _pace(self) -> Pace | None:
        """The curator's pace; None while the curator is away (Ray restarting it): admission
        then lets groups open."""
        try:
            curator = ray.get_actor(self._curator, namespace=self.c.cluster.namespace)
            return await curator.pace.remote()  # type: ignore[no-any-return]
        except (ValueError, ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            return None

    def _publish_occupancy(self) -> None:
        self.report.groups_held, self.report.held_s = self.gate.groups_held, self.gate.held_s
        if self._first_run is not None:
            self.report.wall_s = time.monotonic() - self._first_run
            self._metrics.occupancy.set(self.report.occupancy)

    async def _slot(self, planned: PlannedSlot, first: bool = False) -> None:
        """One rollout slot: an episode, its retries on ABORTED, and the final record; the
        `first` of its group plays the task's replay seed again first if it has aged."""
        if first:
            await self._reseed(planned.task)
        trace = ""
        for attempt in range(self.c.rollout.max_retries + 1):
            traj = await self._episode(planned, trace)
            trace = traj.trace_id
            await self._log(traj)
            if traj.status is not Status.ABORTED:
                self._finish_group(planned.group_id)
                return
            log.warning("%s aborted (attempt %d): %s", traj.trajectory_id, attempt + 1, traj.error)
        final = Trajectory(
            trajectory_id=f"{trace}/env_error",
            run_id=self.run_id,
            task=planned.task,
            steps=(),
            reward=0.0,
            status=Status.ENV_ERROR,
            trace_id=trace,
            group_id=planned.group_id,
            group_size=planned.group_size,
            start_version=self.version,
            started_at=time.time(),
            finished_at=time.time(),
            error=f"aborted {self.c.rollout.max_retries + 1} times; last: {traj.error}",
        )
        await self._log(final)
        self._finish_group(planned.group_id)

    async def _episode(self, planned: PlannedSlot, trace: str) -> Trajectory:
        session = await self.idle.get()
        self._active += 1
        self._metrics.in_flight.set(self._active)
        self.report.started += 1
        t0 = time.monotonic()
        try:
            tid = new_trajectory_id(planned.group_id)
            start = EpisodeStart(
                self.run_id,
                tid,
                planned.task.task_id,
                planned.group_id,
                planned.group_size,
                trace or tid,
                self.name,
                self.version,
            )
            await asyncio.to_thread(self.store.episodes.start, start)
            slot = Slot(planned.group_id, planned.group_size, trace, self.version, self.run_id, tid)
            settings = EpisodeSettings(**{**self.settings.__dict__, "max_steps": planned.max_steps})
            traj = await run_episode(RaySession(session), self.policy, planned.task, slot, settings)
            if traj.status is Status.ABORTED:
                await self._settle(session)
        finally:
            took = time.monotonic() - t0
            self.report.episode_s += took
            self._active -= 1
            self._metrics.in_flight.set(self._active)
            self.idle.put_nowait(session)
            self._publish_occupancy()
        if traj.steps:
            self.version = max(self.version, traj.max_version)
        return traj

    async def _settle(self, session: Any) -> None:
        """After an aborted episode, wait until the session answers again (at most the reset
        deadline) before it is handed out: when its process died, a call sent before this
        caller has seen Ray restart it fails at once (`ActorUnavailableError`), and the retry
        would be lost to the restart, not to the environment."""
        deadline = time.monotonic() + self.c.env.reset_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(session.health.remote(), timeout=left)
                return
            except ray.exceptions.ActorUnavailableError:
                await asyncio.sleep(0.2)
            except (ray.exceptions.RayActorError, TimeoutError):
                return  # gone for good, or still not back: the retry records what it finds

    async def _log(self, t: Trajectory) -> None:
        def write() -> None:
            uri = self.store.blobs.write(t)
            self.store.log.append(t, uri)

        await asyncio.to_thread(write)
        self.gate.logged()
        self.report.logged[t.status.value] += 1
        self._metrics.total.inc(tags={"status": t.status.value})
        if t.status.trainable:
            self._rewards = [*self._rewards[-99:], t.reward]
            self._metrics.reward.set(sum(self._rewards) / len(self._rewards))
            if t.reward >= self.c.rollout.success_threshold:
                self.report.successes += 1

    def _finish_group(self, gid: str) -> None:
        self._remaining[gid] -= 1
        if self._remaining[gid] == 0:
            del self._remaining[gid]
            self.gate.group_done(time.monotonic() - self._opened.pop(gid))
            self.report.groups_completed += 1
