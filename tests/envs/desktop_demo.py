"""Turn a desktop task's `demo` into UI-TARS actions, reading window positions from the
accessibility tree the way a text-reading policy could."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from typing import Any

from dart_ray.envs.desktop.suite import demo
from dart_ray.envs.osworld.env import LocalDesktopEnv
from dart_ray.records import Action, ActionKind, Task


def _window(name: str, a11y: Callable[[], str], timeout_s: float = 20.0) -> ET.Element:
    """The window whose name holds `name`, waiting for it as a policy would look again."""
    deadline = time.monotonic() + timeout_s
    while True:
        root = ET.fromstring(a11y())
        for w in root.iter("window"):
            if name in w.get("name", ""):
                return w
        if time.monotonic() > deadline:
            names = [w.get("name", "") for w in root.iter("window")]
            raise AssertionError(f"no window named {name!r} in {timeout_s} s: {names}")
        time.sleep(0.25)


def demo_actions(demo: list[dict[str, Any]], a11y: Callable[[], str]) -> Iterator[Action]:
    for s in demo:
        if "focus" in s:
            w = _window(s["focus"], a11y)
            x = int(w.get("x", 0)) + int(w.get("width", 0)) // 2
            y = int(w.get("y", 0)) + int(w.get("height", 0)) // 2
            yield Action(ActionKind.CLICK, point=(float(x), float(y)))
        elif "type" in s:
            yield Action(ActionKind.TYPE, text=s["type"])
        elif "hotkey" in s:
            yield Action(ActionKind.HOTKEY, text=s["hotkey"])
        elif "sleep" in s:
            time.sleep(s["sleep"])
        elif "call_user" in s:
            yield Action(ActionKind.CALL_USER)


def solve(env: LocalDesktopEnv, task: Task) -> float:
    """Play the task's scripted demo on the desktop and return its score."""
    obs = env.reset(task)
    assert (obs.width, obs.height) == (800, 600)
    assert env.client is not None
    for a in demo_actions(demo(task.task_id), env.client.accessibility):
        env.step(a)
    return env.evaluate()
