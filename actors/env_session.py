"""EnvSession: one Ray actor per environment session, which survives its environment crashing.

GUI environments fail in ways the policy has nothing to do with: Chromium dies, an X
application is killed, the desktop server stops answering. The session turns every such failure
into one typed outcome, `EnvAborted`, raised from the call that hit it (reset, step or
evaluate), and recreates its environment before the next episode. The rollouter catches it and
records the trajectory in progress as `Status.ABORTED`, to retry on a fresh session; it is never
scored as a failure with reward 0, which would teach the policy that the task is hard when the
machine was broken. Bad input (`EnvInputError`: a malformed task; `NoEpisode`: a step without
a reset) is different: it passes through unchanged and the session stays as it was. An action
the env cannot carry out is neither: the env answers it with a failed step (`invalid_step`).

Each call runs in a worker thread with a deadline (`env.reset_timeout_s`, `step_timeout_s`): a
hung browser or server cannot hang the rollout. On a deadline the session closes the stuck
environment (which kills its processes and so unblocks the thread), drops the thread, and
builds a new environment on the next reset.

The session also measures itself: seconds busy inside environment calls versus seconds alive.
The busy fraction is "environment utilisation", the figure DART-GUI reports 5.5x better for
decoupled rollout than for a synchronous pipeline. It is returned by `stats()` and exported as
Ray metrics (`dart_env_busy_seconds`, `dart_env_session_busy_fraction`) when running inside Ray.

`start_session(config)` creates the actor with fractional CPUs (`env.num_cpus`) and one unit of
the custom resource `env.resource`, so sessions can be placed on CPU-only environment nodes.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil
import ray

from dart_ray.config import EnvConfig
from dart_ray.envs.base import (
    Env,
    EnvAborted,
    EnvInputError,
    NoEpisode,
    StepResult,
    error_message,
    make_env,
)
from dart_ray.records import Action, Observation, Task

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SessionStats:
    """Counters and timings of one session since it started."""

    name: str
    kind: str
    alive_s: float
    busy_s: float
    resets: int
    steps: int
    evaluations: int
    aborted: int
    """Calls that ended in EnvAborted (crash, timeout, environment that would not start)."""
    recreations: int
    """Environments built after the first one."""

    @property
    def idle_s(self) -> float:
        return max(0.0, self.alive_s - self.busy_s)

    @property
    def utilisation(self) -> float:
        """Busy fraction of the session's life, in [0, 1]."""
        return self.busy_s / self.alive_s if self.alive_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class SessionHealth:
    ok: bool
    """The environment exists and answered its liveness probe (or will be built on reset)."""
    kind: str
    env_started: bool
    in_episode: bool
    last_error: str | None


class EnvSession:
    """Owns one environment; plain class, made a Ray actor by `start_session`."""

    def __init__(self, config: EnvConfig, name: str = "env-session") -> None:
        self.config = config
        self.name = name
        self._env: Env | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-env")
        self._lock = threading.Lock()
        self._born = time.monotonic()
        self._busy = 0.0
        self._counts = {"resets": 0, "steps": 0, "evaluations": 0, "aborted": 0, "builds": 0}
        self._in_episode = False
        self._last_error: str | None = None
        self._metrics = _Metrics(name, config.kind) if ray.is_initialized() else None

    # ------------------------------------------------------------------ the env contract
    def reset(self, task: Task) -> Observation:
        self._in_episode = False
        obs = self._call(lambda env: env.reset(task), self.config.reset_timeout_s, "reset")
        self._counts["resets"] += 1
        self._in_episode = True
        return obs

    def step(self, action: Action) -> StepResult:
        self._need_episode("step")
        result = self._call(lambda env: env.step(action), self.config.step_timeout_s, "step")
        self._counts["steps"] += 1
        return result

    def evaluate(self) -> float:
        self._need_episode("evaluate")
        # an evaluator may read files or run commands: it gets the reset deadline
        reward = self._call(lambda env: env.evaluate(), self.config.reset_timeout_s, "evaluate")
        self._counts["evaluations"] += 1
        return reward

    def health(self) -> SessionHealth:
        ok = True
        if self._env is not None:
            try:
                ok = self._pool.submit(self._env.healthy).result(timeout=10.0)
            except FutureTimeout:
                ok = False
        return SessionHealth(
            ok, self.config.kind, self._env is not None, self._in_episode, self._last_error
        )

    def stats(self) -> SessionStats:
        c = self._counts
        return SessionStats(
            name=self.name,
            kind=self.config.kind,
            alive_s=time.monotonic() - self._born,
            busy_s=self._busy,
            resets=c["resets"],
            steps=c["steps"],
            evaluations=c["evaluations"],
            aborted=c["aborted"],
            recreations=max(0, c["builds"] - 1),
        )

    def close(self) -> None:
        self._discard(None)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ machinery
    def _need_episode(self, what: str) -> None:
        if not self._in_episode:
            raise NoEpisode(
                f"{what} without an episode in progress: call reset(task) first"
                + (
                    f" (the last episode was aborted: {self._last_error})"
                    if self._last_error
                    else ""
                )
            )

    def _call(self, fn: Callable[[Env], T], timeout: float, what: str) -> T:
        with self._lock:  # Ray runs one call at a time; this guards direct (threaded) use
            t0 = time.monotonic()
            try:
                env = self._env if self._env is not None else self._build(timeout)
                fut = self._pool.submit(fn, env)
                try:
                    return fut.result(timeout=timeout)
                except FutureTimeout:
                    raise self._abort(what, f"{what} timed out after {timeout:g}s") from None
                except EnvInputError:
                    raise
                except Exception as e:  # any other failure means the env is broken: rebuild it
                    why = f"{what} failed: {type(e).__name__}: {error_message(e)}"
                    raise self._abort(what, why, e) from e
            finally:
                dt = time.monotonic() - t0
                self._busy += dt
                if self._metrics is not None:
                    self._metrics.record(dt, self._busy, time.monotonic() - self._born)

    def _build(self, timeout: float) -> Env:
        fut = self._pool.submit(make_env, self.config, self.name)
        try:
            env = fut.result(timeout=timeout)
        except FutureTimeout:
            raise self._abort("start", f"environment did not start within {timeout:g}s") from None
        except EnvInputError:
            raise
        except Exception as e:
            why = f"environment failed to start: {type(e).__name__}: {error_message(e)}"
            raise self._abort("start", why, e) from e
        self._env = env
        self._counts["builds"] += 1
        return env

    def _abort(self, what: str, reason: str, cause: BaseException | None = None) -> EnvAborted:
        self._counts["aborted"] += 1
        self._in_episode = False
        detail = "".join(traceback.format_exception(cause)[-3:]) if cause is not None else ""
        self._last_error = reason
        self._discard(reason)
        return EnvAborted(f"{self.name}: {reason}", detail=detail)

    def _discard(self, reason: str | None) -> None:
        """Close the current env and forget it, killing its processes if close hangs.

        A stuck call may hold the env (a frozen browser); closing it is what unblocks that
        thread, and a close that itself hangs past `CLOSE_TIMEOUT_S` ends in SIGKILL of every
        process the env started, with their children."""
        env, self._env = self._env, None
        if env is None:
            return
        pids = _process_trees(env.processes())
        errors: list[str] = []

        def _close() -> None:
            try:
                env.close()
            except Exception as e:  # a broken env may fail to close; it is dropped anyway
                errors.append(f"{type(e).__name__}: {e}")

        closer = threading.Thread(target=_close, name=f"{self.name}-close", daemon=True)
        closer.start()
        closer.join(CLOSE_TIMEOUT_S)
        if closer.is_alive():
            errors.append(f"close hung for {CLOSE_TIMEOUT_S:g}s; killed {len(pids)} processes")
        if closer.is_alive() or reason is not None:
            _kill(pids)  # after a failure, leave no stray browser or X app behind
        if errors:
            self._last_error = f"{reason}; close: {'; '.join(errors)}"
        if reason is not None:
            # a thread may still be stuck in the old env: give later calls a fresh thread
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-env")

    def processes(self) -> list[int]:
        """PIDs of the env's processes and their descendants (for memory accounting)."""
        return _process_trees(self._env.processes()) if self._env is not None else []


CLOSE_TIMEOUT_S = 10.0


def _process_trees(roots: list[int]) -> list[int]:
    out: dict[int, None] = {}  # ordered and without repeats: roots may overlap
    for pid in roots:
        try:
            p = psutil.Process(pid)
            out |= dict.fromkeys([pid, *(c.pid for c in p.children(recursive=True))])
        except psutil.NoSuchProcess:
            continue
    return list(out)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            continue


class _Metrics:
    """Ray metrics of one session (visible on the dashboard and to Prometheus)."""

    def __init__(self, name: str, kind: str) -> None:
        from ray.util import metrics

        tags = {"session": name, "kind": kind}
        keys = tuple(tags)
        self._busy = metrics.Counter(
            "dart_env_busy_seconds", "Seconds spent inside environment calls", tag_keys=keys
        )
        self._util = metrics.Gauge(
            "dart_env_session_busy_fraction", "Busy fraction of the session's life", tag_keys=keys
        )
        self._busy.set_default_tags(tags)
        self._util.set_default_tags(tags)

    def record(self, dt: float, busy: float, alive: float) -> None:
        self._busy.inc(dt)
        self._util.set(busy / alive if alive > 0 else 0.0)


def session_options(config: EnvConfig) -> dict[str, Any]:
    """Ray actor options for a session: fractional CPUs and the custom env resource.

    Restarted however often its process dies (a long run kills sessions many times: OOM,
    node loss); a session whose constructor fails is not restarted by Ray, so a broken
    configuration still fails at once. With a cap (it was 3), a run whose every session had
    died four times had no environment left and stalled (found by the fault schedule)."""
    opts: dict[str, Any] = {"num_cpus": config.num_cpus, "max_restarts": -1, "max_task_retries": 0}
    if config.resource:
        opts["resources"] = {config.resource: 1}
    return opts


def start_session(config: EnvConfig, name: str | None = None) -> Any:
    """Start one EnvSession actor; returns its handle."""
    opts = session_options(config)
    if name is not None:
        opts["name"] = name
    return ray.remote(EnvSession).options(**opts).remote(config, name or "env-session")
