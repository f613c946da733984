"""`evaluate`: what enters a success rate, and what a failed environment costs an evaluation."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from dart_ray.config import Config, EnvConfig
from dart_ray.engines.base import GenerateRequest, Generation
from dart_ray.envs.base import EnvInputError, StepResult
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.envs.minidesk.oracle import oracle_action
from dart_ray.evaluation.local import LocalSession
from dart_ray.evaluation.suite import evaluate
from dart_ray.records import Action, Observation, Task
from dart_ray.rollout.episode import EpisodeSettings


class Oracle:
    """Clicks where the session's current environment shows the target: solves every task."""

    def __init__(self, session: LocalSession) -> None:
        self.session = session
        screen = EnvConfig()
        self.size = ((screen.screen_width, screen.screen_height),)  # clicks in screen pixels

    async def generate(self, request: GenerateRequest) -> Generation:
        x, y = oracle_action(self.session.env).point  # type: ignore[arg-type,misc]
        text = f"Thought: there.\nAction: click(start_box='({x},{y})')"
        return Generation(text, (1,), (1,), (0.0,), (0.0,), 0, "stop", model_sizes=self.size)


class Silent:
    """A policy server that never answers."""

    async def generate(self, request: GenerateRequest) -> Generation:
        raise ConnectionError("policy server unreachable")


class BadSetup(LocalSession):
    """An environment whose set-up refuses one task (a malformed task file entry)."""

    def __init__(self, config: Config, bad: str) -> None:
        super().__init__(config)
        self.bad = bad

    async def reset(self, task: Task) -> Observation:
        if task.task_id == self.bad:
            raise EnvInputError("the config step names no command")
        return await super().reset(task)


def _tasks(n: int, family: str | None = None) -> list[Task]:
    """MiniDesk tasks, whose family is their kind (`click-button`) unless one is given."""
    tasks = [make_task("click-button", 1, seed) for seed in range(n)]
    if family is None:
        return tasks
    return [
        replace(t, task_id=f"{family}/{t.task_id}", config={**t.config, "family": family})
        for t in tasks
    ]


def _evaluate(session: object, policy: object, tasks: list[Task]):  # type: ignore[no-untyped-def]
    return asyncio.run(evaluate([session], policy, tasks, EpisodeSettings(max_steps=2), wrap=False))  # type: ignore[list-item,arg-type]


def test_an_env_error_leaves_the_rate_with_its_reason_never_a_zero() -> None:
    """A task whose set-up refused it (ENV_ERROR) entered per_task as reward 0: the oracle
    scored 2/3 on three tasks it solves."""
    tasks = _tasks(3)
    session = BadSetup(Config(env=EnvConfig()), bad=tasks[1].task_id)
    res = _evaluate(session, Oracle(session), tasks)
    assert res.success() == 1.0 and len(res.per_task) == 2
    assert res.unscored == [tasks[1].task_id]
    assert res.excluded_by_status() == {"ENV_ERROR": 1}
    assert "the config step names no command" in res.excluded[0].error
    assert res.headline() == (
        "greedy success 100.0% over 2 tasks; not scored, left out of the rate: 1 ENV_ERROR"
    )


def test_a_policy_server_that_never_answers_scores_nothing_not_zero() -> None:
    session = LocalSession(Config(env=EnvConfig()))
    res = _evaluate(session, Silent(), _tasks(2))
    assert res.per_task == {} and res.excluded_by_status() == {"POLICY_ERROR": 2}
    assert all("policy server unreachable" in u.error for u in res.excluded)


class CrashOnce(MiniDeskEnv):
    """Its first environment dies at the first step (a browser or X display that crashed)."""

    crashed = False

    def step(self, action: Action) -> StepResult:
        if not CrashOnce.crashed:
            CrashOnce.crashed = True
            raise RuntimeError("X display :7 went away")
        return super().step(action)


def test_a_crashed_environment_is_rebuilt_and_the_task_retried() -> None:
    """LocalSession kept the env that crashed: every later episode ran on the dead one."""
    env = EnvConfig(kind=f"{CrashOnce.__module__}:CrashOnce")
    session = LocalSession(Config(env=env))
    first = session.env
    res = _evaluate(session, Oracle(session), _tasks(3))
    assert res.aborted == 1 and res.excluded == []
    assert res.success() == 1.0 and len(res.per_task) == 3
    assert session.builds == 2 and session.env is not first


def test_success_by_family_counts_each_task_once() -> None:
    tasks = _tasks(2, "chrome") + _tasks(1)
    session = BadSetup(Config(env=EnvConfig()), bad=tasks[1].task_id)
    res = _evaluate(session, Oracle(session), tasks)
    # the chrome task whose set-up failed is in neither count
    assert res.by_family() == {"chrome": (1, 1), "click-button": (1, 1)}
