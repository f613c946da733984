"""Model strings become pyautogui code only as literals: proved on the syntax tree."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dart_ray.envs.pyautogui_code import (
    DONE,
    FAIL,
    PREAMBLE,
    WAIT,
    UnsafeAction,
    hotkey_keys,
    to_code,
)
from dart_ray.records import Action, ActionKind

ALLOWED_CALLS = {
    "click",
    "doubleClick",
    "rightClick",
    "moveTo",
    "dragTo",
    "scroll",
    "hscroll",
    "hotkey",
    "write",
    "press",
}


def _calls(code: str) -> list[ast.Call]:
    tree = ast.parse(code)
    # the program is the fixed preamble, then only expression statements calling pyautogui
    stmts = tree.body
    assert isinstance(stmts[0], ast.Import) and [a.name for a in stmts[0].names] == [
        "pyautogui",
        "time",
    ]
    assert ast.unparse(stmts[1]) == "pyautogui.FAILSAFE = False"
    calls = []
    for s in stmts[2:]:
        if isinstance(s, ast.Pass):  # typing "" is a no-op program
            continue
        assert isinstance(s, ast.Expr) and isinstance(s.value, ast.Call), ast.dump(s)
        f = s.value.func
        assert isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
        assert f.value.id == "pyautogui" and f.attr in ALLOWED_CALLS, ast.unparse(s)
        for arg in [*s.value.args, *(k.value for k in s.value.keywords)]:
            assert isinstance(arg, ast.Constant) or (
                isinstance(arg, ast.UnaryOp) and isinstance(arg.operand, ast.Constant)
            ), ast.unparse(arg)
        calls.append(s.value)
    return calls


def _typed(code: str) -> str:
    """Re-read what a TYPE program types: write() literals, press('enter') as newlines."""
    out = []
    for c in _calls(code):
        assert isinstance(c.func, ast.Attribute)
        if c.func.attr == "write":
            out.append(ast.literal_eval(c.args[0]))
        else:
            assert c.func.attr == "press" and ast.literal_eval(c.args[0]) == "enter"
            out.append("\n")
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_typed_text_is_a_literal_and_round_trips(text: str) -> None:
    code = to_code(Action(ActionKind.TYPE, text=text))
    assert _typed(code) == text


@pytest.mark.parametrize(
    "hostile",
    [
        "'); import os; os.system('rm -rf ~'); ('",
        '"""; __import__("os").system("id"); """',
        "\\'; exec('x')  # \n\n\r\\",
        "\x00\u2028{0}%s${HOME}$(id)`id`",
    ],
)
def test_hostile_strings_stay_strings(hostile: str) -> None:
    assert _typed(to_code(Action(ActionKind.TYPE, text=hostile))) == hostile


def test_points_are_numbers_and_keys_come_from_an_allowlist() -> None:
    code = to_code(Action(ActionKind.CLICK, point=(10.4, 20.6)))
    assert code == PREAMBLE + "pyautogui.click(10, 21)"
    code = to_code(Action(ActionKind.DRAG, point=(1, 2), end_point=(3, 4)))
    assert [ast.unparse(c) for c in _calls(code)] == [
        "pyautogui.moveTo(1, 2)",
        "pyautogui.dragTo(3, 4, duration=0.3, button='left')",
    ]
    code = to_code(Action(ActionKind.SCROLL, point=(5, 6), direction="down"))
    assert ast.unparse(_calls(code)[1]) == "pyautogui.scroll(-5)"
    code = to_code(Action(ActionKind.HOTKEY, text="Control+Shift+T"))
    assert ast.unparse(_calls(code)[0]) == "pyautogui.hotkey('ctrl', 'shift', 't')"
    for bad in ("ctrl'); import os; ('", "ctrl notakey", ""):
        with pytest.raises(UnsafeAction):
            to_code(Action(ActionKind.HOTKEY, text=bad))
    with pytest.raises(UnsafeAction, match="finite"):
        to_code(Action(ActionKind.CLICK, point=(float("nan"), 1.0)))
    with pytest.raises(UnsafeAction, match="needs a point"):
        to_code(Action(ActionKind.RIGHT_SINGLE))
    with pytest.raises(UnsafeAction, match="direction"):
        to_code(Action(ActionKind.SCROLL, point=(1, 1), direction="sideways'); x('"))
    with pytest.raises(UnsafeAction):
        to_code(Action(ActionKind.INVALID, error="unparseable"))


def test_plus_is_a_key_when_it_is_not_a_separator() -> None:
    assert hotkey_keys("+") == ["+"]
    assert hotkey_keys("ctrl +") == ["ctrl", "+"]
    assert hotkey_keys("ctrl+shift+t") == ["ctrl", "shift", "t"]


def test_a_scroll_without_a_point_scrolls_where_the_mouse_is() -> None:
    """UI-TARS may write `scroll(direction='down')`: pyautogui then scrolls at the pointer,
    as OSWorld's agents do; it used to be refused ('scroll needs a point')."""
    code = to_code(Action(ActionKind.SCROLL, direction="down"))
    assert [ast.unparse(c) for c in _calls(code)] == ["pyautogui.scroll(-5)"]
    code = to_code(Action(ActionKind.SCROLL, direction="left"))
    assert [ast.unparse(c) for c in _calls(code)] == ["pyautogui.hscroll(5)"]


def test_control_words() -> None:
    assert to_code(Action(ActionKind.WAIT)) == WAIT
    assert to_code(Action(ActionKind.FINISHED, text="done")) == DONE
    assert to_code(Action(ActionKind.CALL_USER)) == FAIL
