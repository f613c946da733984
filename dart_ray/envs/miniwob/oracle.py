"""The MiniWoB++ oracle: a closed-loop expert for the short tasks of the MiniWoB++ rung.

Each step it reads the live page from the observation the env just returned: its
`accessibility` JSON is the DOM MiniWoB reports (tag, text, id, value, focus, and position in
screenshot pixels) together with the task's `fields` (the target the utterance names). From
that it returns the next UI-TARS action and a Thought naming the element, as the MiniDesk
oracle does. Closed loop, so it continues from a half-done page (a radio already chosen, the
text already typed) instead of replaying a script.

It acts only through the env's UI-TARS actions (clicks at pixel points of the screenshot,
`type`, a hotkey), exactly what a policy can do; reading the DOM instead of pixels is what
makes it an oracle. Clicks aim at the element's centre, rounded down to whole pixels.

Each supported task needs one to three actions and shows its elements at their native size
in the 160x210 task area (the tiny model sees it at 168x224, docs/LEARNING.md, rung 4).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dart_ray.records import Action, ActionKind, Observation

Element = dict[str, Any]


@dataclass(frozen=True)
class Page:
    """What the oracle reads: the task's fields and the page's elements."""

    fields: dict[str, str]
    elements: list[Element]

    @classmethod
    def of(cls, obs: Observation) -> Page:
        if not obs.accessibility:
            raise ValueError("the observation carries no MiniWoB++ DOM (accessibility is empty)")
        d = json.loads(obs.accessibility)
        return cls(dict(d["fields"]), list(d["elements"]))

    def find(self, what: str, pred: Callable[[Element], bool]) -> Element:
        for e in self.elements:
            if pred(e):
                return e
        raise ValueError(f"the MiniWoB++ oracle finds no {what} on the page")

    def target(self) -> str:
        if "target" not in self.fields:
            raise ValueError(f"the page names no target (fields: {self.fields})")
        return self.fields["target"]


Step = tuple[Action, str]
"""An action and its Thought."""


def click(e: Element, what: str) -> Step:
    x, y = e["left"] + e["width"] / 2, e["top"] + e["height"] / 2
    return Action(ActionKind.CLICK, point=(float(int(x)), float(int(y)))), f"I click {what}."


def _inside(e: Element, x: float, y: float) -> bool:
    return e["left"] <= x < e["left"] + e["width"] and e["top"] <= y < e["top"] + e["height"]


def uncovered_centre(e: Element, others: list[Element]) -> Element:
    """`e` shrunk to a point of it that none of `others` covers: the uncovered point nearest
    the middle of the uncovered part (click-test-2 can place TWO over most of ONE)."""
    pts = [
        (e["left"] + i + 0.5, e["top"] + j + 0.5)
        for i in range(int(e["width"]))
        for j in range(int(e["height"]))
    ]
    free = [(x, y) for x, y in pts if not any(_inside(o, x, y) for o in others)]
    if not free or len(free) == len(pts):
        return e
    mx, my = sum(x for x, _ in free) / len(free), sum(y for _, y in free) / len(free)
    x, y = min(free, key=lambda p: (p[0] - mx) ** 2 + (p[1] - my) ** 2)
    return {"left": x, "top": y, "width": 0.0, "height": 0.0}


def _button(p: Page, text: str) -> Step:
    e = p.find(f"'{text}' button", lambda e: e["tag"] == "button" and e["text"] == text)
    # a button later in the page is drawn over an earlier one
    later = [o for o in p.elements[p.elements.index(e) + 1 :] if o["tag"] == "button"]
    return click(uncovered_centre(e, later), f"the '{text}' button")


def click_test(p: Page) -> Step:
    return click(p.find("button", lambda e: e["tag"] == "button"), "the button")


def click_by_text(p: Page) -> Step:
    """click-test-2 and click-button: the button whose label the utterance names."""
    return _button(p, p.target())


def click_tab(p: Page) -> Step:
    name = f"Tab #{p.target()}"
    tab = p.find(f"tab {name!r}", lambda e: e["tag"] == "a" and e["text"] == name)
    return click(tab, f"the '{name}' tab")


def focus_text(p: Page) -> Step:
    return click(p.find("text box", lambda e: e["tag"] == "input_text"), "the text box")


ORDINALS = {"1": "1st", "2": "2nd", "3": "3rd"}


def focus_text_2(p: Page) -> Step:
    n = p.target()
    box = p.find(f"text box {n}", lambda e: e["tag"] == "input_text" and e["id"] == f"tt{n}")
    return click(box, f"the {ORDINALS.get(n, n + 'th')} text box")


def click_dialog(p: Page) -> Step:
    x = p.find(
        "dialog close button",
        lambda e: e["tag"] == "button" and "ui-dialog-titlebar-close" in e["classes"],
    )
    return click(x, "the 'x' of the dialog")


def click_button_sequence(p: Page) -> Step:
    # a clicked button keeps the focus: ONE focused means ONE is done
    one = p.find("'ONE' button", lambda e: e["tag"] == "button" and e["text"] == "ONE")
    return _button(p, "TWO" if one["focused"] else "ONE")


def click_option(p: Page) -> Step:
    want = p.target()
    label = p.find(f"option {want!r}", lambda e: e["tag"] == "t" and e["text"] == want)
    radio = p.find(
        f"radio button of {want!r}",
        lambda e: e["tag"] == "input_radio" and e["parent"] == label["parent"],
    )
    if radio["value"] != "True":  # MiniWoB reports a checked radio's value as 'True'
        return click(radio, f"the '{want}' option")
    return _button(p, "Submit")


def enter_text(p: Page) -> Step:
    want = p.target()
    field = p.find("text field", lambda e: e["tag"] == "input_text")
    if field["value"] == want:
        return _button(p, "Submit")
    if not field["focused"]:
        return click(field, "the text field")
    if field["value"]:  # a wrong word: select it, and the typing replaces it
        return Action(ActionKind.HOTKEY, text="ctrl a"), "I select the text in the field."
    return Action(ActionKind.TYPE, text=want), f"I type '{want}'."


SOLVERS: dict[str, Callable[[Page], Step]] = {
    "click-test": click_test,
    "click-test-2": click_by_text,
    "click-button": click_by_text,
    "click-tab": click_tab,
    "focus-text": focus_text,
    "focus-text-2": focus_text_2,
    "click-dialog": click_dialog,
    "click-button-sequence": click_button_sequence,
    "click-option": click_option,
    "enter-text": enter_text,
}
TASKS = tuple(SOLVERS)
"""The MiniWoB++ tasks the oracle solves: the rung's tasks."""


class MiniWobOracle:
    """The next action on one task's page. It remembers its own last action only for
    `enter-text`: after `ctrl a` the field still shows the wrong word, and the next step
    types over the selection."""

    def __init__(self, subdomain: str) -> None:
        if subdomain not in SOLVERS:
            raise ValueError(
                f"the MiniWoB++ oracle cannot solve {subdomain!r}; it solves {', '.join(TASKS)}"
            )
        self.subdomain = subdomain
        self._solve = SOLVERS[subdomain]
        self._last: Action | None = None

    def next_step(self, obs: Observation) -> Step:
        """The action towards the goal from the page in `obs`, and its Thought."""
        page = Page.of(obs)
        last = self._last
        if last is not None and last.kind == ActionKind.HOTKEY and self.subdomain == "enter-text":
            want = page.target()
            step: Step = Action(ActionKind.TYPE, text=want), f"I type '{want}'."
        else:
            step = self._solve(page)
        self._last = step[0]
        return step
