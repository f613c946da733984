"""UI-TARS actions as pyautogui code, the action language of the OSWorld protocol.

This is where text written by a model becomes a program that runs on a desktop, so one rule
holds without exception: a string from the model only ever appears in the code as a Python
string literal produced by `repr()`, which `ast.literal_eval` reads back as the same string.
No f-string, no `%`, no concatenation of model text into code. Numbers are converted with
`float()`/`int()` and must be finite. Keys of a hotkey must be names pyautogui knows, checked
against an allowlist (and quoted all the same). Tests prove it with hostile strings parsed by
`ast` and typed into a real editor.

`WAIT`, `DONE` and `FAIL` are not code: the OSWorld protocol gives them as bare words.
"""

from __future__ import annotations

import math
import string

from dart_ray.records import Action, ActionKind
from dart_ray.uitars.actions import split_keys

WAIT, DONE, FAIL = "WAIT", "DONE", "FAIL"
PREAMBLE = "import pyautogui, time; pyautogui.FAILSAFE = False; "

_NAMED_KEYS = {
    "enter",
    "return",
    "esc",
    "escape",
    "tab",
    "space",
    "backspace",
    "delete",
    "insert",
    "home",
    "end",
    "pageup",
    "pagedown",
    "up",
    "down",
    "left",
    "right",
    "ctrl",
    "ctrlleft",
    "ctrlright",
    "alt",
    "altleft",
    "altright",
    "shift",
    "shiftleft",
    "shiftright",
    "win",
    "winleft",
    "super",
    "command",
    "capslock",
    "printscreen",
    "menu",
    *(f"f{i}" for i in range(1, 13)),
}
_ALIASES = {
    "control": "ctrl",
    "cmd": "command",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "pgup": "pageup",
    "pgdn": "pagedown",
    "del": "delete",
    "meta": "win",
}
_SINGLE = set(string.ascii_lowercase + string.digits + string.punctuation)


class UnsafeAction(ValueError):
    """An action that cannot be turned into code safely (a non-finite point, an unknown key)."""


def _num(v: float) -> str:
    f = float(v)
    if not math.isfinite(f):
        raise UnsafeAction(f"coordinate {v!r} is not a finite number")
    return str(round(f))


def _xy(p: tuple[float, float] | None, kind: ActionKind) -> str:
    if p is None:
        raise UnsafeAction(f"{kind.value} needs a point")
    return f"{_num(p[0])}, {_num(p[1])}"


def hotkey_keys(text: str) -> list[str]:
    """`'ctrl shift t'`/`'ctrl+s'` -> pyautogui key names; UnsafeAction for unknown keys."""
    keys = []
    for raw in split_keys(text):
        k = _ALIASES.get(raw.lower(), raw.lower())
        if k not in _NAMED_KEYS and k not in _SINGLE:
            raise UnsafeAction(f"unknown key {raw!r}")
        keys.append(k)
    if not keys:
        raise UnsafeAction("hotkey without keys")
    return keys


def to_code(a: Action, scroll_clicks: int = 5) -> str:
    """The pyautogui program (or WAIT/DONE/FAIL) for one action; UnsafeAction if refused."""
    k = a.kind
    if k == ActionKind.CLICK:
        return PREAMBLE + f"pyautogui.click({_xy(a.point, k)})"
    if k == ActionKind.LEFT_DOUBLE:
        return PREAMBLE + f"pyautogui.doubleClick({_xy(a.point, k)})"
    if k == ActionKind.RIGHT_SINGLE:
        return PREAMBLE + f"pyautogui.rightClick({_xy(a.point, k)})"
    if k == ActionKind.DRAG:
        return PREAMBLE + (
            f"pyautogui.moveTo({_xy(a.point, k)}); "
            f"pyautogui.dragTo({_xy(a.end_point, k)}, duration=0.3, button='left')"
        )
    if k == ActionKind.SCROLL:
        d = (a.direction or "down").lower()
        if d not in ("up", "down", "left", "right"):
            raise UnsafeAction(f"unknown scroll direction {a.direction!r}")
        amount = scroll_clicks if d in ("up", "left") else -scroll_clicks
        fn = "scroll" if d in ("up", "down") else "hscroll"
        if a.point is None:  # UI-TARS may leave it out: where the mouse is (pyautogui's rule)
            return PREAMBLE + f"pyautogui.{fn}({amount})"
        return PREAMBLE + f"pyautogui.moveTo({_xy(a.point, k)}); pyautogui.{fn}({amount})"
    if k == ActionKind.HOTKEY:
        keys = ", ".join(repr(key) for key in hotkey_keys(a.text or ""))
        return PREAMBLE + f"pyautogui.hotkey({keys})"
    if k == ActionKind.TYPE:
        return PREAMBLE + _type_code(a.text or "")
    if k == ActionKind.WAIT:
        return WAIT
    if k == ActionKind.FINISHED:
        return DONE
    if k == ActionKind.CALL_USER:
        return FAIL
    raise UnsafeAction(f"{k.value} action: {a.error or 'cannot be executed'}")


def _type_code(text: str) -> str:
    """Lines typed with `write`, newlines pressed as Enter (UI-TARS: a trailing \\n submits)."""
    parts = []
    for i, line in enumerate(text.split("\n")):
        if i:
            parts.append("pyautogui.press('enter')")
        if line:
            parts.append(f"pyautogui.write({line!r}, interval=0.005)")
    return "; ".join(parts) or "pass"
