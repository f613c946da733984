"""Demonstration writers: an env played by its oracle, each action written as the policy
writes a response (the Thought naming the element, the UI-TARS action in the model's
coordinate frame, the end token).

`dart-ray sft` needs only the `Demonstrator` protocol: reset and step the writer's env, and
ask `next_response()` for the oracle's answer to the current screen. One writer per env kind:

- MiniDesk (`OracleWriter`): the oracle reads the env's scene.
- MiniWoB++ (`MiniWobWriter`): the oracle reads the DOM in the last observation, so the writer
  keeps that observation and the task's page (`dart_ray.envs.miniwob.oracle`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from dart_ray.config import EnvConfig
from dart_ray.config.tree import LATENCY_KIND
from dart_ray.models.loading import PolicyProcessor
from dart_ray.records import Action, Observation, Task
from dart_ray.uitars.actions import CoordinateMap, format_response

if TYPE_CHECKING:
    from dart_ray.envs.base import StepResult
    from dart_ray.envs.miniwob.oracle import MiniWobOracle

Response = tuple[Action, str, list[int]]
"""The oracle's action, its response text and that text's token ids (end token included)."""


class Demonstrator(Protocol):
    """An env and its oracle, as `dart_ray.warmstart.sft.demonstrations` drives them."""

    def reset(self, task: Task) -> Observation: ...

    def step(self, action: Action) -> StepResult: ...

    def next_response(self) -> Response:
        """The oracle's next action on the current screen, its text and its token ids."""
        ...

    def close(self) -> None: ...


def _encode(
    processor: PolicyProcessor, thought: str, action: Action, coords: CoordinateMap
) -> Response:
    text = format_response(thought, action, coords, box_tokens=False)
    tok = processor.tokenizer
    return action, text, list(tok(text + tok.eos_token, add_special_tokens=False)["input_ids"])


class OracleWriter:
    """MiniDesk played by its oracle."""

    def __init__(self, processor: PolicyProcessor, env_config: EnvConfig) -> None:
        from dart_ray.envs.minidesk.env import MiniDeskEnv

        self.processor = processor
        self.env = MiniDeskEnv(env_config)
        self.coords = CoordinateMap.for_screen(
            env_config.screen_width,
            env_config.screen_height,
            processor.min_pixels,
            processor.max_pixels,
        )

    def reset(self, task: Task) -> Observation:
        return self.env.reset(task)

    def step(self, action: Action) -> StepResult:
        return self.env.step(action)

    def next_response(self) -> Response:
        from dart_ray.envs.minidesk.oracle import oracle_action, thought

        action = oracle_action(self.env)
        return _encode(self.processor, thought(self.env.scene, action), action, self.coords)

    def close(self) -> None:
        self.env.close()


class MiniWobWriter:
    """MiniWoB++ in Chromium played by its oracle; a task's `subdomain` must be one the
    oracle solves (`dart_ray.envs.miniwob.oracle.TASKS`)."""

    def __init__(self, processor: PolicyProcessor, env_config: EnvConfig) -> None:
        from dart_ray.envs.miniwob.env import MiniWobEnv

        self.processor = processor
        self.env = MiniWobEnv(env_config)
        s = env_config.miniwob.scale
        # the task area: 160x210 screenshot pixels, times the scale (MiniWobEnv._wrap)
        self.coords = CoordinateMap.for_screen(
            round(160 * s), round(210 * s), processor.min_pixels, processor.max_pixels
        )
        self._oracle: MiniWobOracle | None = None
        self._obs: Observation | None = None

    def reset(self, task: Task) -> Observation:
        from dart_ray.envs.miniwob.oracle import MiniWobOracle

        self._oracle = MiniWobOracle(str(task.config.get("subdomain")))
        self._obs = self.env.reset(task)
        return self._obs

    def step(self, action: Action) -> StepResult:
        result = self.env.step(action)
        self._obs = result.observation
        return result

    def next_response(self) -> Response:
        if self._oracle is None or self._obs is None:
            raise RuntimeError("MiniWobWriter has no page: call reset(task) first")
        action, thought = self._oracle.next_step(self._obs)
        return _encode(self.processor, thought, action, self.coords)

    def close(self) -> None:
        self.env.close()


def make_writer(processor: PolicyProcessor, env_config: EnvConfig) -> Demonstrator:
    """The writer for `env_config.kind`; ValueError for a kind without an oracle."""
    if env_config.kind == "miniwob":
        return MiniWobWriter(processor, env_config)
    if env_config.kind in ("minidesk", LATENCY_KIND):
        return OracleWriter(processor, env_config)
    raise ValueError(
        f"dart-ray sft has no oracle for env.kind {env_config.kind!r} (it has minidesk, miniwob)"
    )
