"""The UI-TARS action grammar: parsing, coordinates, formatting and pyautogui code."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    smart_resize as hf_smart_resize,
)

from dart_ray.records import Action, ActionKind
from dart_ray.uitars.actions import (
    MAX_PIXELS,
    MIN_PIXELS,
    CoordinateMap,
    format_action,
    format_response,
    parse_action,
    parse_response,
    smart_resize,
)


def test_smart_resize_hand_numbers() -> None:
    # 1920x1080 = 2,073,600 px, within [78,400, 12,845,056]: round each side to 28.
    # 1080/28 = 38.57 -> 39*28 = 1092; 1920/28 = 68.57 -> 69*28 = 1932.
    assert smart_resize(1080, 1920) == (1092, 1932)
    # 320x240 = 76,800 px < 78,400: grow by beta = sqrt(78400/76800) = 1.0104, ceil.
    # 240*1.0104/28 = 8.66 -> 9*28 = 252; 320*1.0104/28 = 11.55 -> 12*28 = 336.
    assert smart_resize(240, 320) == (252, 336)
    # 4000x3000: 3000/28 = 107.1 -> 2996, 4000/28 = 142.9 -> 4004; 12.0e6 px <= max: kept.
    assert smart_resize(3000, 4000) == (2996, 4004)
    # 10000x5000 = 5e7 px > 12,845,056: shrink by beta = sqrt(5e7/12845056) = 1.973, floor.
    # 5000/1.973/28 = 90.5 -> 90*28 = 2520; 10000/1.973/28 = 181.0 -> 181*28 = 5068.
    assert smart_resize(5000, 10000) == (2520, 5068)


@settings(max_examples=300, deadline=None)
@given(st.integers(28, 5000), st.integers(28, 5000))
def test_smart_resize_matches_the_image_processor(h: int, w: int) -> None:
    if max(h, w) / min(h, w) > 200:
        return
    ours = smart_resize(h, w, 28, MIN_PIXELS, MAX_PIXELS)
    assert ours == hf_smart_resize(h, w, 28, MIN_PIXELS, MAX_PIXELS)
    assert ours[0] % 28 == 0 and ours[1] % 28 == 0


def test_smart_resize_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="positive"):
        smart_resize(0, 10)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(28, 28 * 201)


def test_coordinates_map_by_the_resize_ratio() -> None:
    # A 1920x1080 screen is seen as 1932x1092 (above): model x 966 -> 966 * 1920/1932 = 960.
    m = CoordinateMap.for_screen(1920, 1080)
    assert (m.model_width, m.model_height) == (1932, 1092)
    x, y = m.to_screen(966, 546)
    assert x == pytest.approx(960.0) and y == pytest.approx(540.0)
    # off-image points are clamped onto the screen
    assert m.to_screen(5000, -3) == (1919.0, 0.0)
    assert m.to_model(960, 540) == (966, 546)


@pytest.mark.parametrize(
    ("text", "kind", "point", "extra"),
    [
        ("click(start_box='<|box_start|>(10,20)<|box_end|>')", ActionKind.CLICK, (10, 20), {}),
        ("click(start_box='(10,20)')", ActionKind.CLICK, (10, 20), {}),
        ("click(start_box='(10,20,30,40)')", ActionKind.CLICK, (20, 30), {}),  # box centre
        ("click(point='[7, 8]')", ActionKind.CLICK, (7, 8), {}),
        ("left_double(start_box='(1,2)')", ActionKind.LEFT_DOUBLE, (1, 2), {}),
        ("right_single(start_box='(3,4)')", ActionKind.RIGHT_SINGLE, (3, 4), {}),
        ("hotkey(key='ctrl c')", ActionKind.HOTKEY, None, {"text": "ctrl c"}),
        ("type(content='hi\\n')", ActionKind.TYPE, None, {"text": "hi\n"}),
        ("type(content='it\\'s')", ActionKind.TYPE, None, {"text": "it's"}),
        (
            "scroll(start_box='(5,6)', direction='up')",
            ActionKind.SCROLL,
            (5, 6),
            {"direction": "up"},
        ),
        ("scroll(direction='Down')", ActionKind.SCROLL, None, {"direction": "down"}),
        ("wait()", ActionKind.WAIT, None, {}),
        ("finished(content='done')", ActionKind.FINISHED, None, {"text": "done"}),
        ("call_user()", ActionKind.CALL_USER, None, {}),
    ],
)
def test_parse_each_action(
    text: str, kind: ActionKind, point: tuple[int, int] | None, extra: dict[str, str]
) -> None:
    a = parse_action(text)
    assert a.kind is kind, a.error
    assert a.point == (None if point is None else (float(point[0]), float(point[1])))
    for k, v in extra.items():
        assert getattr(a, k) == v


def test_drag_has_both_points_mapped_to_the_screen() -> None:
    # model 336x252 for a 320x240 screen: x scales by 320/336, y by 240/252 (both 0.952).
    m = CoordinateMap.for_screen(320, 240)
    a = parse_action("drag(start_box='(168,126)', end_box='(336,0)')", m)
    assert a.kind is ActionKind.DRAG
    assert a.point == pytest.approx((160.0, 120.0))
    assert a.end_point == pytest.approx((319.0, 0.0))  # 320 clamped to the last pixel


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("jump(start_box='(1,2)')", "unknown action 'jump'"),
        ("click(start_box='(1,2)'", "missing ')'"),
        ("click(start_box='(1,2)", "unterminated string"),
        ("click()", "click needs start_box"),
        ("click(start_box='here')", "cannot read coordinates"),
        ("scroll(direction='sideways')", "scroll direction 'sideways'"),
        ("hotkey(key='')", "hotkey has no key"),
        ("click(start_box='(1,2)', start_box='(3,4)')", "given twice"),
        ("", "expected an action name"),
        (f"click(start_box='({'9' * 400},1)')", "out of range"),
    ],
)
def test_invalid_actions_say_why(text: str, reason: str) -> None:
    a = parse_action(text)
    assert a.kind is ActionKind.INVALID
    assert a.error is not None and reason in a.error


def test_parse_response_splits_thought_and_action() -> None:
    text = "Thought: The OK button is at the bottom.\nIt is blue.\nAction: click(start_box='(5,9)')"
    r = parse_response(text)
    assert r.thought == "The OK button is at the bottom.\nIt is blue."
    assert r.action_text == "click(start_box='(5,9)')"
    assert r.action == Action(ActionKind.CLICK, point=(5.0, 9.0))
    missing = parse_response("Thought: hmm, no action")
    assert missing.action.kind is ActionKind.INVALID
    assert missing.action.error == "no line starting with 'Action:'"


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_parsing_never_raises_on_any_text(text: str) -> None:
    for candidate in (text, "Action: " + text, "Action: click(start_box='" + text):
        r = parse_response(candidate, CoordinateMap.for_screen(640, 480))
        assert r.action.kind is not ActionKind.INVALID or r.action.error


_points = st.tuples(st.integers(0, 2000), st.integers(0, 2000)).map(
    lambda p: (float(p[0]), float(p[1]))
)
_actions = st.one_of(
    st.builds(
        Action,
        st.sampled_from([ActionKind.CLICK, ActionKind.LEFT_DOUBLE, ActionKind.RIGHT_SINGLE]),
        point=_points,
    ),
    st.builds(Action, st.just(ActionKind.DRAG), point=_points, end_point=_points),
    st.builds(
        Action, st.just(ActionKind.HOTKEY), text=st.text(min_size=1).filter(lambda s: s.strip())
    ),
    st.builds(Action, st.just(ActionKind.TYPE), text=st.text()),
    st.builds(
        Action,
        st.just(ActionKind.SCROLL),
        point=st.one_of(st.none(), _points),
        direction=st.sampled_from(["up", "down", "left", "right"]),
    ),
    st.builds(Action, st.just(ActionKind.WAIT)),
    st.builds(Action, st.just(ActionKind.FINISHED), text=st.text()),
    st.builds(Action, st.just(ActionKind.CALL_USER)),
)


@settings(max_examples=400, deadline=None)
@given(_actions, st.booleans(), st.text().filter(lambda t: "Action:" not in t))
def test_format_then_parse_round_trips(action: Action, box_tokens: bool, thought: str) -> None:
    if action.kind is ActionKind.HOTKEY:
        action = Action(ActionKind.HOTKEY, text=action.text.strip())  # type: ignore[union-attr]
    parsed = parse_response(format_response(thought, action, box_tokens=box_tokens))
    assert parsed.action == action
    assert parsed.thought == thought.strip()


def test_format_refuses_invalid() -> None:
    with pytest.raises(ValueError, match="no text form"):
        format_action(Action(ActionKind.INVALID, error="x"))
