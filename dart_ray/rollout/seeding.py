"""Seeding the success-replay pool with written solutions (`curation.replay_seeds`).

DART-GUI's experience pool gives an all-fail group one of its task's earlier successes, so a
task the policy rarely solves still has a signal. A policy that never solved a task has none
to give; a written solution can stand in. At a run's start each training task that has one
is played once in the run's own environments and scored by their evaluator, every response
teacher-forced through the policy server (`GenerateRequest.forced`): the text is the
script's, the tokens, log-probs and entropies are the policy's under the starting weights,
as if it had drawn them, so the trainer's importance weights treat the seed as a sample of
those weights and the staleness bound applies to it like to any replay. A seed that
succeeds becomes its task's newest success (`DurableLog.record_seed`): not a logged rollout
(the curator never claims it; the task's attempts and successes are the policy's own),
only what replay gives an all-fail group while it is fresh enough, and until the policy's
own success replaces it. A seed ages like any success: when a group of a task opens and its
newest success has used half the staleness bound (`needs_seed`), the rollouter plays the
seed again at the current weights first, so a task keeps its signal for the whole run.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from PIL import Image

from dart_ray.engines.base import GenerateRequest, Generation
from dart_ray.engines.script import next_response
from dart_ray.records import ActionKind, Task, Trajectory
from dart_ray.rollout.episode import EpisodeSettings, Policy, Session, Slot, run_episode
from dart_ray.uitars.actions import format_action, parse_response
from dart_ray.uitars.geometry import CoordinateMap


class ScriptedPolicy:
    """A `Policy` whose responses are a script's, scored by `policy` (teacher forcing).

    A script is written in screen pixels; a model writes points in the frame the engine
    resized the screenshot to (`Generation.model_sizes`), and the episode reads them so. The
    first response for a screen size learns that frame from the engine's answer; where it
    differs, the response is forced again with its points in the model's frame, which is
    then known for every later screen of that size."""

    def __init__(self, policy: Policy, scripts: Mapping[str, list[str]]) -> None:
        self.policy = policy
        self.scripts = dict(scripts)
        self._frames: dict[tuple[int, int], tuple[int, int]] = {}
        """Screen size -> the model's frame for it."""

    async def generate(self, request: GenerateRequest) -> Generation:
        text = next_response(self.scripts, request.messages)
        screens = [b for m in request.messages for b in m.images]
        size = Image.open(io.BytesIO(screens[-1])).size if screens else None
        frame = self._frames.get(size) if size else None
        if size is not None and frame is None:
            first = await self.policy.generate(replace(request, forced=text))
            frame = self._frames[size] = first.model_sizes[-1] if first.model_sizes else size
            if frame == size:
                return first
        if size is not None and frame is not None and frame != size:
            text = in_frame(text, CoordinateMap(*size, *frame))
        return await self.policy.generate(replace(request, forced=text))


def in_frame(response: str, coords: CoordinateMap) -> str:
    """`response` (written in screen pixels) with its action's points in `coords`' model
    frame; a response whose action has no point is returned as it is."""
    parsed = parse_response(response)  # no frame: the points stay as written
    a = parsed.action
    if a.kind is ActionKind.INVALID or (a.point is None and a.end_point is None):
        return response
    head = response[: response.rindex("Action:")]
    return f"{head}Action: {format_action(a, coords, box_tokens=False)}"


@dataclass(frozen=True)
class SeedOutcome:
    """One task's seed episode, for the run's report."""

    task_id: str
    reward: float
    status: str
    steps: int
    seeded: bool
    """It succeeded and is its task's newest success now."""
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def needs_seed(last_success_version: int | None, version: int, bound: int) -> bool:
    """Whether a task should be seeded (again) before a group of it opens at `version`: it
    has no success, or its newest one has used more than half the staleness bound `bound`,
    so it could be past the bound by the time the group is curated (the versions published
    while the group plays)."""
    return last_success_version is None or version - last_success_version > bound // 2


async def play_seeds(
    tasks: Sequence[Task],
    scripted: ScriptedPolicy,
    sessions: Sequence[Session],
    settings: EpisodeSettings,
    *,
    run_id: str,
    version: int,
    keep: Callable[[Trajectory], bool],
) -> list[SeedOutcome]:
    """Play each of `tasks` once with its script (`scripted`, which keeps the model frames
    it learnt between calls) over `sessions`, one episode per session at a time. `keep(t)`
    (in a thread: it writes) gets every scored episode and returns whether it seeded the
    replay pool (a success it recorded). Outcomes in `tasks`' order."""
    idle: asyncio.Queue[Session] = asyncio.Queue()
    for s in sessions:
        idle.put_nowait(s)

    async def one(task: Task) -> SeedOutcome:
        slot = Slot(f"{run_id}/seed/{task.task_id}", 1, "", version, run_id)
        steps = max(settings.max_steps, len(scripted.scripts[task.instruction.strip()]) + 1)
        session = await idle.get()
        try:
            t = await run_episode(session, scripted, task, slot, replace(settings, max_steps=steps))
        finally:
            idle.put_nowait(session)
        ok = t.status.trainable and await asyncio.to_thread(keep, t)
        return SeedOutcome(task.task_id, t.reward, t.status.value, t.num_steps, ok, t.error)

    return list(await asyncio.gather(*(one(t) for t in tasks)))


class ReplaySeeder:
    """One rollouter's replay seeds: the first seeding of its tasks and their renewal.

    `last_success(task_id)` reads a task's newest success version from the log (None: none);
    `record(t)` records a seed episode that succeeded and says whether it did (a failure is
    not recorded). Both block: they run in a thread."""

    def __init__(
        self,
        scripted: ScriptedPolicy,
        settings: EpisodeSettings,
        *,
        run_id: str,
        bound: int,
        last_success: Callable[[str], int | None],
        record: Callable[[Trajectory], bool],
    ) -> None:
        self.scripted = scripted
        self.settings = settings
        self.run_id = run_id
        self.bound = bound
        self.last_success = last_success
        self.record = record

    async def due(self, task: Task, version: int) -> bool:
        """`task` has a script and no fresh enough success (`needs_seed`)."""
        if task.instruction.strip() not in self.scripted.scripts:
            return False
        last = await asyncio.to_thread(self.last_success, task.task_id)
        return needs_seed(last, version, self.bound)

    async def play(
        self, tasks: Sequence[Task], sessions: Sequence[Session], version: int
    ) -> list[SeedOutcome]:
        """Seed each of `tasks` that is `due` over `sessions` (`play_seeds`)."""
        due = [t for t in tasks if await self.due(t, version)]
        return await play_seeds(
            due,
            self.scripted,
            sessions,
            self.settings,
            run_id=self.run_id,
            version=version,
            keep=self.record,
        )
