"""The rollouter on real Ray: MiniDesk sessions, the tiny policy behind Ray Serve, a SQLite
log and Parquet blobs. Every episode started ends up in the log with its status."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import ray
from ray import serve

from actors.env_host import start_sessions
from actors.rollouter import Rollouter
from dart_ray.config import load_config
from dart_ray.envs.minidesk.generate import load_tasks
from dart_ray.records import PackedTasks, Status
from dart_ray.store import open_store
from serve_apps.policy import run_policy
from tests.conftest import TINY_TEST_PIXELS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def _config(tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    return load_config(
        None,
        [
            f"run.root_dir={tmp_path}",
            "env.num_sessions=2",
            "env.num_cpus=0.1",
            "env.screen_width=112",
            "env.screen_height=112",
            "rollout.in_flight=2",
            "rollout.n_rollouts=2",
            "rollout.max_steps=2",
            "policy.max_new_tokens=12",
            "policy.num_cpus=0.2",
            "policy.http_port=8124",
            *extra,
        ],
    )


def test_groups_are_rolled_out_and_logged(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _config(tmp_path, "curation.dynamic_rollouts=false")
    store = open_store(cfg, init=True)
    run_policy(cfg.policy, tiny_model_dir, name="policy-roll", route_prefix="/roll")
    sessions = start_sessions(cfg.env, prefix="roll")
    tasks = load_tasks(split="train")[:5]
    r = Rollouter.remote(cfg, "run-r", PackedTasks.of(tasks), sessions, "policy-roll")  # type: ignore[attr-defined]
    report = ray.get(r.run.remote(max_groups=3))
    assert report.groups_completed == 3
    assert sum(report.logged.values()) == report.started == 6  # 3 groups x 2 rollouts
    rows = store.log.get_rows("run-r", [])  # nothing with an empty id list
    assert rows == []
    buf = store.log.buffer("run-r")
    assert sum(buf.values()) == 6
    stats = store.log.task_stats("run-r")
    assert sum(s.attempts for s in stats) == 6
    # each logged trajectory is readable back from its blob, with its steps' versions
    with store.engine.connect() as c:
        uris = [u for (u,) in c.exec_driver_sql("SELECT uri FROM rollout_run")]
    trajs = [store.blobs.read(u) for u in uris]
    assert {t.group_size for t in trajs} == {2}
    assert Counter(t.group_id for t in trajs).most_common(1)[0][1] == 2
    assert all(t.status in (Status.OK, Status.TRUNCATED) for t in trajs)
    assert all(s.weight_version == 0 and len(s.response_ids) > 0 for t in trajs for s in t.steps)
    assert 0 < report.occupancy <= 1
    for s in sessions:
        ray.kill(s)
    ray.kill(r)
    serve.delete("policy-roll")
    store.dispose()


def test_a_crashed_session_aborts_the_episode_and_it_is_retried(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = _config(
        tmp_path,
        "env.kind=tests.actors.crashing_env:CrashOnceEnv",
        "curation.dynamic_rollouts=false",
        "rollout.max_steps=4",
        "env.num_sessions=1",
        "rollout.in_flight=1",
        "rollout.n_rollouts=1",
    )
    store = open_store(cfg, init=True)
    run_policy(cfg.policy, tiny_model_dir, name="policy-kill", route_prefix="/kill")
    [session] = start_sessions(cfg.env, prefix="kill")
    base = load_tasks(split="train")[0]
    marker = tmp_path / "crashed"
    task = replace(base, config={**base.config, "crash_marker": str(marker)})
    r = Rollouter.remote(cfg, "run-k", PackedTasks.of([task]), [session], "policy-kill")  # type: ignore[attr-defined]
    report = ray.get(r.run.remote(max_groups=1))
    assert marker.exists()  # it did crash
    assert report.logged[Status.ABORTED.value] == 1  # recorded, never as a reward-0 failure
    assert report.groups_completed == 1 and report.started == 2
    with store.engine.connect() as c:
        rows = c.exec_driver_sql("SELECT status, trace_id FROM rollout_run ORDER BY id").all()
    assert next(r[0] for r in rows) == "ABORTED" and rows[1][0] in ("OK", "TRUNCATED")
    assert len({r[1] for r in rows}) == 1  # the retry shares the first attempt's trace id
    ray.kill(session)
    ray.kill(r)
    serve.delete("policy-kill")
    store.dispose()


@ray.remote(num_cpus=0)
class _Pool:
    """The EnvPoolGrower's side of the contract: `sessions_for(index)`."""

    def __init__(self, given: list[ray.actor.ActorHandle]) -> None:
        self.given = given

    def sessions_for(self, index: int) -> list[ray.actor.ActorHandle]:
        return self.given if index == 0 else []


def test_a_restarted_rollouter_takes_back_the_sessions_the_pool_added(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Ray restarts a rollouter with its constructor's arguments (the run's first sessions).
    The sessions the pool added later must not be lost: after the restart, `run()` takes
    them back from the pool, once each."""
    import time

    cfg = _config(tmp_path, "curation.dynamic_rollouts=false")
    open_store(cfg, init=True).dispose()
    run_policy(cfg.policy, tiny_model_dir, name="policy-regrow", route_prefix="/regrow")
    first, added = start_sessions(cfg.env, prefix="regrow")
    pool = _Pool.options(name="env-pool:regrow", namespace="dart-ray").remote([added])  # type: ignore[attr-defined]
    r = Rollouter.options(namespace="dart-ray").remote(  # type: ignore[attr-defined]
        cfg, "run-g", PackedTasks.of(load_tasks(split="train")[:3]), [first], "policy-regrow", (0, 1),
        "env-pool:regrow",
    )  # fmt: skip
    assert ray.get(r.add_sessions.remote([added])) == 2  # the pool hands it over while running
    ray.kill(r, no_restart=False)  # Ray restarts it with [first] only
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the new incarnation (one session)
        try:
            if ray.get(r.stats.remote(), timeout=10).sessions == 1:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.5)
    else:
        raise AssertionError("the rollouter did not come back")
    report = ray.get(r.run.remote(max_groups=1))
    assert report.sessions == 2  # the added session is back, once
    assert ray.get(r.add_sessions.remote([added])) == 2  # a second delivery changes nothing
    for a in (first, added, pool, r):
        ray.kill(a)
    serve.delete("policy-regrow")


def test_tiny_pixels_fixture_matches_the_sessions() -> None:
    assert TINY_TEST_PIXELS[1] >= 112 * 112  # 112x112 screens stay 16 tokens, not shrunk


def test_admission_holds_new_groups_while_the_queue_is_as_long_as_the_bound_allows(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """No trainer: versions never advance, so nothing the rollouter makes can train within
    the bound beyond what one version takes. Bound 2, slack 0.5, a step of one group of 2:
    3 rows may be running or waiting. With 2 sessions and groups of 2 (a group fills every
    session, as in the default run) the first group opens on an empty queue; once it waits
    there as a packed step (a version's rows), the next is held, with nothing running, and
    the rollouter waits instead of ending its run. Before, nothing running always opened a
    group, so the gate never held. Without admission groups follow one another."""
    from actors.curator import Curator

    held = {}
    for admission in (True, False):
        cfg = _config(
            tmp_path / str(admission),
            "env.num_sessions=2",
            "rollout.in_flight=2",
            "curation.dynamic_rollouts=false",
            "curation.drop_no_signal=false",  # the random model's groups wait, not dropped
            "curation.group_size=2",
            "curation.groups_per_step=1",
            "curation.max_staleness=2",
            "rollout.admission_slack=0.5",
            f"rollout.admission={str(admission).lower()}",
            "cluster.namespace=dart-ray-tests",
        )
        store = open_store(cfg, init=True)
        run_policy(cfg.policy, tiny_model_dir, name="policy-adm", route_prefix="/adm")
        sessions = start_sessions(cfg.env, prefix=f"adm-{admission}")
        name = f"curator:run-adm-{admission}"
        curator = Curator.options(name=name, namespace="dart-ray-tests").remote(
            cfg, f"run-adm-{admission}", 1, 0.1
        )
        tasks = PackedTasks.of(load_tasks(split="train")[:5])
        r = Rollouter.remote(  # type: ignore[attr-defined]
            cfg, f"run-adm-{admission}", tasks, sessions, "policy-adm", curator=name
        )
        going = r.run.remote()
        import time

        # 8 s of the rollouter's own running, however long the actor took to start (on a
        # loaded machine its start alone took 11 of a fixed 12 s sleep)
        deadline = time.monotonic() + 180
        while ray.get(r.stats.remote()).wall_s < 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        ray.get(r.stop.remote())
        report = ray.get(going)
        held[admission] = report
        for a in (*sessions, r, curator):
            ray.kill(a)
        serve.delete("policy-adm")
        store.dispose()
    assert held[True].groups_completed == 1 and held[True].held_s > 4.0
    assert held[False].groups_completed >= 3 and held[False].held_s == 0.0
