"""Turn a desktop task's `demo` into UI-TARS actions, reading window positions from the
accessibility tree the way a text-reading policy could."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from typing import Any

from dart_ray.records import Action, ActionKind


def demo_actions(demo: list[dict[str, Any]], a11y: Callable[[], str]) -> Iterator[Action]:
    for s in demo:
        if "focus" in s:
            root = ET.fromstring(a11y())
            w = next(w for w in root.iter("window") if s["focus"] in w.get("name", ""))
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
