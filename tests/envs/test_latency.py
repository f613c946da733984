"""LatencyMiniDesk: OSWorld-shaped latencies, repeatable per session, and really slept."""

from __future__ import annotations

import statistics
import time

import pytest

from dart_ray.config import EnvConfig
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
    reset median 15 s, p95 15 * exp(1.645 * 0.7) = 47.5 s (x3.16); step median 2.5 s,
    p95 2.5 * exp(1.645 * 0.45) = 5.24 s (x2.10). 4000 draws pin the median to ~2-3%."""
    profile = LatencyProfile(scale=0.01)
    draws = _draws(profile, "0", 4000)
    resets = sorted(s for c, s in draws if c == "reset")
    steps = sorted(s for c, s in draws if c == "step")

    def q(xs: list[float], p: float) -> float:
        return xs[int(p * (len(xs) - 1))]

    assert statistics.median(resets) == pytest.approx(0.15, rel=0.06)
    assert statistics.median(steps) == pytest.approx(0.025, rel=0.06)
    assert q(resets, 0.95) / q(resets, 0.5) == pytest.approx(3.16, rel=0.12)
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


def test_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DART_LATENCY_SCALE", "0.001")
    monkeypatch.setenv("DART_LATENCY_SEED", "5")
    monkeypatch.setenv("DART_LATENCY_STEP_MEDIAN", "4")
    env = make_env(EnvConfig(kind=KIND))
    assert isinstance(env, LatencyMiniDesk)
    assert env.profile.scale == 0.001 and env.profile.seed == 5
    assert env.profile.step.median_s == 4.0 and env.profile.reset.median_s == 15.0
    monkeypatch.setenv("DART_LATENCY_SCALE", "fast")
    with pytest.raises(ValueError, match="DART_LATENCY_SCALE"):
        LatencyProfile.from_env()
