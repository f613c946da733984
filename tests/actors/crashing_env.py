"""A MiniDesk whose process dies in the middle of its first episode (at its first env step,
or when the episode is scored if no valid action came before): a real crash (os._exit), to
test that a session recovers and the episode is retried, not scored 0.

The task config names a marker file; the crash happens only while it does not exist."""

from __future__ import annotations

import os
from pathlib import Path

from dart_ray.envs.base import StepResult
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.records import Action, Observation, Task


class CrashOnceEnv(MiniDeskEnv):
    _marker: Path | None = None

    def reset(self, task: Task) -> Observation:
        marker = task.config.get("crash_marker")
        self._marker = Path(marker) if marker else None
        return super().reset(task)

    def _crash_once(self) -> None:
        if self._marker is not None and not self._marker.exists():
            self._marker.touch()
            os._exit(1)  # the whole session process dies, mid-episode

    def step(self, action: Action) -> StepResult:
        self._crash_once()
        return super().step(action)

    def evaluate(self) -> float:
        self._crash_once()
        return super().evaluate()
