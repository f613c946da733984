"""`dart-ray eval` in one process: the model in a local engine, environments in threads.

The episodes run through the same `run_episode` as training (same prompts, parsing and
coordinate mapping); only the transport differs: no Ray, no Serve, so an evaluation starts
in seconds. `dart_ray.evaluation.suite` does the scheduling and scoring.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from dart_ray.config import Config
from dart_ray.engines import make_engine
from dart_ray.engines.base import Engine, GenerateRequest, Generation, SamplingParams
from dart_ray.envs.base import EnvAborted, EnvInputError, StepResult, make_env
from dart_ray.evaluation.suite import EvalResult, evaluate
from dart_ray.records import Observation, Task
from dart_ray.rollout.episode import EpisodeSettings

log = logging.getLogger(__name__)


class LocalSession:
    """An environment in this process, with EnvSession's contract: failures -> EnvAborted,
    and the environment that failed is closed and built afresh at the next reset (as
    EnvSession does), so a crashed browser or desktop costs its episode, not the rest of
    the evaluation."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.env = make_env(config.env)
        self.builds = 1
        """Environments built, the first included."""
        self._broken = False

    async def _call(self, what: str, fn, *args):  # type: ignore[no-untyped-def]
        if self._broken:
            raise EnvAborted(f"{what}: the episode was lost with its environment; reset first")
        try:
            return await asyncio.to_thread(fn, *args)
        except EnvInputError:
            raise
        except Exception as e:
            await self._discard()
            raise EnvAborted(f"{what} failed: {type(e).__name__}: {e}") from e

    async def _discard(self) -> None:
        self._broken = True
        try:
            await asyncio.to_thread(self.env.close)
        except Exception as e:  # a broken env may fail to close; it is dropped anyway
            log.warning("closing a failed environment: %s: %s", type(e).__name__, e)

    async def reset(self, task: Task) -> Observation:
        if self._broken:
            try:
                self.env = await asyncio.to_thread(make_env, self.config.env)
            except Exception as e:
                raise EnvAborted(f"environment failed to start: {type(e).__name__}: {e}") from e
            self.builds += 1
            self._broken = False
        return await self._call("reset", self.env.reset, task)  # type: ignore[no-any-return]

    async def step(self, action: object) -> StepResult:
        return await self._call("step", self.env.step, action)  # type: ignore[no-any-return]

    async def evaluate(self) -> float:
        return await self._call("evaluate", self.env.evaluate)  # type: ignore[no-any-return]

    async def close(self) -> None:
        if not self._broken:
            await asyncio.to_thread(self.env.close)


class LocalPolicy:
    """The engine, one request at a time. Serialised on purpose: forwards running at once in
    threads share torch's intra-op pool, and the order of their reductions then varies from
    run to run; near a tie a greedy token flips (10 of 300 held-out episodes of the default
    run's warm start differed between two identical evaluations). One at a time, an
    evaluation gives the same answer every time, so a before/after difference is the model's."""

    def __init__(self, engine: Engine, defaults: SamplingParams) -> None:
        self.engine = engine
        self.defaults = defaults
        self._one_at_a_time = asyncio.Lock()

    async def generate(self, request: GenerateRequest) -> Generation:
        prepared = self.engine.prepare(request, self.defaults)
        async with self._one_at_a_time:
            return (await self.engine.generate([prepared]))[0]


def _suite(config: Config, suite: str) -> list[Task]:
    from dart_ray.envs.minidesk.generate import load_tasks
    from dart_ray.envs.suites import SPLITS, load_suite

    if suite in SPLITS:
        return load_suite(config, suite)
    return load_tasks(Path(suite), "heldout")


def run_eval(
    config: Config,
    checkpoint: Path,
    suite: str,
    n_tasks: int = 0,
    samples: int = 1,
    on_ray: bool = False,
) -> EvalResult:
    """The suite's success rate. `on_ray`: the environments are EnvSession actors on Ray
    (a local Ray of this command's own, or `cluster.address`), as in a run: placed by the
    `env` resource, restarted on a crash, a node's OSWorld evaluator shared; the model stays
    in this process either way."""
    tasks = _suite(config, suite)
    if n_tasks:
        tasks = tasks[:n_tasks]
    p = config.policy
    engine = make_engine(p, checkpoint)
    defaults = SamplingParams(p.temperature, p.top_p, p.max_new_tokens, top_k=p.top_k)
    settings = EpisodeSettings(
        max_steps=config.rollout.max_steps,
        sampling=defaults,
        history_images=p.history_images,
        history_turns=p.history_turns,
        on_invalid=config.rollout.on_invalid_action,
    )

    if on_ray:
        return _on_ray(config, tasks, LocalPolicy(engine, defaults), settings, samples)

    async def go() -> EvalResult:
        sessions = [LocalSession(config) for _ in range(max(1, min(config.env.num_sessions, 4)))]
        try:
            return await evaluate(
                sessions,
                LocalPolicy(engine, defaults),
                tasks,
                settings,
                samples=samples,
                success_threshold=config.rollout.success_threshold,
                wrap=False,
            )
        finally:
            for s in sessions:
                await s.close()

    return asyncio.run(go())


def _on_ray(
    config: Config,
    tasks: list[Task],
    policy: LocalPolicy,
    settings: EpisodeSettings,
    samples: int,
) -> EvalResult:
    import ray

    from actors.env_host import actors_of, start_sessions
    from dart_ray.run.preflight import start_ray

    started = not ray.is_initialized()
    start_ray(config, log_to_driver=False)
    sessions = start_sessions(config.env, prefix=f"eval-{os.getpid()}")
    try:
        return asyncio.run(
            evaluate(
                sessions,
                policy,
                tasks,
                settings,
                samples=samples,
                success_threshold=config.rollout.success_threshold,
            )
        )
    finally:
        for a in actors_of(sessions):
            ray.kill(a)
        if started:
            ray.shutdown()
