"""`dart-ray train`: set the parts up, run the loop, report.

Decoupled (DART): the rollouter runs without pause while the trainer trains on whatever the
curator has ready; neither waits for the other. Synchronous (the baseline): roll out one
step's worth of groups, wait until the trainer has trained on them and published the new
version, repeat; every part waits for the slowest. Same parts, same code, one switch.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import ray

from dart_ray.config import Config
from dart_ray.engines.script import read_scripts
from dart_ray.reporting.report import RunReport, build_report
from dart_ray.rollout.seeding import SeedOutcome
from dart_ray.run import preflight, runtime
from dart_ray.store.episodes import log_unfinished
from dart_ray.store.runs import finish_run
from dart_ray.train.resume import resume_from_durable

log = logging.getLogger(__name__)

_GONE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
"""An actor that died or is being restarted by Ray."""


def _fit_in_background(parts: runtime.Parts, errors: list[BaseException]) -> threading.Thread:
    """Ray Train in a thread. A trainer that fails (a worker died) starts again from the
    newest COMPLETED checkpoint in a new session, whose first request makes the curator give
    the dead trainer's unacknowledged steps back: nothing is lost, nothing trained twice."""

    def fit() -> None:
        restarts = parts.config.train.max_restarts
        while True:
            try:
                parts.trainer().fit()
                return
            except BaseException as e:  # re-raised by the driver after the loop
                if restarts == 0 or ray.get(parts.control.stop_requested.remote()):
                    errors.append(e)
                    return
                restarts -= 1
                log.warning("trainer failed (%s); starting it again from the last checkpoint", e)
                path, parts.start = resume_from_durable(parts.store, parts.run_id)
                if path is not None:
                    parts.model_dir = Path(path)

    t = threading.Thread(target=fit, name="trainer", daemon=True)
    t.start()
    return t


def _policy_version(parts: runtime.Parts) -> int:
    return int(parts.policy.version.remote().result())


def _supervise(parts: runtime.Parts, rollouts: list[ray.ObjectRef]) -> list[ray.ObjectRef]:
    """Decoupled mode: a rollouter whose `run()` ended because it died (Ray restarts it, and
    it logs its lost episodes as ABORTED) is set going again."""
    out = list(rollouts)
    for i, ref in enumerate(rollouts):
        if not ray.wait([ref], timeout=0)[0]:
            continue
        try:
            ray.get(ref)
        except _GONE as e:
            log.warning("rollouter %d stopped (%s); starting it again", i, type(e).__name__)
            out[i] = parts.rollouters[i].run.remote()
    return out


def _run_groups(parts: runtime.Parts, groups: int) -> None:
    """Sync mode: `groups` new groups in all, shared out over the rollouters (each asked for
    all of them would roll out rollouters x groups with the same weights, and every step but
    the first would train off-policy); one that dies is asked again once Ray restarted it."""
    n = len(parts.rollouters)
    share = {i: groups // n + (i < groups % n) for i in range(n)}
    pending = {i: parts.rollouters[i].run.remote(max_groups=k) for i, k in share.items() if k > 0}
    _drain(parts, pending, share)


def _drain(
    parts: runtime.Parts, pending: dict[int, ray.ObjectRef], share: dict[int, int] | None
) -> None:
    """Wait for the rollouters' `run()`s (their episodes logged); one that died is asked
    again once Ray restarted it (with `share`: for its groups; else it is only waited for)."""
    while pending:
        for i, ref in list(pending.items()):
            try:
                ray.get(ref)
                del pending[i]
            except _GONE as e:
                log.warning("rollouter %d stopped (%s); asking it again", i, type(e).__name__)
                if share is None:
                    del pending[i]
                else:
                    pending[i] = parts.rollouters[i].run.remote(max_groups=share[i])


def round_groups(config: Config) -> int:
    """Sync mode `batch`: the groups of one round: enough to fill every session at once (a
    synchronous pipeline's rollout batch), and at least one step's worth."""
    c = config
    sessions = min(c.env.num_sessions, c.rollout.in_flight * c.rollout.rollouters)
    return max(c.curation.groups_per_step, -(-sessions // c.rollout.n_rollouts))


def _sample_until_a_step(parts: runtime.Parts, deadline: float) -> None:
    """Sync mode `dynamic`: every session busy at the weights the trainer holds until the
    curator has a step's groups with signal; then no new episode, and those in flight end."""
    gps, poll = parts.config.curation.groups_per_step, preflight.poll_interval(parts.config)
    pending = {i: r.run.remote() for i, r in enumerate(parts.rollouters)}
    while time.monotonic() < deadline:
        if ray.get(parts.curator.metrics.remote(), timeout=60)["ready_groups"] >= gps:
            break
        time.sleep(poll)
    for r in parts.rollouters:
        with contextlib.suppress(*_GONE):
            ray.get(r.stop.remote(), timeout=60)
    _drain(parts, pending, None)


def _sync_round(parts: runtime.Parts, trainer: threading.Thread, deadline: float) -> None:
    """One synchronous round: roll out (`run.sync_sampling`), curate every row of it into one
    step, and wait until the trainer has trained it and published the new weights. Only the
    trainer's last wait polls (scaled with `timing.scale`); the rest are waits on the parts
    themselves."""
    c = parts.config
    trained = len(ray.get(parts.control.history.remote(), timeout=60))
    if c.run.sync_sampling == "dynamic":
        _sample_until_a_step(parts, deadline)
    else:
        _run_groups(parts, round_groups(c))
    steps = int(ray.get(parts.curator.settle.remote(), timeout=c.train.publish_timeout_s))
    log.debug("sync: %d steps queued after the round", steps)
    poll = preflight.poll_interval(c)
    while trainer.is_alive() and steps and time.monotonic() < deadline:
        if len(ray.get(parts.control.history.remote(), timeout=60)) >= trained + steps:
            return
        time.sleep(poll)


@contextlib.contextmanager
def _graceful_signals(stop: list[str]) -> Iterator[None]:
    """SIGTERM (`ray job stop`, a scheduler) and SIGINT end the run as `run.max_minutes`
    does: the trainer makes its work durable, rollouters log their episodes in flight, the
    report is written. A second signal, or SIGKILL, leaves it to `--resume`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        if stop:
            raise KeyboardInterrupt
        stop.append(signal.Signals(signum).name)
        log.warning("%s: stopping the run (send it again to abort)", stop[0])

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def train(
    config: Config,
    on_tick: Callable[[runtime.Parts], None] | None = None,
    on_start: Callable[[runtime.Parts], None] | None = None,
) -> RunReport:
    """Run `config` to its end, or until SIGTERM/SIGINT (then the run is STOPPED: marked so
    in the log at once, so that a SIGKILL after the grace period leaves no RUNNING run)."""
    stop: list[str] = []
    with _graceful_signals(stop):  # a signal during set-up stops the run before it trains
        parts = runtime.start(config)
        if on_start is not None:
            on_start(parts)
        try:
            report = _train(parts, on_tick, stop)
        except BaseException:
            finish_run(parts.store.engine, parts.run_id, "FAILED")
            with contextlib.suppress(Exception):  # the Serve app outlives a failed driver
                runtime.stop(parts)
            raise
    finish_run(parts.store.engine, parts.run_id, "STOPPED" if stop else "FINISHED")
    return report


def _train(
    parts: runtime.Parts, on_tick: Callable[[runtime.Parts], None] | None, stop: list[str]
) -> RunReport:
    config = parts.config
    t0 = time.monotonic()
    before = None if stop else parts.evaluate(config.run.eval_tasks)
    seeds = _seed_replay(parts) if config.curation.replay_seeds and not stop else []
    errors: list[BaseException] = []
    trainer = _fit_in_background(parts, errors)
    rollouts = []
    if config.run.mode == "decoupled":
        rollouts = [r.run.remote() for r in parts.rollouters]
    deadline = t0 + 60 * config.run.max_minutes
    marked = False
    while trainer.is_alive():
        if time.monotonic() > deadline:
            ray.get(parts.control.request_stop.remote("run.max_minutes reached"), timeout=60)
        if stop and not marked:  # whenever it comes, before or after run.max_minutes
            ray.get(parts.control.request_stop.remote(f"{stop[0]} received"), timeout=60)
            finish_run(parts.store.engine, parts.run_id, "STOPPED")  # before any SIGKILL
            deadline, marked = min(deadline, time.monotonic()), True
        if config.run.mode == "sync" and time.monotonic() < deadline:
            _sync_round(parts, trainer, deadline)
        else:
            trainer.join(timeout=1.0)
            rollouts = _supervise(parts, rollouts)
        if on_tick is not None:
            on_tick(parts)
    for r in parts.rollouters:
        with contextlib.suppress(*_GONE):
            ray.get(r.stop.remote())
    for ref in rollouts:  # the episodes in flight are logged before run() returns
        with contextlib.suppress(*_GONE):
            ray.get(ref)
    # every rollouter has stopped: an episode still without a trajectory was lost with a
    # rollouter that died at the end
    log_unfinished(parts.store, parts.run_id, "in flight when its rollouter died at the end")
    if errors:
        runtime.stop(parts)
        raise errors[0]
    if stop:  # a stop has a grace period (`ray job stop`: RAY_JOB_STOP_WAIT_TIME_S)
        log.warning("%s: no held-out evaluation after training (`dart-ray eval`)", stop[0])
    after = None if stop else parts.evaluate(config.run.eval_tasks)
    report = build_report(parts, before, after, time.monotonic() - t0, seeds)
    runtime.stop(parts)
    return report


def _seed_replay(parts: runtime.Parts) -> list[SeedOutcome]:
    """Seed the replay pool with `curation.replay_seeds`' solutions before anything trains
    (`dart_ray.rollout.seeding`): each rollouter plays those of its tasks."""
    path = Path(str(parts.config.curation.replay_seeds))
    scripts = read_scripts(path)
    outcomes = [o for r in parts.rollouters for o in ray.get(r.seed.remote(scripts))]
    if not outcomes:
        log.warning("curation.replay_seeds = %s: no training task has a solution there", path)
    log.info(
        "replay seeds: %d of %d solutions succeeded (%s)",
        sum(o.seeded for o in outcomes),
        len(outcomes),
        ", ".join(f"{o.task_id}={o.reward:g}" for o in outcomes),
    )
    return outcomes
