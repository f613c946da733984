"""Hostile model text becomes only the pyautogui call it names: proved by running the code.

The path from a sampled response to a desktop is: `parse_response` (never raises) ->
`to_code` (pyautogui source) -> the OSWorld server's `/execute` -> `python -c <code>`. These
tests feed adversarial responses (quotes, backslashes, newlines, unicode, shell and Python
metacharacters inside `type(content=...)`, enormous and negative coordinates) through the
first two and compare what the code does with what the parsed action means: the code is
parsed with `ast` (the fixed preamble, then only calls on `pyautogui` with literal arguments)
and executed with `exec` in a namespace whose only builtin is an import that hands out a
recorder as `pyautogui`. `test_desktop_execute.py` takes the same responses through our
desktop server and a real `python -c`.

The expected calls are derived from the Action (its kind, point and text), never from the
generated code, so a translation that smuggled anything else in would fail.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dart_ray.envs.pyautogui_code import DONE, FAIL, WAIT, UnsafeAction, hotkey_keys, to_code
from dart_ray.records import Action, ActionKind
from dart_ray.uitars.actions import CoordinateMap, parse_response

SCREEN = (1280, 720)
COORDS = CoordinateMap.for_screen(*SCREEN)

Call = tuple[str, list[Any], dict[str, Any]]

# --------------------------------------------------------------------------- adversarial text

_HOSTILE = [
    "'",
    '"',
    "\\",
    "\\'",
    '\\"',
    "\\\\",
    "\n",
    "\r\n",
    "\t",
    "\x00",
    "\x1b[2J",
    "\u2028",
    "\u202e",
    "é",
    "中文",
    "😀",
    "$(id)",
    "`id`",
    "${HOME}",
    "; rm -rf ~ #",
    "&& curl x | sh",
    "'); import os; os.system('id'); ('",
    '"); __import__("os").system("id"); ("',
    "__import__('os').system('id')",
    '"""',
    "'''",
    "{0}",
    "%s%n",
    "#",
    ")",
    "(",
    ",",
    "=",
    "<|box_start|>",
    "<|box_end|>",
    "Action: ",
    "\nAction: hotkey(key='ctrl alt t')",
]
hostile_text = st.lists(st.one_of(st.sampled_from(_HOSTILE), st.text(max_size=4)), max_size=10).map(
    "".join
)

_NUMBERS = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.integers(0, 2000).map(str),
    st.integers(0, 2000).map(str),
    st.sampled_from(["-0", "0.5", "-1.5", "9" * 40, "9" * 320, "1" * 400, "1e9", "nan", "-inf"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def _often(draw: st.DrawFn) -> bool:
    """True three times in four: most generated text follows the grammar, some does not."""
    return draw(st.integers(0, 3)) > 0


@st.composite
def _box(draw: st.DrawFn) -> str:
    n = 2 if _often(draw) else draw(st.sampled_from([1, 3, 4]))
    inner = ",".join(draw(_NUMBERS) for _ in range(n))
    shape = "({})" if _often(draw) else draw(st.sampled_from(["[{}]", "{}", "({}", " ( {} ) "]))
    inner = shape.format(inner)
    if draw(st.booleans()):
        inner = f"<|box_start|>{inner}<|box_end|>"
    return inner


def _quote(s: str, q: str) -> str:
    return q + s.replace("\\", "\\\\").replace(q, "\\" + q).replace("\n", "\\n") + q


@st.composite
def model_responses(draw: st.DrawFn) -> str:
    """What a policy at temperature 1 might write: mostly the grammar, bent every which way."""
    q = draw(st.sampled_from(["'", '"']))

    def lit(s: str) -> str:  # quoted properly, or pasted raw between quotes (often broken)
        return _quote(s, q) if _often(draw) else q + s + q

    name = draw(
        st.sampled_from(
            [
                "click",
                "left_single",
                "left_double",
                "right_single",
                "drag",
                "hotkey",
                "type",
                "type",
                "type",
                "scroll",
                "wait",
                "finished",
                "call_user",
                "eval",
                "__import__",
            ]
        )
    )
    box_key = draw(st.sampled_from(["start_box", "point", "start_point"]))
    if name in ("click", "left_single", "left_double", "right_single"):
        args = f"{box_key}={lit(draw(_box()))}"
    elif name == "drag":
        args = f"start_box={lit(draw(_box()))}, end_box={lit(draw(_box()))}"
    elif name == "hotkey":
        keys = draw(
            st.lists(
                st.one_of(
                    st.sampled_from(["ctrl", "Control", "shift", "alt", "enter", "t", "F5"]),
                    hostile_text,
                ),
                min_size=1,
                max_size=3,
            )
        )
        args = f"key={lit(draw(st.sampled_from([' ', '+'])).join(keys))}"
    elif name in ("type", "finished"):
        args = f"content={lit(draw(hostile_text))}"
    elif name == "scroll":
        direction = draw(st.one_of(st.sampled_from(["up", "down", "left", "right"]), hostile_text))
        where = f"{box_key}={lit(draw(_box()))}, " if _often(draw) else ""  # optional
        args = f"{where}direction={lit(direction)}"
    else:
        args = draw(hostile_text)
    tail = ")" if _often(draw) else draw(st.sampled_from(["", "))", ") x", "\n\nAction: wait()"]))
    thought = draw(hostile_text if not _often(draw) else st.text(max_size=30))
    return f"Thought: {thought}\nAction: {name}({args}{tail}"


# --------------------------------------------------------------------------- the oracle


def _xy(p: tuple[float, float] | None) -> list[int]:
    assert p is not None
    x, y = round(p[0]), round(p[1])
    # the coordinate map clamps whatever the model wrote onto the screen
    assert 0 <= x <= SCREEN[0] - 1 and 0 <= y <= SCREEN[1] - 1, (x, y)
    return [x, y]


def expected_calls(a: Action) -> list[Call]:
    """What running `a` on a desktop means, in pyautogui calls, from the action alone."""
    k = a.kind
    single = {
        ActionKind.CLICK: "click",
        ActionKind.LEFT_DOUBLE: "doubleClick",
        ActionKind.RIGHT_SINGLE: "rightClick",
    }
    if k in single:
        return [(single[k], _xy(a.point), {})]
    if k is ActionKind.DRAG:
        return [
            ("moveTo", _xy(a.point), {}),
            ("dragTo", _xy(a.end_point), {"duration": 0.3, "button": "left"}),
        ]
    if k is ActionKind.SCROLL:
        d = a.direction or "down"
        amount = 5 if d in ("up", "left") else -5
        wheel: Call = ("scroll" if d in ("up", "down") else "hscroll", [amount], {})
        # without a point, where the mouse is (pyautogui's own rule)
        return [wheel] if a.point is None else [("moveTo", _xy(a.point), {}), wheel]
    if k is ActionKind.HOTKEY:
        return [("hotkey", hotkey_keys(a.text or ""), {})]
    if k is ActionKind.TYPE:
        calls: list[Call] = []
        for i, line in enumerate((a.text or "").split("\n")):
            if i:
                calls.append(("press", ["enter"], {}))
            if line:
                calls.append(("write", [line], {"interval": 0.005}))
        return calls
    raise AssertionError(f"{k} runs no code")


def typed(calls: list[Call]) -> str:
    """The text a sequence of write/press('enter') calls types."""
    out = []
    for name, args, _ in calls:
        out.append(args[0] if name == "write" else "\n")
    return "".join(out)


# --------------------------------------------------------------------------- in process


class Recorder:
    """Stands in for the pyautogui module: every call and every attribute set is recorded."""

    def __init__(self) -> None:
        object.__setattr__(self, "calls", [])
        object.__setattr__(self, "attrs", {})

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, list(args), kwargs))

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        self.attrs[name] = value


def run_recorded(code: str) -> Recorder:
    """exec `code` where the only builtin is an import of pyautogui (a Recorder) and time."""
    rec = Recorder()

    def only_these(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pyautogui":
            return rec
        if name == "time":
            return object()
        raise ImportError(f"the program imported {name!r}")

    exec(code, {"__builtins__": {"__import__": only_these}})  # the point of the test
    return rec


def literal_calls(code: str) -> list[Call]:
    """The calls of a generated program, read from its syntax tree; fails on anything else."""
    body = ast.parse(code).body
    assert ast.unparse(body[0]) == "import pyautogui, time"
    assert ast.unparse(body[1]) == "pyautogui.FAILSAFE = False"
    calls: list[Call] = []
    for stmt in body[2:]:
        if isinstance(stmt, ast.Pass):
            continue
        assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call), ast.dump(stmt)
        f = stmt.value.func
        assert isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
        assert f.value.id == "pyautogui", ast.unparse(stmt)
        args = [ast.literal_eval(a) for a in stmt.value.args]  # literals only, or this raises
        kwargs = {k.arg: ast.literal_eval(k.value) for k in stmt.value.keywords}
        assert None not in kwargs, "no **kwargs"
        calls.append((f.attr, args, kwargs))  # type: ignore[arg-type]
    return calls


def _check_in_process(action: Action) -> None:
    try:
        code = to_code(action)
    except UnsafeAction:  # unparseable, a key not on the allowlist, a made-up direction
        assert action.kind in (ActionKind.INVALID, ActionKind.HOTKEY) or (
            action.kind is ActionKind.SCROLL
            and action.direction not in ("up", "down", "left", "right")
        ), action
        return
    if code in (WAIT, DONE, FAIL):
        assert action.kind in (ActionKind.WAIT, ActionKind.FINISHED, ActionKind.CALL_USER)
        return
    want = expected_calls(action)
    assert literal_calls(code) == want
    rec = run_recorded(code)
    assert rec.calls == want
    assert rec.attrs == {"FAILSAFE": False}
    if action.kind is ActionKind.TYPE:
        assert typed(rec.calls) == action.text  # byte for byte


@settings(max_examples=400, deadline=None)
@given(model_responses())
def test_adversarial_responses_run_only_the_intended_call(text: str) -> None:
    parsed = parse_response(text, COORDS)  # never raises
    assert parsed.action.kind is not ActionKind.INVALID or parsed.action.error
    _check_in_process(parsed.action)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_typed_text_is_typed_exactly(text: str) -> None:
    _check_in_process(Action(ActionKind.TYPE, text=text))


@pytest.mark.parametrize(
    "response, calls",
    [
        # off-screen, negative and enormous coordinates land on the screen's edge; the
        # model sees 1280x720 resized to 1288x728, so y=3 maps to 3 * 720 / 728 = 2.97 -> 3
        ("Action: click(start_box='(-50,-7)')", [("click", [0, 0], {})]),
        ("Action: click(start_box='(" + "9" * 300 + ",3)')", [("click", [1279, 3], {})]),
        (
            "Action: drag(start_box='(1,1)', end_box='(99999999,-99999999)')",
            [
                ("moveTo", [1, 1], {}),
                ("dragTo", [1279, 0], {"duration": 0.3, "button": "left"}),
            ],
        ),
        (
            "Action: type(content='a\\'); import os; os.system(\\'id\\')  # \\\\\\nb')",
            [
                ("write", ["a'); import os; os.system('id')  # \\"], {"interval": 0.005}),
                ("press", ["enter"], {}),
                ("write", ["b"], {"interval": 0.005}),
            ],
        ),
        (
            'Action: type(content="$(rm -rf ~)`id`")',
            [("write", ["$(rm -rf ~)`id`"], {"interval": 0.005})],
        ),
    ],
)
def test_hand_picked_responses(response: str, calls: list[Call]) -> None:
    action = parse_response(response, COORDS).action
    code = to_code(action)
    assert literal_calls(code) == calls == run_recorded(code).calls


def test_the_sandbox_itself_refuses_other_names() -> None:
    """The recorder's namespace would catch a program that reached for anything else."""
    with pytest.raises(ImportError, match="'os'"):
        run_recorded("import os")
    with pytest.raises(NameError):
        run_recorded("open('/etc/passwd')")
