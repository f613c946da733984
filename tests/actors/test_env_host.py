"""EnvHost: several sessions in one actor, each used like its own actor, in parallel."""

from __future__ import annotations

import pickle
import time

import pytest
import ray

from actors.env_host import HostedSession, actors_of, address, resolve_session, start_sessions
from dart_ray.config import EnvConfig, EnvLatency
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.records import Action, ActionKind, Observation

pytestmark = pytest.mark.usefixtures("ray_local")

LATENCY = "dart_ray.envs.latency:LatencyMiniDesk"


def test_hosted_sessions_run_in_parallel_inside_few_actors() -> None:
    """7 sessions, 3 to an actor: 3 actors. Each session resets on its own env; resets that
    sleep 0.3 s each run at once (7 in a row would take 2.1 s)."""
    lat = EnvLatency(reset_median_s=0.3, reset_sigma=0, reset_lo_s=0, step_median_s=0.01,
                     step_sigma=0, step_lo_s=0)  # fmt: skip
    cfg = EnvConfig(kind=LATENCY, num_sessions=7, sessions_per_actor=3, latency=lat)
    sessions = start_sessions(cfg, "hosted")
    assert all(isinstance(s, HostedSession) for s in sessions)
    assert len(actors_of(sessions)) == 3
    assert [s.name for s in sessions] == [f"hosted-{i}" for i in range(7)]
    ray.get([s.health.remote() for s in sessions])  # every host is up
    task = make_task("click-button", 1, 0)
    t0 = time.monotonic()
    obs = ray.get([s.reset.remote(task) for s in sessions])
    assert time.monotonic() - t0 < 1.2
    assert all(isinstance(o, Observation) for o in obs)
    ray.get(sessions[4].step.remote(Action(ActionKind.WAIT)))
    stats = ray.get([s.stats.remote() for s in sessions])
    assert [st.name for st in stats] == [s.name for s in sessions]
    assert [st.steps for st in stats] == [0, 0, 0, 0, 1, 0, 0]
    found = resolve_session(address(sessions[5]))
    assert found == sessions[5] and pickle.loads(pickle.dumps(found)) == found
    for a in actors_of(sessions):
        ray.kill(a)


def test_a_session_is_not_reached_past_its_methods() -> None:
    cfg = EnvConfig(num_sessions=2, sessions_per_actor=2)
    sessions = start_sessions(cfg, "hosted-guard")
    with pytest.raises(AttributeError):
        _ = sessions[0].close_everything
    host = actors_of(sessions)[0]
    with pytest.raises(ray.exceptions.RayTaskError, match="not a session method"):
        ray.get(host.call.remote(0, "__init__", cfg, []))
    for a in actors_of(sessions):
        ray.kill(a)
