"""Success rate of the served policy on a task suite: greedy episodes, no logging.

The same episode code as training plays each task (so the 7B model and the tiny one are
measured the same way); sampling is greedy unless `samples > 1`, which gives pass@k.

Only an episode the environment scored (OK, TRUNCATED) enters a success rate. An episode that
ended on the environment or the policy server (ENV_ERROR: the task's set-up or evaluator
refused it; POLICY_ERROR: no answer; ABORTED once its retries ran out) says nothing about the
model: it is counted apart, with its reason, and never read as a 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from dart_ray.engines.base import SamplingParams
from dart_ray.records import Status, Task
from dart_ray.rollout.episode import EpisodeSettings, Policy, RaySession, Slot, run_episode


@dataclass(frozen=True, slots=True)
class Unscored:
    """An episode left out of the success rate, and why."""

    task_id: str
    status: Status
    """ENV_ERROR, POLICY_ERROR, or ABORTED (every retry aborted)."""
    error: str


@dataclass
class EvalResult:
    per_task: dict[str, list[float]] = field(default_factory=dict)
    """Rewards of every scored episode (OK or TRUNCATED) of each task."""
    aborted: int = 0
    """Attempts the environment aborted (each retried on a fresh environment)."""
    excluded: list[Unscored] = field(default_factory=list)
    """Episodes that ended without a score: out of every rate, counted here by status."""
    families: dict[str, str] = field(default_factory=dict)
    """Task id -> family (`task.config["family"]`: OSWorld's domain), where the task names one."""
    success_threshold: float = 1.0
    sampling: str = "greedy"
    """How the episodes were decoded: `greedy`, or `sampled (temperature T, top-p P, top-k K)`
    (pass@k evaluations): a sampled rate is not a greedy one and is never shown as one."""

    @property
    def unscored(self) -> list[str]:
        """Tasks with no scored episode: left out of the success rate, named here."""
        return sorted({u.task_id for u in self.excluded} - self.per_task.keys())

    def excluded_by_status(self) -> dict[str, int]:
        """Episodes left out of the rate, per status (`{"ENV_ERROR": 2}`)."""
        counts: dict[str, int] = {}
        for u in self.excluded:
            counts[u.status.value] = counts.get(u.status.value, 0) + 1
        return counts

    def by_family(self) -> dict[str, tuple[int, int]]:
        """Family -> (tasks solved on the first episode, tasks scored), for tasks that name a
        family: OSWorld's per-domain success."""
        out: dict[str, tuple[int, int]] = {}
        for task_id, rewards in self.per_task.items():
            family = self.families.get(task_id)
            if family is None:
                continue
            solved, scored = out.get(family, (0, 0))
            out[family] = (solved + int(rewards[0] >= self.success_threshold), scored + 1)
        return dict(sorted(out.items()))

    @property
    def greedy(self) -> bool:
        return self.sampling == "greedy"

    def success_per_episode(self) -> float:
        """The fraction of all episodes that succeeded (a sampled evaluation's success rate)."""
        rewards = [r for rs in self.per_task.values() for r in rs]
        return sum(r >= self.success_threshold for r in rewards) / len(rewards) if rewards else 0.0

    def headline(self) -> str:
        """One line that says what was measured: greedy success, or sampled success per
        episode with pass@k."""
        n = len(self.per_task)
        if self.greedy:
            line = f"greedy success {self.success(1):.1%} over {n} tasks"
        else:
            k = max((len(v) for v in self.per_task.values()), default=1)
            line = (
                f"{self.sampling}, {k} episodes per task: success per episode "
                f"{self.success_per_episode():.1%}, pass@{k} {self.success(k):.1%} over {n} tasks"
            )
        if self.excluded:
            apart = ", ".join(f"{v} {k}" for k, v in self.excluded_by_status().items())
            line += f"; not scored, left out of the rate: {apart}"
        return line

    def success(self, k: int = 1) -> float:
        """Fraction of tasks solved within their first k episodes (pass@k; k=1: success rate)."""
        if not self.per_task:
            return 0.0
        solved = [any(r >= self.success_threshold for r in rs[:k]) for rs in self.per_task.values()]
        return sum(solved) / len(solved)

    @property
    def episodes(self) -> int:
        return sum(len(v) for v in self.per_task.values())


async def evaluate(
    sessions: Sequence[object],
    policy: Policy,
    tasks: Sequence[Task],
    settings: EpisodeSettings,
    *,
    samples: int = 1,
    success_threshold: float = 1.0,
    max_aborts: int = 2,
    wrap: bool = True,
) -> EvalResult:
    """Play every task `samples` times over the sessions (greedy for a single sample).
    `wrap`: the sessions are EnvSession actor handles (else objects with the Session API)."""
    base = settings.sampling or SamplingParams()
    if samples == 1:
        settings = EpisodeSettings(
            **{**settings.__dict__, "sampling": SamplingParams(0.0, 1.0, base.max_new_tokens)}
        )
        how = "greedy"
    else:
        how = f"sampled (temperature {base.temperature:g}, top-p {base.top_p:g}"
        how += f", top-k {base.top_k})" if base.top_k else ")"
    result = EvalResult(success_threshold=success_threshold, sampling=how)
    result.families = {t.task_id: str(t.config["family"]) for t in tasks if "family" in t.config}
    idle: asyncio.Queue[object] = asyncio.Queue()
    for s in sessions:
        idle.put_nowait(s)

    async def one(task: Task, k: int) -> None:
        for _ in range(max_aborts + 1):
            session = await idle.get()
            try:
                slot = Slot(f"eval/{task.task_id}#{k}", 1, "", -1, "eval")
                env = RaySession(session) if wrap else session
                t = await run_episode(env, policy, task, slot, settings)  # type: ignore[arg-type]
            finally:
                idle.put_nowait(session)
            if t.status.trainable:
                result.per_task.setdefault(task.task_id, []).append(t.reward)
                return
            if t.status is not Status.ABORTED:  # ENV_ERROR, POLICY_ERROR: no retry
                break
            result.aborted += 1
        result.excluded.append(Unscored(task.task_id, t.status, t.error or ""))

    await asyncio.gather(*(one(t, k) for t in tasks for k in range(samples)))
    return result
