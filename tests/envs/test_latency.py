"""LatencyMiniDesk: OSWorld-shaped latencies, repeatable per session, and really slept."""

from __future__ import annotations

import statistics
import time

import pytest
from pydantic import ValidationError

from dart_ray.config import EnvConfig, EnvLatency
from dart_ray.envs.base import make_env
from dart_ray.envs.latency import LatencyMiniDesk, LatencyProfile, Lognormal, session_key
from dart_ray.envs.minidesk.generate import load_tasks
from dart_ray.records import Action, ActionKind

KIND = "dart_ray.envs.latency:LatencyMiniDesk"
TASK = load_tasks(split="train")[0]


def _draws(profile: LatencyProfile, session: str, n: int) -> list[tuple[str, float]]:
    env = LatencyMiniDesk(EnvConfig(kind=KIND), profile, session=session, sleep=False)
    for _ in range(n):
        env.reset(TASK)
        env.step(Action(ActionKind.WAIT))
    return env.latencies


def test_the_shape_is_heavy_tailed_like_osworld() -> None:
    """Lognormal with median m and sigma s: p95 / median = exp(1.645 s). Defaults at scale 1:
    reset median 10 s, p95 10 * exp(1.645 * 1.0) = 51.8 s (x5.18); step median 2.5 s,
    p95 2.5 * exp(1.645 * 0.45) = 5.24 s (x2.10). 4000 draws pin the median to ~2-3%."""
    profile = LatencyProfile(scale=0.01)
    draws = _draws(profile, "0", 4000)
    resets = sorted(s for c, s in draws if c == "reset")
    steps = sorted(s for c, s in draws if c == "step")

    def q(xs: list[float], p: float) -> float:
        return xs[int(p * (len(xs) - 1))]

    assert statistics.median(resets) == pytest.approx(0.10, rel=0.08)
    assert statistics.median(steps) == pytest.approx(0.025, rel=0.06)
    assert q(resets, 0.95) / q(resets, 0.5) == pytest.approx(5.18, rel=0.15)
    assert q(steps, 0.95) / q(steps, 0.5) == pytest.approx(2.10, rel=0.12)
    # "seconds to a minute" for a reset, "about 1-5 s" for a step, at scale 1, clipped
    assert 0.02 <= resets[0] <= resets[-1] <= 0.90
    assert 0.005 <= steps[0] <= steps[-1] <= 0.15
    assert Lognormal(15, 0.7, 2, 90).quantile(0.95) == pytest.approx(47.5, rel=0.01)


def test_same_seed_and_session_same_latencies() -> None:
    p = LatencyProfile(scale=0.01, seed=7)
    assert _draws(p, "3", 20) == _draws(p, "3", 20)
    assert _draws(p, "3", 20) != _draws(p, "4", 20)
    assert _draws(p, "3", 20) != _draws(LatencyProfile(scale=0.01, seed=8), "3", 20)
    # the session index, not the run id, picks the stream
    assert session_key("env-tiny-cpu-20250101-000000-3") == "3"
    assert session_key(None) == "local"


def test_it_sleeps_what_it_draws_and_plays_minidesk() -> None:
    p = LatencyProfile(scale=0.002, seed=1)
    env = LatencyMiniDesk(EnvConfig(kind=KIND), p, session="0")
    t0 = time.monotonic()
    obs = env.reset(TASK)
    result = env.step(Action(ActionKind.WAIT))
    elapsed = time.monotonic() - t0
    slept = sum(s for _, s in env.latencies)
    assert [c for c, _ in env.latencies] == ["reset", "step"]
    assert slept > 0 and elapsed >= slept
    assert obs.width == 320 and not result.done and env.evaluate() == 0.0


def test_configured_by_env_latency() -> None:
    env = make_env(EnvConfig(kind=KIND, latency=EnvLatency(step_median_s=4, scale=0.001, seed=5)))
    assert isinstance(env, LatencyMiniDesk)
    assert env.profile.scale == 0.001 and env.profile.seed == 5
    assert env.profile.step.median_s == 4.0 and env.profile.reset.median_s == 10.0
    assert env.profile.success_rate is None  # MiniDesk's checker decides
    # several sessions in one process (an EnvHost): each keys its stream on its own name
    assert make_env(EnvConfig(kind=KIND), "env-run-7").session == "7"  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="reset_lo_s"):
        EnvLatency(reset_lo_s=100)


def test_a_simulated_success_rate_has_easy_and_hard_tasks() -> None:
    """success_rate m: per task p ~ Beta(2m, 2(1-m)), mean m, the same for a task in every
    session; episodes of a task succeed at its p (draws come from the session's stream)."""
    p = LatencyProfile(scale=0.0, success_rate=0.275)
    ps = [p.task_success_p(f"t{i}") for i in range(4000)]
    assert statistics.mean(ps) == pytest.approx(0.275, abs=0.015)
    # Beta(0.55, 1.45): mass near 0 and a tail of easy tasks (var = m(1-m)/3 = 0.0665)
    assert statistics.pvariance(ps) == pytest.approx(0.275 * 0.725 / 3, rel=0.08)
    # P(p < 0.05) = 0.24 and P(p > 0.8) = 0.05 for this Beta
    assert sum(x < 0.05 for x in ps) > 0.2 * len(ps) and sum(x > 0.8 for x in ps) > 0.03 * len(ps)
    assert p.task_success_p("t1") == LatencyProfile(success_rate=0.275).task_success_p("t1")
    env = LatencyMiniDesk(EnvConfig(kind=KIND), p, session="0", sleep=False)
    wins = 0
    for _ in range(2000):
        env.reset(TASK)
        wins += int(env.evaluate())
    assert wins / 2000 == pytest.approx(p.task_success_p(TASK.task_id), abs=0.04)
