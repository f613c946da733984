"""The environment pool grows with the env resource: real EnvSession actors on real Ray; only
the reading of the cluster's resources is a function the test controls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from actors.env_pool import EnvPoolGrower, sessions_wanted
from dart_ray.config import ConfigError, load_config
from dart_ray.records import PackedTasks


def test_sessions_wanted_follows_whole_units_up_to_the_cap() -> None:
    assert sessions_wanted(current=4, env_units=4.0, max_sessions=16) == 0
    assert sessions_wanted(current=4, env_units=12.0, max_sessions=16) == 8  # a node of 8 joined
    assert sessions_wanted(current=4, env_units=7.9, max_sessions=16) == 3  # whole units only
    assert sessions_wanted(current=4, env_units=40.0, max_sessions=16) == 12  # capped
    assert sessions_wanted(current=6, env_units=4.0, max_sessions=16) == 0  # never shrinks


def test_growing_needs_a_cap_at_least_the_start_and_a_resource() -> None:
    with pytest.raises(ConfigError, match=r"env.max_sessions = 2: must be at least"):
        load_config(None, ["env.num_sessions=4", "env.max_sessions=2"])
    with pytest.raises(ConfigError, match=r"env.resource = '': must be set"):
        load_config(None, ["env.max_sessions=8", "env.resource=''"])


@ray.remote(num_cpus=0)
class _Rollouter:
    """Stands in for the rollouter's side of the contract: `add_sessions(list)`."""

    def __init__(self) -> None:
        self.got: list[ray.actor.ActorHandle] = []

    def add_sessions(self, sessions: list[ray.actor.ActorHandle]) -> int:
        self.got.extend(sessions)
        return len(self.got)

    def sessions(self) -> list[ray.actor.ActorHandle]:
        return self.got


@pytest.fixture
def grown() -> Iterator[list[ray.actor.ActorHandle]]:
    started: list[ray.actor.ActorHandle] = []
    yield started
    for s in started:
        ray.kill(s)


@pytest.mark.usefixtures("ray_local")
def test_the_pool_grows_as_env_units_appear(grown: list[ray.actor.ActorHandle]) -> None:
    cfg = load_config(
        None, ["env.num_sessions=1", "env.max_sessions=4", "env.num_cpus=0.01", "env.kind=minidesk"]
    ).env
    units = {"env": 1.0}
    receivers = [_Rollouter.remote(), _Rollouter.remote()]  # type: ignore[attr-defined]
    grower = EnvPoolGrower(cfg, "pool-test", receivers, existing=1, read_resources=lambda: units)

    async def scenario() -> list[int]:
        added = [await grower.grow()]  # one unit, one session already: nothing to do
        units["env"] = 3.0  # a node with two units joined
        added.append(await grower.grow())
        units["env"] = 9.0  # a big node joined: capped at max_sessions = 4
        added.append(await grower.grow())
        added.append(await grower.grow())
        await grower.settle()
        grown.extend(grower.started)
        return added

    assert asyncio.run(scenario()) == [0, 2, 1, 0]
    per_receiver = [ray.get(r.sessions.remote()) for r in receivers]
    # sessions 1, 2, 3 (0 existed) go round-robin: 1 -> receiver 1, 2 -> 0, 3 -> 1
    assert [len(s) for s in per_receiver] == [1, 2]
    # the pool remembers who got what: a restarted rollouter asks for its own again (in any
    # order: each session is handed over once it answers its health check, so a receiver
    # gets them in the order they came up, the pool lists them in the order it started them)
    for i, got in enumerate(per_receiver):
        mine = asyncio.run(grower.sessions_for(i))
        assert sorted(h._actor_id.hex() for h in mine) == sorted(h._actor_id.hex() for h in got)
    handed = [s for got in per_receiver for s in got]
    # each handed session is a live EnvSession that plays an episode
    from dart_ray.envs.minidesk.generate import load_tasks

    task = load_tasks(split="train")[0]
    for s in handed:
        obs = ray.get(s.reset.remote(task))
        assert obs.screenshot
    assert sorted(ray.get(s.stats.remote()).name for s in handed) == [
        "pool-test-1",
        "pool-test-2",
        "pool-test-3",
    ]
    for r in receivers:
        ray.kill(r)


@pytest.mark.usefixtures("ray_local")
def test_the_grower_actor_reads_the_real_cluster(grown: list[ray.actor.ActorHandle]) -> None:
    """As `runtime.start` runs it: an actor reading `ray.cluster_resources()` (the test
    session's Ray has 8 `env` units), capped by env.max_sessions."""
    import time

    from actors.env_pool import start_grower

    cfg = load_config(
        None,
        [
            "env.num_sessions=1",
            "env.max_sessions=3",
            "env.num_cpus=0.01",
            "env.grow_interval_s=0.2",
        ],
    ).env
    receiver = _Rollouter.remote()  # type: ignore[attr-defined]
    grower = start_grower(cfg, "pool-real", [receiver], existing=1, name="env-pool:test")
    deadline = time.monotonic() + 60
    while len(ray.get(receiver.sessions.remote())) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # a few more looks: the cap holds
    got = ray.get(receiver.sessions.remote())
    grown.extend(ray.get(grower.sessions.remote()))
    assert len(got) == 2 and len(grown) == 2
    ray.get(grower.stop.remote())
    ray.kill(grower)
    ray.kill(receiver)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_rollouter_plays_on_sessions_it_is_given(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real rollouter's side: a session added before `run` takes episodes too."""
    from ray import serve

    from actors.env_host import start_sessions
    from actors.rollouter import Rollouter
    from dart_ray.envs.minidesk.generate import load_tasks
    from dart_ray.store import open_store
    from serve_apps.policy import run_policy

    cfg = load_config(
        None,
        [
            f"run.root_dir={tmp_path}",
            "env.num_sessions=1",
            "env.num_cpus=0.05",
            "env.screen_width=112",
            "env.screen_height=112",
            "rollout.in_flight=2",
            "rollout.n_rollouts=2",
            "rollout.max_steps=1",
            "curation.dynamic_rollouts=false",
            "policy.max_new_tokens=8",
            "policy.num_cpus=0.2",
            "policy.http_port=8126",
        ],
    )
    store = open_store(cfg, init=True)
    run_policy(cfg.policy, tiny_model_dir, name="policy-pool", route_prefix="/pool")
    first, second = start_sessions(cfg.env.model_copy(update={"num_sessions": 2}), "pool-r")
    r = Rollouter.remote(
        cfg, "run-p", PackedTasks.of(load_tasks(split="train")[:2]), [first], "policy-pool"
    )  # type: ignore[attr-defined]
    assert ray.get(r.add_sessions.remote([second])) == 2
    report = ray.get(r.run.remote(max_groups=2))
    assert report.sessions == 2 and report.started == 4
    assert ray.get(second.stats.remote()).resets > 0  # the added session played
    for a in (first, second, r):
        ray.kill(a)
    serve.delete("policy-pool")
    store.dispose()
