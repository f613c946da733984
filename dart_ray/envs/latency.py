"""LatencyMiniDesk: MiniDesk that takes as long as a real desktop, for the decoupling benchmark.

MiniDesk answers in microseconds, so a run on it says nothing about the problem DART solves:
real GUI environments are slow and their latency is heavy-tailed. An OSWorld reset restores a
VM snapshot and runs the task's setup (seconds, sometimes a minute); a step executes
pyautogui code in the VM, waits for the screen to settle and takes a screenshot (about 1-5 s).
A synchronous pipeline waits for its slowest episode every step; a decoupled one does not.

This environment is MiniDesk (same tasks, same rewards, same observations) plus a sleep before
each `reset` and `step`, drawn from a lognormal distribution:

    latency = clip(median * exp(sigma * z), lo, hi) * scale,   z ~ N(0, 1)

At `scale = 1` the defaults give resets with median 15 s (p5 ~4.7 s, p95 ~47 s, clipped to
[2, 90] s) and steps with median 2.5 s (p5 ~1.2 s, p95 ~5.2 s, clipped to [0.5, 15] s), the
shape reported for OSWorld (REFERENCE.md; DART-GUI's paper). `scale` shrinks every latency
by the same factor, so the shape (the tail over the median) survives in a run of minutes.

Configuration comes from environment variables, read when an environment is built (inside the
EnvSession actor, whose process inherits the driver's environment when the driver starts a
local Ray; on a cluster pass them with the job's `runtime_env`):

    DART_LATENCY_SCALE         multiplier of every latency (default 1.0)
    DART_LATENCY_SEED          base seed (default 0)
    DART_LATENCY_RESET_MEDIAN  reset median, seconds at scale 1 (default 15)
    DART_LATENCY_RESET_SIGMA   reset lognormal sigma (default 0.7)
    DART_LATENCY_STEP_MEDIAN   step median, seconds at scale 1 (default 2.5)
    DART_LATENCY_STEP_SIGMA    step lognormal sigma (default 0.45)

Draws are repeatable: each environment has its own random stream, seeded from the base seed
and its session's index (the trailing number of the EnvSession actor's name, `env-<run>-3`,
so session 3 draws the same latencies in every run whatever the run id; outside Ray, or
when given, the `session` argument). Use it with `env.kind =
"dart_ray.envs.latency:LatencyMiniDesk"` and `env.tasks` pointing at MiniDesk's task files.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import time
from dataclasses import dataclass, field, replace

from dart_ray.config import EnvConfig
from dart_ray.envs.base import StepResult
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.records import Action, Observation, Task

ENV_PREFIX = "DART_LATENCY_"


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

    reset: Lognormal = field(default_factory=lambda: Lognormal(15.0, 0.7, 2.0, 90.0))
    step: Lognormal = field(default_factory=lambda: Lognormal(2.5, 0.45, 0.5, 15.0))
    scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.scale < 0:
            raise ValueError(f"latency scale must be >= 0, got {self.scale}")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LatencyProfile:
        """The profile the `DART_LATENCY_*` variables describe (defaults where unset)."""
        env = dict(os.environ if environ is None else environ)

        def num(name: str, default: float) -> float:
            raw = env.get(ENV_PREFIX + name)
            if raw is None or raw == "":
                return default
            try:
                return float(raw)
            except ValueError:
                raise ValueError(f"{ENV_PREFIX}{name}={raw!r} is not a number") from None

        base = cls()
        return cls(
            reset=replace(
                base.reset,
                median_s=num("RESET_MEDIAN", base.reset.median_s),
                sigma=num("RESET_SIGMA", base.reset.sigma),
            ),
            step=replace(
                base.step,
                median_s=num("STEP_MEDIAN", base.step.median_s),
                sigma=num("STEP_SIGMA", base.step.sigma),
            ),
            scale=num("SCALE", base.scale),
            seed=int(num("SEED", base.seed)),
        )

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
        self.profile = profile if profile is not None else LatencyProfile.from_env()
        self.session = session if session is not None else session_key(_actor_name())
        self._rng = self.profile.rng(self.session)
        self._sleep = sleep
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
        return super().reset(task)

    def step(self, action: Action) -> StepResult:
        self._wait("step")
        return super().step(action)
