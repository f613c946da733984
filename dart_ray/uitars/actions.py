"""The UI-TARS-1.5 computer-use action grammar: parse model text, map coordinates, emit code.

The policy writes `Thought: ...\\nAction: click(start_box='<|box_start|>(x,y)<|box_end|>')`.
Its coordinates are absolute pixels in the screenshot *as the image processor resized it*
(`smart_resize`: both sides multiples of 28, the area clamped to [min_pixels, max_pixels]), so
they are mapped back to the screen by the ratio of screen size to resized size
(`dart_ray.uitars.geometry`, re-exported here).

Parsing never raises: a sampled policy writes anything at temperature 1, and a crash in the
rollouter would lose the whole trajectory. What cannot be parsed becomes an `INVALID` action
whose `error` says why, and the rollouter decides what an invalid step costs. The parser is a
small hand-written scanner rather than `ast.literal_eval` or a regex over the whole call: it
accepts the quoting UI-TARS actually writes (`'...'` with backslash escapes) and reports the
position of what it could not read.

Turning an action into the Python code an OSWorld-style desktop runs is the desktop's job:
`dart_ray.envs.pyautogui_code` (model strings enter the code only as literals, proven on the
syntax tree).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dart_ray.records import Action, ActionKind
from dart_ray.uitars.geometry import FACTOR, MAX_PIXELS, MIN_PIXELS, CoordinateMap, smart_resize

__all__ = [
    "FACTOR",
    "MAX_PIXELS",
    "MIN_PIXELS",
    "CoordinateMap",
    "ParsedResponse",
    "format_action",
    "format_response",
    "parse_action",
    "parse_response",
    "smart_resize",
    "split_keys",
]

BOX_START = "<|box_start|>"
BOX_END = "<|box_end|>"
SCROLL_DIRECTIONS = ("up", "down", "left", "right")


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """A model response split into its parts; `action` is INVALID when it could not be read."""

    thought: str
    action_text: str
    action: Action


# --------------------------------------------------------------------------- scanning


class _ParseError(Exception):
    """Internal only: turned into an INVALID action, never escapes this module."""


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _scan_string(s: str, i: int) -> tuple[str, int]:
    quote = s[i]
    out: list[str] = []
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
        elif c == quote:
            return "".join(out), i + 1
        else:
            out.append(c)
            i += 1
    raise _ParseError(f"unterminated string starting with {quote}")


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _scan_call(s: str) -> tuple[str, dict[str, str]]:
    """`name(key='value', key2=bare)` -> (name, {key: value}); trailing text is ignored."""
    i = _skip_ws(s, 0)
    m = _IDENT.match(s, i)
    if m is None:
        raise _ParseError(f"expected an action name at {s[i : i + 20]!r}")
    name, i = m.group(), _skip_ws(s, m.end())
    if i >= len(s) or s[i] != "(":
        raise _ParseError(f"expected '(' after {name!r}")
    i = _skip_ws(s, i + 1)
    args: dict[str, str] = {}
    while True:
        if i >= len(s):
            raise _ParseError(f"missing ')' in {name}(...)")
        if s[i] == ")":
            return name, args
        km = _IDENT.match(s, i)
        if km is None:
            raise _ParseError(f"expected an argument name at {s[i : i + 20]!r}")
        key, i = km.group(), _skip_ws(s, km.end())
        if i >= len(s) or s[i] != "=":
            raise _ParseError(f"expected '=' after argument {key!r}")
        i = _skip_ws(s, i + 1)
        if i < len(s) and s[i] in "'\"":
            value, i = _scan_string(s, i)
        else:
            j = i
            while j < len(s) and s[j] not in ",)":
                j += 1
            value, i = s[i:j].strip(), j
        if key in args:
            raise _ParseError(f"argument {key!r} given twice")
        args[key] = value
        i = _skip_ws(s, i)
        if i < len(s) and s[i] == ",":
            i = _skip_ws(s, i + 1)


_NUMBER = r"-?\d+(?:\.\d+)?"
_COORDS = re.compile(
    rf"^[\(\[]\s*({_NUMBER})\s*,\s*({_NUMBER})(?:\s*,\s*({_NUMBER})\s*,\s*({_NUMBER}))?\s*[\)\]]$"
)


def parse_point(box: str) -> tuple[float, float]:
    """A box string -> a point in model pixels. `(x,y)` is a point, `(x1,y1,x2,y2)` its centre.

    The `<|box_start|>`/`<|box_end|>` wrappers are optional (decoding with special tokens
    skipped drops them). Raises `_ParseError`: only for use inside this module.
    """
    inner = box.strip().removeprefix(BOX_START).removesuffix(BOX_END).strip()
    m = _COORDS.match(inner)
    if m is None:
        raise _ParseError(f"cannot read coordinates from {box[:60]!r}")
    x1, y1, x2, y2 = m.groups()
    if not all(math.isfinite(float(v)) for v in m.groups() if v is not None):
        raise _ParseError(f"coordinates out of range in {box[:60]!r}")
    if x2 is None:
        return float(x1), float(y1)
    return (float(x1) + float(x2)) / 2, (float(y1) + float(y2)) / 2


_POINT_KEYS = ("start_box", "point", "start_point")
_END_KEYS = ("end_box", "end_point")
_POINTER_KINDS = {
    "click": ActionKind.CLICK,
    "left_single": ActionKind.CLICK,
    "left_double": ActionKind.LEFT_DOUBLE,
    "right_single": ActionKind.RIGHT_SINGLE,
}


def split_keys(keys: str) -> list[str]:
    """The keys of a hotkey: UI-TARS separates them with spaces (`'ctrl c'`), pyautogui-style
    text with `+` (`'ctrl+c'`); a `+` that stands alone is the plus key (`'+'`, `'ctrl +'`)."""
    out: list[str] = []
    for token in keys.split():
        out += [k for k in token.split("+") if k] if len(token) > 1 else [token]
    return out


def _arg(args: dict[str, str], keys: tuple[str, ...], name: str) -> str:
    for k in keys:
        if k in args:
            return args[k]
    raise _ParseError(f"{name} needs {keys[0]}")


def _build(name: str, args: dict[str, str], coords: CoordinateMap | None) -> Action:
    def point(keys: tuple[str, ...]) -> tuple[float, float]:
        x, y = parse_point(_arg(args, keys, name))
        return coords.to_screen(x, y) if coords is not None else (x, y)

    if name in _POINTER_KINDS:
        return Action(_POINTER_KINDS[name], point=point(_POINT_KEYS))
    if name == "drag":
        return Action(ActionKind.DRAG, point=point(_POINT_KEYS), end_point=point(_END_KEYS))
    if name == "hotkey":
        keys = _arg(args, ("key", "keys", "hotkey"), name).strip()
        if not keys:
            raise _ParseError("hotkey has no key")
        return Action(ActionKind.HOTKEY, text=keys)
    if name == "type":
        return Action(ActionKind.TYPE, text=_arg(args, ("content", "text"), name))
    if name == "scroll":
        direction = _arg(args, ("direction",), name).strip().lower()
        if direction not in SCROLL_DIRECTIONS:
            raise _ParseError(f"scroll direction {direction!r} is not one of {SCROLL_DIRECTIONS}")
        has_point = any(k in args for k in _POINT_KEYS)
        return Action(
            ActionKind.SCROLL, point=point(_POINT_KEYS) if has_point else None, direction=direction
        )
    if name == "wait":
        return Action(ActionKind.WAIT)
    if name == "finished":
        return Action(ActionKind.FINISHED, text=args.get("content", ""))
    if name == "call_user":
        return Action(ActionKind.CALL_USER)
    raise _ParseError(f"unknown action {name!r}")


_ACTION_LINE = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*", re.M)
_THOUGHT = re.compile(r"^\s*Thought\s*:\s*", re.S)


def invalid(reason: str) -> Action:
    return Action(ActionKind.INVALID, error=reason)


def parse_action(text: str, coords: CoordinateMap | None = None) -> Action:
    """One action call (`click(start_box='(1,2)')`) -> Action in screen pixels. Never raises."""
    try:
        name, args = _scan_call(text)
        return _build(name, args, coords)
    except _ParseError as e:
        return invalid(str(e))
    except (ValueError, OverflowError, ZeroDivisionError) as e:  # e.g. a 400-digit coordinate
        return invalid(f"bad value: {e}")


def parse_response(text: str, coords: CoordinateMap | None = None) -> ParsedResponse:
    """A full response (`Thought: ...\\nAction: ...`) -> its parts. Never raises.

    The action is the first line starting with `Action:`; everything before it, less a leading
    `Thought:`, is the thought. Without coordinates `coords`, points stay in model pixels.
    """
    if not isinstance(text, str):
        return ParsedResponse("", "", invalid(f"response is {type(text).__name__}, not text"))
    m = _ACTION_LINE.search(text)
    if m is None:
        return ParsedResponse(text.strip(), "", invalid("no line starting with 'Action:'"))
    thought = _THOUGHT.sub("", text[: m.start()], count=1).strip()
    action_text = text[m.end() :].strip()
    return ParsedResponse(thought, action_text, parse_action(action_text, coords))


# --------------------------------------------------------------------------- formatting


def _quote(s: str) -> str:
    """Single-quoted the way UI-TARS writes it; `_scan_string` reads it back exactly."""
    out = s.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + out.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r") + "'"


def _box(p: tuple[float, float], coords: CoordinateMap | None, box_tokens: bool) -> str:
    x, y = coords.to_model(*p) if coords is not None else (round(p[0]), round(p[1]))
    inner = f"({x},{y})"
    return _quote(f"{BOX_START}{inner}{BOX_END}" if box_tokens else inner)


def format_action(
    action: Action, coords: CoordinateMap | None = None, box_tokens: bool = True
) -> str:
    """The call text the model would write for `action` (points back in model pixels).

    Used to write demonstrations for supervised warm starts and to test the parser.
    Raises ValueError for an INVALID action, which has no text form.
    """
    k = action.kind

    def pt(p: tuple[float, float] | None, what: str) -> str:
        if p is None:
            raise ValueError(f"{k.value} action needs {what}")
        return _box(p, coords, box_tokens)

    if k in (ActionKind.CLICK, ActionKind.LEFT_DOUBLE, ActionKind.RIGHT_SINGLE):
        return f"{k.value}(start_box={pt(action.point, 'a point')})"
    if k is ActionKind.DRAG:
        return (
            f"drag(start_box={pt(action.point, 'a start point')}, "
            f"end_box={pt(action.end_point, 'an end point')})"
        )
    if k is ActionKind.HOTKEY:
        return f"hotkey(key={_quote(action.text or '')})"
    if k is ActionKind.TYPE:
        return f"type(content={_quote(action.text or '')})"
    if k is ActionKind.SCROLL:
        where = f"start_box={pt(action.point, 'a point')}, " if action.point is not None else ""
        return f"scroll({where}direction={_quote(action.direction or 'down')})"
    if k is ActionKind.WAIT:
        return "wait()"
    if k is ActionKind.FINISHED:
        return f"finished(content={_quote(action.text or '')})"
    if k is ActionKind.CALL_USER:
        return "call_user()"
    raise ValueError(f"an {k.value} action has no text form ({action.error})")


def format_response(
    thought: str, action: Action, coords: CoordinateMap | None = None, box_tokens: bool = True
) -> str:
    """`Thought: ...\\nAction: ...`, the UI-TARS-1.5 response format."""
    return f"Thought: {thought}\nAction: {format_action(action, coords, box_tokens)}"
