"""OSWorld's evaluator shared by a node's sessions (actors/osworld_evaluator.py), on a real
local Ray, with a stand-in worker (a shell loop speaking the worker's protocol) so that no
`.venv-osworld` is needed; the real worker's answers are tested in tests/envs/osworld."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import ray

from actors.osworld_evaluator import NodeEvaluator, host_name
from dart_ray.config import DesktopOptions
from dart_ray.envs.osworld.official import (
    EvaluatorPool,
    OSWorldEvaluatorError,
    OSWorldWorkerCrashed,
)
from dart_ray.records import Task

URL = "http://127.0.0.1:1"


def _venv(tmp_path: Path, answer: str = '{"score": 1}', delay_s: float = 0.0) -> Path:
    """A 'venv' whose python says ready, logs its start, then answers every line."""
    (tmp_path / "bin").mkdir(parents=True)
    py = tmp_path / "bin" / "python"
    py.write_text(
        f"#!/bin/sh\necho $$ >> {tmp_path / 'starts'}\necho '{{\"ready\": true}}'\n"
        f"while read line; do sleep {delay_s}; echo '{answer}'; done\n"
    )
    py.chmod(0o755)
    return tmp_path


def _task(task_id: str = "t1") -> Task:
    return Task(task_id, "a task", "osworld", {"config": [], "evaluator": {"func": "infeasible"}})


def _starts(venv: Path) -> int:
    f = venv / "starts"
    return len(f.read_text().split()) if f.exists() else 0


def test_a_pool_serves_more_callers_than_it_has_workers(tmp_path: Path) -> None:
    venv = _venv(tmp_path / "v", delay_s=0.3)
    pool = EvaluatorPool(venv, 2, tmp_path / "cache")
    scores: list[float] = []
    try:
        threads = [
            threading.Thread(target=lambda: scores.append(pool.evaluate(_task(), URL, None, None)))
            for _ in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert scores == [1.0] * 5
        assert _starts(venv) == 2 and len(pool.pids()) == 2  # five calls, two processes
    finally:
        pool.close()
    assert pool.pids() == []
    with pytest.raises(ValueError, match="at least one worker"):
        EvaluatorPool(venv, 0)


@ray.remote(num_cpus=0)
class _Session:
    """Stands for an EnvSession: builds the env's evaluator as OSWorldEnv does."""

    def __init__(self, options: DesktopOptions) -> None:
        self.ev = NodeEvaluator(options)

    def evaluate(self, task_id: str) -> float:
        return self.ev.evaluate(_task(task_id), URL, None, "DONE")

    def pids(self) -> list[int]:
        return self.ev.pids()

    def host(self) -> str:
        return host_name(self.ev.options, ray.get_runtime_context().get_node_id())


@pytest.mark.usefixtures("ray_local")
def test_the_sessions_of_a_node_share_one_evaluator(tmp_path: Path) -> None:
    venv = _venv(tmp_path / "v", '{"score": 0.5}')
    options = DesktopOptions(evaluator="osworld", osworld_venv=venv, evaluator_workers=1)
    sessions = [_Session.remote(options) for _ in range(3)]
    try:
        assert ray.get([s.evaluate.remote(f"t{i}") for i, s in enumerate(sessions)]) == [0.5] * 3
        pids = ray.get([s.pids.remote() for s in sessions])
        assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 2  # one worker (and its host)
        assert _starts(venv) == 1
        # its host dies (its owner, the first session, died): the call in flight is a crash,
        # the episode retried; the next call starts a new host
        ray.kill(ray.get_actor(ray.get(sessions[1].host.remote())))
        time.sleep(1.0)
        with pytest.raises(OSWorldWorkerCrashed, match="task t9: the node's OSWorld evaluator"):
            try:
                ray.get(sessions[1].evaluate.remote("t9"))
            except ray.exceptions.RayTaskError as e:
                raise e.cause from None
        assert ray.get(sessions[1].evaluate.remote("t10")) == 0.5
        assert _starts(venv) == 2
    finally:
        for s in sessions:
            ray.kill(s)


@pytest.mark.usefixtures("ray_local")
def test_the_pools_errors_reach_the_session_as_raised(tmp_path: Path) -> None:
    venv = _venv(tmp_path / "v", '{"error": "task t3: getter cloud_file needs the internet"}')
    options = DesktopOptions(evaluator="osworld", osworld_venv=venv, evaluator_workers=1)
    ev = NodeEvaluator(options)  # in the driver: a node's process like any other
    with pytest.raises(OSWorldEvaluatorError, match="getter cloud_file needs the internet"):
        ev.evaluate(_task("t3"), URL, None, None)
    ray.kill(ev.host())


@pytest.mark.usefixtures("ray_local")
def test_an_osworld_env_in_ray_uses_its_nodes_evaluator(tmp_path: Path) -> None:
    from dart_ray.config import EnvConfig
    from dart_ray.envs.osworld.env import OSWorldEnv
    from dart_ray.envs.osworld.official import OSWorldEvaluator

    venv = _venv(tmp_path / "v")
    options = DesktopOptions(server_url=URL, evaluator="osworld", osworld_venv=venv)
    env = OSWorldEnv(EnvConfig(kind="osworld", desktop=options))
    assert isinstance(env._osworld(), NodeEvaluator)
    ray.kill(env._osworld().host())  # type: ignore[attr-defined]
    own = OSWorldEnv(
        EnvConfig(kind="osworld", desktop=options.model_copy(update={"evaluator_workers": 0}))
    )
    assert isinstance(own._osworld(), OSWorldEvaluator)
    own.close()
