"""run_episode: the model's coordinates are read in the frame the engine showed it; an action
the environment cannot carry out is a failed step with its reason, never a dead rollout; an
environment failure is ABORTED with its message."""

from __future__ import annotations

import asyncio

import pytest

from actors.env_session import EnvSession, start_session
from dart_ray.config import Config, EnvConfig, EnvLatency, MiniDeskOptions
from dart_ray.engines.base import GenerateRequest, Generation
from dart_ray.envs.base import EnvInputError, StepResult
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.envs.minidesk.oracle import oracle_action
from dart_ray.evaluation.local import LocalSession
from dart_ray.records import Action, ActionKind, Observation, Status, Task, Trajectory
from dart_ray.rollout.episode import EpisodeSettings, RaySession, Slot, run_episode

LATENCY = "dart_ray.envs.latency:LatencyMiniDesk"


class HalfSizePolicy:
    """Answers with the oracle's click in a frame half the screen's size, as a model with a
    small pixel budget would, and says so in `model_sizes`."""

    def __init__(self, session: LocalSession, sizes: tuple[tuple[int, int], ...]) -> None:
        self.session, self.sizes = session, sizes

    async def generate(self, request: GenerateRequest) -> Generation:
        x, y = oracle_action(self.session.env).point  # type: ignore[attr-defined,misc]
        text = f"Thought: I click it.\nAction: click(start_box='({x / 2:.0f},{y / 2:.0f})')"
        return Generation(text, (1,), (1,), (0.0,), (0.0,), 0, "stop", model_sizes=self.sizes)


def _play(sizes: tuple[tuple[int, int], ...]) -> tuple[Status, float]:
    env = EnvConfig(screen_width=336, screen_height=224, minidesk=MiniDeskOptions(placement="grid"))
    session = LocalSession(Config(env=env))
    task = make_task("click-button", 2, 5)
    slot = Slot("g", 1, "", 0, "run")
    settings = EpisodeSettings(max_steps=1)
    t = asyncio.run(run_episode(session, HalfSizePolicy(session, sizes), task, slot, settings))  # type: ignore[arg-type]
    return t.status, t.reward


def test_coordinates_follow_the_size_the_engine_reports() -> None:
    assert _play(((168, 112),)) == (Status.OK, 1.0)


def test_without_a_reported_size_the_settings_budget_is_assumed() -> None:
    # UI-TARS's budget keeps a 336x224 screen at its size: the half-size click misses
    assert _play(()) == (Status.TRUNCATED, 0.0)


class UpdatingPolicy:
    """Waits every turn while the trainer publishes: version 0 for the first turn, an update
    landing mid-response in the second (tokens on 0 then 1) and in the third (2 then 3)."""

    turns = (
        (0, ()),
        (0, (0, 0, 1, 1)),
        (2, (2, 2, 2, 3)),
    )

    def __init__(self) -> None:
        self.turn = 0

    async def generate(self, request: GenerateRequest) -> Generation:
        version, per_token = self.turns[self.turn]
        self.turn += 1
        return Generation(
            "Thought: not yet.\nAction: wait()",
            (1, 2, 3, 4),
            (9,),
            (-1.0,) * 4,
            (0.5,) * 4,
            version,
            "stop",
            token_versions=per_token,
        )


def test_updates_land_between_and_within_turns_and_each_step_carries_its_versions() -> None:
    session = LocalSession(Config(env=EnvConfig(screen_width=336, screen_height=224)))
    task = make_task("click-button", 2, 5)
    settings = EpisodeSettings(max_steps=3)
    t = asyncio.run(
        run_episode(session, UpdatingPolicy(), task, Slot("g", 1, "", 0, "run"), settings)  # type: ignore[arg-type]
    )
    assert [s.weight_version for s in t.steps] == [0, 0, 2]
    assert [tuple(s.token_versions) for s in t.steps] == [(), (0, 0, 1, 1), (2, 2, 2, 3)]
    assert (t.min_version, t.max_version) == (0, 3)  # staleness is judged on the oldest


class Scripted:
    """Answers with the given actions, one a turn (the last one again when they run out)."""

    def __init__(self, *actions: str) -> None:
        self.actions, self.turn = actions, 0

    async def generate(self, request: GenerateRequest) -> Generation:
        action = self.actions[min(self.turn, len(self.actions) - 1)]
        self.turn += 1
        return Generation(f"Thought: go.\nAction: {action}", (1,), (2,), (0.0,), (0.0,), 0, "stop")


def _run(session: object, policy: object, max_steps: int, **settings: object) -> Trajectory:
    task = make_task("scroll-list", 3, 1)
    s = EpisodeSettings(max_steps=max_steps, **settings)  # type: ignore[arg-type]
    return asyncio.run(run_episode(session, policy, task, Slot("g", 1, "", 0, "run"), s))  # type: ignore[arg-type]


def test_a_scroll_without_a_point_is_a_step_not_a_dead_rollout() -> None:
    """`scroll(direction='down')` parses (the point is optional in UI-TARS); it used to raise
    EnvInputError out of the env, through the session and the episode, into the rollouter."""
    session = LocalSession(Config(env=EnvConfig()))
    t = _run(session, Scripted("scroll(direction='down')"), max_steps=2)
    assert (t.status, t.num_steps) == (Status.TRUNCATED, 2)
    assert [s.action.error for s in t.steps] == [None, None]  # a valid action: it scrolled


def test_an_action_the_env_cannot_carry_out_is_a_failed_step_with_its_reason() -> None:
    session = LocalSession(Config(env=EnvConfig(max_type_chars=10)))
    long_type = "type(content='" + "x" * 11 + "')"
    t = _run(session, Scripted(long_type, "finished(content='')"), max_steps=3)
    # the episode went on after the failed step, and the model finished it
    assert (t.status, t.num_steps) == (Status.OK, 2)
    first = t.steps[0].action
    assert first.kind is ActionKind.TYPE and first.text == "x" * 11  # what the model wrote
    assert first.error == "invalid action: type content has 11 characters, more than 10"
    assert t.steps[1].action.error is None
    # on_invalid = "end" ends the episode there (and the evaluator still scores it)
    t = _run(session, Scripted(long_type), max_steps=3, on_invalid="end")
    assert (t.status, t.num_steps, t.reward) == (Status.TRUNCATED, 1, 0.0)


class Refusing:
    """A session whose env refuses every action by raising EnvInputError, as the contract
    allows a third-party env to; its first step raises `first` instead, when given."""

    def __init__(self, first: Exception | None = None) -> None:
        self.env = LocalSession(Config(env=EnvConfig()))
        self.first = first

    async def reset(self, task: Task) -> Observation:
        return await self.env.reset(task)

    async def step(self, action: object) -> StepResult:
        first, self.first = self.first, None
        raise first or EnvInputError("no such key 'hyper'")

    async def evaluate(self) -> float:
        return await self.env.evaluate()


def test_an_env_that_refuses_by_raising_gives_failed_steps_not_a_dead_rollout() -> None:
    t = _run(Refusing(), Scripted("hotkey(key='hyper')"), max_steps=2)
    assert (t.status, t.num_steps) == (Status.TRUNCATED, 2)
    assert [s.action.error for s in t.steps] == ["invalid action: no such key 'hyper'"] * 2


def test_a_session_that_lost_its_episode_aborts_it() -> None:
    """A session actor that Ray restarted between two calls has no episode: that is the
    environment's failure (ABORTED, retried), not an action the model got wrong."""
    lost = EnvSession(EnvConfig(), "restarted")  # a fresh session: never reset
    with pytest.raises(EnvInputError) as e:
        lost.step(Action(ActionKind.WAIT))
    t = _run(Refusing(first=e.value), Scripted("wait()"), max_steps=3)
    assert (t.status, t.num_steps) == (Status.ABORTED, 1)
    assert t.error == "step 0: step without an episode in progress: call reset(task) first"


@pytest.mark.usefixtures("ray_local")
def test_an_aborted_step_records_the_message_not_rays_banner() -> None:
    """Through a real session actor: the EnvAborted arrives wrapped in a RayTaskError whose
    text is a coloured banner and a traceback; the trajectory keeps the message."""
    import ray

    latency = EnvLatency(
        reset_median_s=0.01, reset_sigma=0, reset_lo_s=0, step_median_s=5, step_sigma=0
    )
    cfg = EnvConfig(kind=LATENCY, step_timeout_s=0.5, wait_s=0, latency=latency)
    s = start_session(cfg, "slow-steps")
    try:
        t = _run(RaySession(s), Scripted("wait()"), max_steps=3)
    finally:
        ray.kill(s)
    assert (t.status, t.num_steps) == (Status.ABORTED, 1)
    assert t.error == "step 0: slow-steps: step timed out after 0.5s"


def test_error_message_drops_colours_banners_and_stack_traces() -> None:
    from dart_ray.envs.base import EnvCrashed, error_message

    selenium = EnvCrashed(
        "browser failed on step: WebDriverException: Message: disconnected\n"
        "Stacktrace:\n#0 0x55d4 <unknown>\n#1 0x55d5 <unknown>"
    )
    assert error_message(selenium) == (
        "browser failed on step: WebDriverException: Message: disconnected"
    )
    # a RayTaskError's text (its cause gone), as Ray 2.60 writes it
    banner = RuntimeError(
        "\x1b[36mray::EnvSession.step()\x1b[39m (pid=1, ip=127.0.0.1, actor_id=ab)\n"
        "           ^^^^^^^^^^^^^^^^^^^^\n"
        '  File "/x/env_session.py", line 109, in step\n'
        "    raise EnvAborted(why)\n"
        "dart_ray.envs.base.EnvAborted: env-0: step timed out after 30s"
    )
    assert error_message(banner) == "dart_ray.envs.base.EnvAborted: env-0: step timed out after 30s"
    assert error_message(RuntimeError("x" * 600)) == "x" * 497 + "..."
    assert error_message(RuntimeError("")) == "RuntimeError"


class BadTask:
    """A session whose env refuses the task itself (a malformed task file entry) in `where`."""

    def __init__(self, where: str) -> None:
        self.env = LocalSession(Config(env=EnvConfig()))
        self.where = where

    async def reset(self, task: Task) -> Observation:
        if self.where == "reset":
            raise EnvInputError("seed must be an integer, got 'x'")
        return await self.env.reset(task)

    async def step(self, action: object) -> StepResult:
        return await self.env.step(action)  # type: ignore[arg-type]

    async def evaluate(self) -> float:
        raise EnvInputError("the evaluator names no metric")


@pytest.mark.parametrize("where", ["reset", "evaluate"])
def test_a_malformed_task_is_an_env_error_naming_it_not_a_dead_rollouter(where: str) -> None:
    """EnvInputError from reset or evaluate went out of run_episode into the rollouter's
    loop, which re-raises what its episodes raise: one bad task ended every rollout."""
    t = _run(BadTask(where), Scripted("finished(content='')"), max_steps=2)
    assert t.status is Status.ENV_ERROR
    assert t.num_steps == (0 if where == "reset" else 1)
    reason = (
        "seed must be an integer, got 'x'" if where == "reset" else "the evaluator names no metric"
    )
    assert t.error == f"{where}: task {t.task.task_id}: {reason}"
