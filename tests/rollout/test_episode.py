"""run_episode reads the model's coordinates in the frame the engine actually showed it."""

from __future__ import annotations

import asyncio

from dart_ray.config import Config, EnvConfig, MiniDeskOptions
from dart_ray.engines.base import GenerateRequest, Generation
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.envs.minidesk.oracle import oracle_action
from dart_ray.evaluation import LocalSession
from dart_ray.records import Status
from dart_ray.rollout.episode import EpisodeSettings, Slot, run_episode


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
