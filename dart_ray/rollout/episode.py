"""One episode of one task, from reset to reward.

    obs = reset(task)
    repeat up to max_steps:
        messages = prompt(instruction, last k screenshots, last m responses)
        g = policy.generate(messages)            # text, token ids, log-probs, version
        action = parse(g.text) mapped to screen pixels
        record Step(prompt ids, response ids, log-probs, version, screenshot, action)
        invalid action -> penalise (no-op step) | end the episode | resample
        obs = step(action)
        the env could not carry it out -> its reason on the step; penalise | end
        finished / call_user / env says done -> stop
    reward = evaluate()

An action the environment cannot carry out (a key it cannot press, text too long to type) is
the model's mistake: the step records `invalid action: <reason>` in its action's `error` and
the episode goes on from it (or ends, with `on_invalid = "end"`; `retry` cannot take back an
action already sent, so it goes on). Environment failures do not become rewards: `EnvAborted`
(or a dead session, or one that lost the episode) ends the episode as ABORTED, to be retried
on a fresh session. A policy failure ends it as POLICY_ERROR. Both keep the steps taken so
far, for the record, and the error's message (never Ray's banner and traceback).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import ray

from dart_ray.engines.base import GenerateRequest, Generation, SamplingParams
from dart_ray.envs.base import (
    INVALID_EVENT,
    EnvAborted,
    EnvInputError,
    NoEpisode,
    StepResult,
    error_message,
    invalid_reason,
)
from dart_ray.records import Action, ActionKind, Observation, Status, Step, Task, Trajectory
from dart_ray.uitars.actions import CoordinateMap, parse_response
from dart_ray.uitars.prompts import Turn, build_messages

log = logging.getLogger(__name__)

InvalidPolicy = Literal["penalise", "end", "retry"]


class Session(Protocol):
    """What an episode needs of an environment (an EnvSession actor behind `RaySession`)."""

    async def reset(self, task: Task) -> Observation: ...
    async def step(self, action: object) -> StepResult: ...
    async def evaluate(self) -> float: ...


class Policy(Protocol):
    async def generate(self, request: GenerateRequest) -> Generation: ...


@dataclass(frozen=True)
class EpisodeSettings:
    max_steps: int
    sampling: SamplingParams | None = None
    history_images: int = 1
    history_turns: int = 5
    on_invalid: InvalidPolicy = "penalise"
    resample_limit: int = 2
    min_pixels: int | None = None
    max_pixels: int | None = None


@dataclass(frozen=True)
class Slot:
    """Where an episode belongs: its GRPO group and the retry chain it is part of."""

    group_id: str
    group_size: int
    trace_id: str
    start_version: int
    run_id: str
    trajectory_id: str = ""
    """Set by callers that record the start first (the rollouter's episode ledger)."""


class RaySession:
    """An EnvSession actor as a `Session`."""

    def __init__(self, handle: object) -> None:
        self.handle = handle

    async def reset(self, task: Task) -> Observation:
        return await self.handle.reset.remote(task)  # type: ignore[attr-defined,no-any-return]

    async def step(self, action: object) -> StepResult:
        return await self.handle.step.remote(action)  # type: ignore[attr-defined,no-any-return]

    async def evaluate(self) -> float:
        return await self.handle.evaluate.remote()  # type: ignore[attr-defined,no-any-return]


class ServePolicy:
    """The policy server's Serve handle as a `Policy`."""

    def __init__(self, handle: object) -> None:
        self.handle = handle

    async def generate(self, request: GenerateRequest) -> Generation:
        return await self.handle.generate.remote(request)  # type: ignore[attr-defined,no-any-return]


def new_trajectory_id(group_id: str) -> str:
    return f"{group_id}/{uuid.uuid4().hex[:12]}"


_ENV_FAILURES = (
    EnvAborted,
    NoEpisode,
    ray.exceptions.RayActorError,
    ray.exceptions.ActorUnavailableError,
)


async def run_episode(
    session: Session, policy: Policy, task: Task, slot: Slot, s: EpisodeSettings
) -> Trajectory:
    """Play one episode; never raises for environment or policy failures (see module doc)."""
    tid = slot.trajectory_id or new_trajectory_id(slot.group_id)
    started = time.time()
    steps: list[Step] = []

    def done(status: Status, reward: float = 0.0, error: str | None = None) -> Trajectory:
        return Trajectory(
            trajectory_id=tid,
            run_id=slot.run_id,
            task=task,
            steps=tuple(steps),
            reward=reward,
            status=status,
            trace_id=slot.trace_id or tid,
            group_id=slot.group_id,
            group_size=slot.group_size,
            start_version=slot.start_version,
            started_at=started,
            finished_at=time.time(),
            error=error,
        )

    try:
        obs = await session.reset(task)
    except _ENV_FAILURES as e:
        return done(Status.ABORTED, error=f"reset: {error_message(e)}")
    except EnvInputError as e:  # the task itself is malformed: no retry can mend it
        return _bad_task(done, task, "reset", e)
    extra: dict[str, int] = {}
    if s.min_pixels is not None:
        extra["min_pixels"] = s.min_pixels
    if s.max_pixels is not None:
        extra["max_pixels"] = s.max_pixels
    coords = CoordinateMap.for_screen(obs.width, obs.height, **extra)
    turns = [Turn(obs.screenshot)]
    finished = False
    for i in range(s.max_steps):
        request = GenerateRequest(
            tuple(build_messages(task.instruction, turns, s.history_images, s.history_turns)),
            s.sampling,
        )
        try:
            gen = await policy.generate(request)
            parsed = parse_response(gen.text, _frame(gen, coords))
            tries = 0
            while (
                parsed.action.kind is ActionKind.INVALID
                and s.on_invalid == "retry"
                and tries < s.resample_limit
            ):
                gen = await policy.generate(request)
                parsed = parse_response(gen.text, _frame(gen, coords))
                tries += 1
        except Exception as e:  # the server's failure, whatever its type: recorded, not raised
            log.warning("policy failed on %s step %d: %s", task.task_id, i, e)
            why = f"generate: {type(e).__name__}: {error_message(e)}"
            return done(Status.POLICY_ERROR, error=why)
        steps.append(
            Step(
                step_idx=i,
                prompt_ids=gen.prompt_ids,
                response_ids=gen.response_ids,
                behaviour_logprobs=gen.logprobs,
                entropy=gen.entropy,
                weight_version=gen.weight_version,
                token_versions=gen.token_versions,
                response_text=gen.text,
                action=parsed.action,
                screenshot=turns[-1].screenshot,
                num_images=min(len(turns), s.history_images),
            )
        )
        turns[-1] = Turn(turns[-1].screenshot, gen.text)
        kind = parsed.action.kind
        if kind is ActionKind.INVALID:
            if s.on_invalid == "end":
                break
            turns.append(Turn(turns[-1].screenshot))  # a no-op step: same screen again
            continue
        try:
            screen, why, ended = await _act(session, parsed.action, turns[-1].screenshot)
        except _ENV_FAILURES as e:
            return done(Status.ABORTED, error=f"step {i}: {error_message(e)}")
        if why is not None:  # the model's mistake: recorded on its step
            steps[-1] = replace(steps[-1], action=replace(parsed.action, error=why))
            if s.on_invalid == "end":
                break
        elif kind in (ActionKind.FINISHED, ActionKind.CALL_USER) or ended:
            finished = True
            break
        turns.append(Turn(screen))
    try:
        reward = await session.evaluate()
    except _ENV_FAILURES as e:
        return done(Status.ABORTED, error=f"evaluate: {error_message(e)}")
    except EnvInputError as e:  # an evaluator the task configures wrongly
        return _bad_task(done, task, "evaluate", e)
    return done(Status.OK if finished else Status.TRUNCATED, reward)


def _bad_task(
    done: Callable[..., Trajectory], task: Task, where: str, e: EnvInputError
) -> Trajectory:
    """A task the environment refuses as malformed: logged as ENV_ERROR (no retry, the
    curator drops its group) with the task and the reason, so one bad task file entry costs
    its own episodes, not the rollouter that met it."""
    why = f"{where}: task {task.task_id}: {error_message(e)}"
    log.error("%s", why)
    return done(Status.ENV_ERROR, error=why)


async def _act(session: Session, action: Action, screen: bytes) -> tuple[bytes, str | None, bool]:
    """Send one action: (the screen after it, `invalid action: <reason>` if the environment
    could not carry it out, whether the environment ended the episode). Raises the
    `_ENV_FAILURES`, which are the environment's."""
    try:
        result = await session.step(action)
    except _ENV_FAILURES:
        raise
    except EnvInputError as e:  # an env that refuses the action by raising: the same
        return screen, invalid_reason(error_message(e)), False
    if result.info.get("event") == INVALID_EVENT:
        why = str(result.info.get("error") or "the environment could not carry it out")
        return result.observation.screenshot, invalid_reason(why), False
    return result.observation.screenshot, None, result.done


def _frame(gen: Generation, guess: CoordinateMap) -> CoordinateMap:
    """The frame the model's coordinates are in: the size the engine resized the current
    screenshot to (the last image of the prompt), which follows the served model's own pixel
    budget; `guess` (from the settings' budget) only where the engine does not say."""
    if not gen.model_sizes:
        return guess
    w, h = gen.model_sizes[-1]
    return CoordinateMap(guess.screen_width, guess.screen_height, w, h)
