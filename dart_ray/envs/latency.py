"""LatencyMiniDesk: MiniDesk that takes as long as a real desktop, for the decoupling benchmark.

MiniDesk answers in microseconds, so a run on it says nothing about the problem DART solves:
real GUI environments are slow and their latency is heavy-tailed. An OSWorld reset restores a
VM snapshot and runs the task's setup (seconds, sometimes a minute); a step executes
pyautogui code in the VM, waits for the screen to settle and takes a screenshot (about 1-5 s).
A synchronous pipeline waits for its slowest episode every step; a decoupled one does not.

This environment is MiniDesk (same tasks, same rewards, same observations) plus a sleep before
each `reset` and `step`, drawn from a lognormal distribution:

    latency = clip(median * exp(sigma * z), lo, hi) * scale,   z ~ N(0, 1)

At `scale = 1` the defaults give resets with median 10 s (p5 ~1.9 s, p95 ~52 s, clipped to
[2, 90] s) and steps with median 2.5 s (p5 ~1.2 s, p95 ~5.2 s, clipped to [0.5, 15] s), the
shape reported for OSWorld (REFERENCE.md; DART-GUI's paper). `scale` shrinks every latency
by the same factor, so the shape (the tail over the median) survives in a run of minutes.

Configuration comes from `env.latency` (`dart_ray.config.EnvLatency`; the timing mode fills
it from `[timing]`); unset, the defaults above at scale 1. With `success_rate` set, the
episode's reward is simulated too: each task succeeds with its own probability, drawn once per
task (from its id and the seed) from a Beta distribution with that mean and concentration 2,
so some tasks are nearly always solved and some nearly never, as on OSWorld; MiniDesk's
checker is not consulted.

Draws are repeatable: each environment has its own random stream, seeded from the base seed
and its session's index (the trailing number of the session's name, `env-<run>-3`, so
session 3 draws the same latencies in every run whatever the run id, whether it has an actor
of its own or shares an EnvHost; outside Ray, or when given, the `session` argument). Use it with `env.kind =
"dart_ray.envs.latency:LatencyMiniDesk"` and `env.tasks` pointing at MiniDesk's task files,
or through the timing mode (`timing.enabled = true`).
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import time
from dataclasses import dataclass, field

from dart_ray.config import EnvConfig, EnvLatency
from dart_ray.envs.base import StepResult, building_session
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.records import Action, Observation, Task


@dataclass(frozen=True, slots=True)
class Lognormal:
    """A clipped lognormal latency, in seconds at scale 1."""

    median_s: float
    sigma: float
    lo_s: float
    hi_s: float

    def draw(self, rng: random.Random, scale: float) -> float:
        x = self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        return min(max(x, self.lo_s), self.hi_s) * scale

    def quantile(self, q: float, scale: float = 1.0) -> float:
        """The q-quantile (of the unclipped distribution), for documentation and tests."""
        from statistics import NormalDist

        return self.median_s * math.exp(self.sigma * NormalDist().inv_cdf(q)) * scale


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """The latencies of one environment kind: reset and step distributions and a scale."""

    reset: Lognormal = field(default_factory=lambda: Lognormal(10.0, 1.0, 2.0, 90.0))
    step: Lognormal = field(default_factory=lambda: Lognormal(2.5, 0.45, 0.5, 15.0))
    scale: float = 1.0
    seed: int = 0
    success_rate: float | None = None
    """None: MiniDesk's checker rewards; else the mean simulated success rate."""

    def __post_init__(self) -> None:
        if self.scale < 0:
            raise ValueError(f"latency scale must be >= 0, got {self.scale}")

    @classmethod
    def from_config(cls, c: EnvLatency | None) -> LatencyProfile:
        """The profile `env.latency` describes (None: the defaults)."""
        if c is None:
            return cls()
        return cls(
            reset=Lognormal(c.reset_median_s, c.reset_sigma, c.reset_lo_s, c.reset_hi_s),
            step=Lognormal(c.step_median_s, c.step_sigma, c.step_lo_s, c.step_hi_s),
            scale=c.scale,
            seed=c.seed,
            success_rate=c.success_rate,
        )

    def task_success_p(self, task_id: str) -> float:
        """The simulated chance that `task_id` succeeds (Beta with mean `success_rate`,
        concentration 2; the same for every session and run with this seed)."""
        m = self.success_rate
        if m is None:
            raise ValueError("no success_rate: MiniDesk's checker rewards the episode")
        if m in (0.0, 1.0):
            return m
        digest = hashlib.sha256(f"{self.seed}/task/{task_id}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big")).betavariate(2 * m, 2 * (1 - m))

    def rng(self, session: str) -> random.Random:
        """The random stream of one session (stable across processes and Python versions)."""
        digest = hashlib.sha256(f"{self.seed}/{session}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))


def session_key(name: str | None) -> str:
    """`env-<run id>-3` -> `3`: the session's index, the same in every run."""
    if not name:
        return "local"
    m = re.search(r"(\d+)$", name)
    return m.group(1) if m else name


def _actor_name() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_actor_name()
    except (ImportError, RuntimeError):
        return None
    return None


class LatencyMiniDesk(MiniDeskEnv):
    """MiniDesk with OSWorld-shaped reset and step latencies (see the module docstring)."""

    def __init__(
        self,
        config: EnvConfig | None = None,
        profile: LatencyProfile | None = None,
        session: str | None = None,
        sleep: bool = True,
    ) -> None:
        super().__init__(config)
        if profile is None:
            profile = LatencyProfile.from_config(config.latency if config else None)
        self.profile = profile
        if session is None:
            session = session_key(building_session() or _actor_name())
        self.session = session
        self._rng = self.profile.rng(self.session)
        self._sleep = sleep
        self._task: Task | None = None
        self.latencies: list[tuple[str, float]] = []
        """Every latency drawn so far, as (call, seconds), in order."""

    def _wait(self, call: str) -> None:
        dist = self.profile.reset if call == "reset" else self.profile.step
        seconds = dist.draw(self._rng, self.profile.scale)
        self.latencies.append((call, seconds))
        if self._sleep and seconds > 0:
            time.sleep(seconds)

    def reset(self, task: Task) -> Observation:
        self._wait("reset")
        self._task = task
        return super().reset(task)

    def step(self, action: Action) -> StepResult:
        self._wait("step")
        return super().step(action)

    def evaluate(self) -> float:
        """MiniDesk's reward, or with a `success_rate` a draw with the task's own chance."""
        if self.profile.success_rate is None or self._task is None:
            return super().evaluate()
        return float(self._rng.random() < self.profile.task_success_p(self._task.task_id))
