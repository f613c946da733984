"""MiniDeskEnv: the embedded default environment, a synthetic desktop drawn with PIL.

No browser, no X server, no subprocess: a step is a few hundred microseconds of Python and
drawing, so a laptop can roll out thousands of episodes while a real desktop does a handful.
It exists to develop and test the whole RL loop on CPU, and to train a tiny model far enough
to see learning (held-out success rising) in minutes.

Time does not move in MiniDesk (nothing changes unless the policy acts), so `wait()` returns at
once whatever `env.wait_s` says: a pause would only slow rollouts. An action it cannot carry out
(a click without a point, text over `env.max_type_chars`) is a failed step that says why. A
scroll without a point scrolls where the pointer is: the last point the policy acted at, the
centre of the screen before any (pyautogui's rule on a real desktop).

Observations are `FrameObservation`s: the PNG is encoded only when someone reads
`.screenshot` (or the observation leaves the process), unless `env.minidesk.encode_png` asks
for it in every step (the benchmark measures both).
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from dart_ray.config import EnvConfig
from dart_ray.envs.base import (
    Env,
    EnvInputError,
    FrameObservation,
    InvalidAction,
    StepResult,
    check_type_length,
    invalid_step,
)
from dart_ray.envs.minidesk import interact
from dart_ray.envs.minidesk.render import background, render
from dart_ray.envs.minidesk.scene import Scene
from dart_ray.envs.pyautogui_code import UnsafeAction, hotkey_keys
from dart_ray.records import Action, ActionKind, Observation, Task

_QUIET = {"nothing", "typed_nowhere", "blocked_by_dialog", "invalid", "wait", "finished"}


class MiniDeskEnv(Env):
    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config or EnvConfig()
        self.options = self.config.minidesk
        self._scene: Scene | None = None
        self._base: Image.Image | None = None
        self._frame: Image.Image | None = None
        self._obs: Observation | None = None
        self._done = False
        self._pointer = self._centre()
        self.task: Task | None = None

    def _centre(self) -> tuple[float, float]:
        return self.config.screen_width / 2, self.config.screen_height / 2

    @property
    def scene(self) -> Scene:
        if self._scene is None:
            raise EnvInputError("MiniDesk has no task: call reset(task) first")
        return self._scene

    def reset(self, task: Task) -> Observation:
        spec = task.config
        scene = Scene.from_spec(spec)
        placement = self.options.placement
        if placement == "task":
            placement = str(spec.get("placement", "flow"))
        seed = spec.get("seed", 0)
        if not isinstance(seed, int):
            raise EnvInputError(f"task {task.task_id}: seed must be an integer, got {seed!r}")
        scene.layout(
            self.config.screen_width,
            self.config.screen_height,
            placement,
            seed,
            self.options.jitter,
        )
        self._scene, self.task, self._done = scene, task, False
        self._pointer = self._centre()
        self._base = background(scene, self.options.wallpaper)
        return self._observe(redraw=True)

    def step(self, action: Action) -> StepResult:
        s = self.scene
        if self._done:
            return StepResult(self._observe(redraw=False), True, {"event": "episode_over"})
        try:
            check_type_length(action, self.config.max_type_chars)
            info = self._apply(s, action)
        except InvalidAction as e:
            return invalid_step(self._observe(redraw=False), str(e))
        self._done = s.committed is not None or action.kind in (
            ActionKind.FINISHED,
            ActionKind.CALL_USER,
        )
        if s.committed is not None:
            info["committed"] = s.committed
        return StepResult(self._observe(redraw=info["event"] not in _QUIET), self._done, info)

    def _apply(self, s: Scene, a: Action) -> dict[str, Any]:
        k = a.kind
        if k == ActionKind.CLICK:
            return interact.click(s, *self._point(a.point, k))
        if k == ActionKind.LEFT_DOUBLE:
            p = self._point(a.point, k)
            interact.click(s, *p)
            if s.committed is not None:  # the first click already ended the episode
                return {"event": "commit", "target": s.committed}
            return interact.click(s, *p)
        if k == ActionKind.RIGHT_SINGLE:
            self._point(a.point, k)
            return {"event": "nothing"}  # MiniDesk has no context menus
        if k == ActionKind.DRAG:
            start = self._point(a.point, k)
            return interact.drag(s, start, self._point(a.end_point, k, "an end point"))
        if k == ActionKind.TYPE:
            return interact.type_text(s, a.text or "")
        if k == ActionKind.HOTKEY:
            try:  # the key names a real desktop knows (one table: pyautogui's)
                hotkey_keys(a.text or "")
            except UnsafeAction as e:
                raise InvalidAction(str(e)) from None
            return interact.key(s, a.text or "")
        if k == ActionKind.SCROLL:
            x, y = self._pointer if a.point is None else self._point(a.point, k)
            return interact.scroll(s, x, y, (a.direction or "").lower())
        if k == ActionKind.WAIT:
            return {"event": "wait"}
        if k in (ActionKind.FINISHED, ActionKind.CALL_USER):
            return {"event": "finished"}
        raise InvalidAction(a.error or f"{k.value} is not an action")

    def _point(
        self, p: tuple[float, float] | None, kind: ActionKind, what: str = "a point"
    ) -> tuple[float, float]:
        """`p`; the pointer moves there (kept on the screen, as a real one is); InvalidAction
        without one."""
        if p is None:
            raise InvalidAction(f"{kind.value} needs {what}")
        w, h = self.config.screen_width, self.config.screen_height
        self._pointer = (min(max(p[0], 0.0), w - 1.0), min(max(p[1], 0.0), h - 1.0))
        return p

    def _observe(self, redraw: bool) -> Observation:
        if redraw or self._frame is None:
            assert self._base is not None
            self._frame = render(self.scene, self._base, self.options.button_colours)
            obs: Observation = FrameObservation(self._frame)
            if self.options.encode_png:
                obs = obs.materialize()  # type: ignore[attr-defined]
            self._obs = obs
        assert self._obs is not None
        return self._obs

    def evaluate(self) -> float:
        return 1.0 if self.scene.success() else 0.0

    @property
    def done(self) -> bool:
        return self._done

    def close(self) -> None:
        self._scene = self._base = self._frame = self._obs = None
