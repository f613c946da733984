"""The MiniWoB++ oracle's reading of a page, on hand-made pages (no browser)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dart_ray.envs.miniwob.oracle import MiniWobOracle, uncovered_centre
from dart_ray.records import Action, ActionKind, Observation


def _button(text: str, left: float, top: float, size: float = 40.0) -> dict[str, Any]:
    return {
        "ref": 0, "parent": 3, "tag": "button", "text": text, "value": "", "id": "",
        "classes": "", "left": left, "top": top, "width": size, "height": size, "focused": False,
    }  # fmt: skip


def _page(fields: dict[str, str], *elements: dict[str, Any]) -> Observation:
    dom = json.dumps({"fields": fields, "elements": list(elements)})
    return Observation(b"", 160, 210, "", dom)


def test_an_unsupported_task_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="cannot solve 'book-flight'; it solves click-test"):
        MiniWobOracle("book-flight")


def test_a_button_mostly_under_another_is_clicked_where_it_shows() -> None:
    """click-test-2 seed 6: TWO (10, 133, 40x40) lies over ONE (10, 146, 40x40). ONE shows
    only rows 173-185: pixel centres x 10.5..49.5 (mean 30.0), y 173.5..185.5 (mean 179.5);
    the nearest free point is (29.5, 179.5), whole pixels (29, 179). Its centre (30, 166)
    would press TWO."""
    one, two = _button("ONE", 10, 146), _button("TWO", 10, 133)
    assert uncovered_centre(one, [two]) == {"left": 29.5, "top": 179.5, "width": 0.0, "height": 0.0}
    action, thought = MiniWobOracle("click-test-2").next_step(_page({"target": "ONE"}, one, two))
    assert action == Action(ActionKind.CLICK, point=(29.0, 179.0))
    assert thought == "I click the 'ONE' button."
    # uncovered: the centre, (10 + 20, 146 + 20)
    action, _ = MiniWobOracle("click-test-2").next_step(
        _page({"target": "ONE"}, one, _button("TWO", 100, 50))
    )
    assert action.point == (30.0, 166.0)


def test_a_missing_target_says_what_is_missing() -> None:
    with pytest.raises(ValueError, match="finds no 'THREE' button"):
        MiniWobOracle("click-button").next_step(_page({"target": "THREE"}, _button("ONE", 0, 0)))
    with pytest.raises(ValueError, match="no MiniWoB"):
        MiniWobOracle("click-test").next_step(Observation(b"", 160, 210))
