"""EnvSession on MiniDesk through a real local Ray: the contract, bad input, stats, placement.

Crash recovery with real crashes (a killed browser, a killed X application, a frozen server)
is tested where those crashes exist: tests/envs/miniwob/test_env.py and test_desktop_lifecycle.py."""

from __future__ import annotations

import pytest
import ray

from actors.env_session import EnvSession, session_options, start_session
from dart_ray.config import EnvConfig
from dart_ray.envs.base import EnvAborted, EnvInputError
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.envs.minidesk.oracle import oracle_action
from dart_ray.records import Action, ActionKind, Observation, Task

pytestmark = pytest.mark.usefixtures("ray_local")


def _oracle_script(task: Task, cfg: EnvConfig) -> list[Action]:
    """The oracle's actions, computed on a local copy: MiniDesk is deterministic."""
    env = MiniDeskEnv(cfg)
    env.reset(task)
    actions = []
    while not env.done:
        a = oracle_action(env)
        env.step(a)
        actions.append(a)
    return actions


def test_session_runs_an_episode_and_reports_utilisation() -> None:
    cfg = EnvConfig(num_cpus=0.25, resource="env")
    s = start_session(cfg, "md-episode")
    task = make_task("fill-form", 2, 4)
    obs = ray.get(s.reset.remote(task))
    assert isinstance(obs, Observation) and obs.screenshot.startswith(b"\x89PNG")
    assert (obs.width, obs.height) == (320, 240)
    results = [ray.get(s.step.remote(a)) for a in _oracle_script(task, cfg)]
    assert results[-1].done and not any(r.done for r in results[:-1])
    assert ray.get(s.evaluate.remote()) == 1.0
    st = ray.get(s.stats.remote())
    # fill-form tier 2: name (click, type), email (click, type), role (open, pick), Submit = 7
    assert (st.resets, st.steps, st.evaluations, st.aborted) == (1, 7, 1, 0)
    assert 0.0 < st.busy_s < st.alive_s and 0.0 < st.utilisation < 1.0
    assert st.idle_s == pytest.approx(st.alive_s - st.busy_s)
    h = ray.get(s.health.remote())
    assert h.ok and h.env_started and h.in_episode and h.last_error is None
    ray.kill(s)


def test_bad_input_passes_through_and_the_session_stays_usable() -> None:
    s = start_session(EnvConfig(), "md-bad-input")
    with pytest.raises(EnvInputError, match="reset"):
        ray.get(s.step.remote(Action(ActionKind.WAIT)))
    with pytest.raises(EnvInputError, match="widgets"):
        ray.get(s.reset.remote(Task("bad", "x", "minidesk", {"goal": {}})))
    ray.get(s.reset.remote(make_task("click-button", 1, 0)))
    # an action the env cannot carry out is the model's: a failed step, never an exception
    r = ray.get(s.step.remote(Action(ActionKind.CLICK)))
    assert r.info == {"event": "invalid", "error": "invalid action: click needs a point"}
    # a scroll without a point (UI-TARS allows it) scrolls where the pointer is
    r = ray.get(s.step.remote(Action(ActionKind.SCROLL, direction="down")))
    assert not r.done and r.info == {"event": "nothing"}  # no list under the pointer
    assert ray.get(s.step.remote(Action(ActionKind.WAIT))).info["event"] == "wait"
    st = ray.get(s.stats.remote())
    assert st.aborted == 0 and st.recreations == 0
    ray.kill(s)


def test_a_wrong_env_kind_is_an_input_error_not_an_abort() -> None:
    # a kind that names nothing is the user's mistake: say so, do not retry it as a crash
    s = start_session(EnvConfig(kind="no_such_pkg.mod:Env"), "md-no-kind")
    with pytest.raises(EnvInputError, match=r"cannot import no_such_pkg\.mod"):
        ray.get(s.reset.remote(make_task("click-button", 1, 0)))
    assert ray.get(s.stats.remote()).aborted == 0
    ray.kill(s)


def test_session_options_request_fractional_cpu_and_the_env_resource() -> None:
    cfg = EnvConfig(num_cpus=0.25, resource="env")
    assert session_options(cfg)["resources"] == {"env": 1}
    assert session_options(cfg)["num_cpus"] == 0.25
    assert "resources" not in session_options(EnvConfig(resource=None))
    # 8 sessions fit the 8 `env` units and 2 CPUs of the test cluster; a 9th must wait
    sessions = [start_session(cfg, f"md-place-{i}") for i in range(8)]
    ray.get([s.stats.remote() for s in sessions], timeout=60)
    extra = start_session(cfg, "md-place-extra")
    ready, _ = ray.wait([extra.stats.remote()], timeout=2)
    assert ready == []
    ray.kill(sessions[0])
    assert ray.get(extra.stats.remote(), timeout=60).name == "md-place-extra"
    for s in [*sessions[1:], extra]:
        ray.kill(s)


def test_a_session_comes_back_however_often_its_process_dies() -> None:
    """Five deaths of the same session (more than the old cap of 3 restarts): it answers
    after each. A run that had lost every session this way stalled for good."""
    import time

    s = start_session(EnvConfig(num_cpus=0.05, resource="env"), "md-phoenix")
    assert ray.get(s.stats.remote(), timeout=60).name == "md-phoenix"
    for _ in range(5):
        ray.kill(s, no_restart=False)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert ray.get(s.stats.remote(), timeout=30).name == "md-phoenix"
                break
            except ray.exceptions.RayActorError:
                assert time.monotonic() < deadline, "the session did not come back"
                time.sleep(0.5)
    ray.kill(s)


def test_env_aborted_survives_pickling_with_its_detail() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(EnvAborted("s: step timed out", detail="tb")))
    assert isinstance(e, EnvAborted) and str(e) == "s: step timed out" and e.detail == "tb"


def test_plain_session_without_ray_metrics_works_in_process() -> None:
    s = EnvSession(EnvConfig(), "local")
    s.reset(make_task("menu-command", 1, 3))
    assert s.stats().resets == 1
    s.close()
