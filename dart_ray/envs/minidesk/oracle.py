"""The MiniDesk oracle: a closed-loop expert that reads the scene and returns the next action.

Closed loop (decide from the current state each step) rather than a replayed script, so it also
recovers from states a policy left behind: give it the env mid-episode and it still finishes.
It produces warm-start demonstrations and proves, in tests, that every generated task is
solvable (the oracle scores 1.0 on all of them).

It acts only through UI-TARS actions at pixel positions, exactly what a policy can do; it reads
the scene instead of pixels, which is what makes it an oracle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dart_ray.envs.minidesk.scene import Scene, Widget
from dart_ray.records import Action, ActionKind

if TYPE_CHECKING:
    from dart_ray.envs.minidesk.env import MiniDeskEnv


def _click(p: tuple[float, float]) -> Action:
    return Action(ActionKind.CLICK, point=(float(int(p[0])), float(int(p[1]))))


def _hotkey(keys: str) -> Action:
    return Action(ActionKind.HOTKEY, text=keys)


def _values_ok(s: Scene) -> bool:
    return all(s.widgets[k].value == v for k, v in s.goal.get("values", {}).items())


def oracle_action(env: MiniDeskEnv) -> Action:
    """The next action towards the goal of the env's current task."""
    s = env.scene
    goal = s.goal
    if s.committed is not None:
        return Action(ActionKind.FINISHED, text="done")
    if (a := _overlay_action(s)) is not None:
        return a
    for wid, want in goal.get("values", {}).items():
        w = s.widgets[wid]
        if w.value != want:
            return _fix(s, w, want)
    commit: str = goal["commit"]
    if commit.startswith("menu:"):
        menu = commit.removeprefix("menu:").split("/", 1)[0]
        return _click(s.menu_rects[menu].center)
    return _reach(s, s.widgets[commit]) or _click(s.widgets[commit].rect.center)


def _overlay_action(s: Scene) -> Action | None:
    goal = s.goal
    if s.dialog_of is not None:
        ok, cancel = s.dialog_buttons()
        confirm = s.dialog_of == goal["commit"] and _values_ok(s)
        return _click(ok.center if confirm else cancel.center)
    if s.open_dropdown is not None:
        w = s.widgets[s.open_dropdown]
        want = goal.get("values", {}).get(w.id)
        if want is not None and want != w.selected:
            return _click(s.dropdown_rows(w)[w.options.index(want)].center)
        return _hotkey("escape")
    if s.open_menu is not None:
        menu, _, item = goal["commit"].removeprefix("menu:").partition("/")
        if goal["commit"].startswith("menu:") and menu == s.open_menu and _values_ok(s):
            return _click(s.menu_rows(menu)[s.menus[menu].index(item)].center)
        return _hotkey("escape")
    return None


def _reach(s: Scene, w: Widget) -> Action | None:
    """A click on w's tab when w is on a hidden page."""
    if w.tab is not None and w.tab != s.active_tab:
        return _click(s.tab_rects[w.tab].center)
    return None


def _fix(s: Scene, w: Widget, want: Any) -> Action:
    if (a := _reach(s, w)) is not None:
        return a
    if w.kind == "checkbox":
        return _click(w.rect.center)
    if w.kind == "radio":
        return _click(w.parts[w.options.index(want)].center)
    if w.kind == "dropdown":
        return _click(w.field_box().center)
    if w.kind == "textfield":
        return _edit(s, w, str(want))
    if w.kind == "list":
        items = w.visible_items(s)
        idx = items.index(want) if want in items else -1
        window = range(w.offset, w.offset + w.rows)
        if w.filter is not None and idx not in window:
            return _edit(s, s.widgets[w.filter], str(want))
        if idx < w.offset:
            return Action(ActionKind.SCROLL, point=_int(w.list_box().center), direction="up")
        if idx >= w.offset + w.rows:
            return Action(ActionKind.SCROLL, point=_int(w.list_box().center), direction="down")
        return _click(w.row_rect(idx).center)
    raise ValueError(f"oracle cannot set a {w.kind} widget")


def _edit(s: Scene, w: Widget, want: str) -> Action:
    if s.focus != w.id:
        return _click(w.field_box().center)
    if w.text and not s.select_all:
        return _hotkey("ctrl a")
    return Action(ActionKind.TYPE, text=want)


def _int(p: tuple[float, float]) -> tuple[float, float]:
    return (float(int(p[0])), float(int(p[1])))


def element_at(s: Scene, p: tuple[float, float]) -> str:
    """What a click at `p` lands on, in words ("the 'Save' button"), or "" for nothing.

    Overlays first (a dialog, an open drop-down or menu covers what lies beneath), then the
    menu bar and tabs, then the widgets of the visible page."""
    x, y = p
    if s.dialog_of is not None:
        spec = s.widgets[s.dialog_of].dialog or {}
        ok, cancel = s.dialog_buttons()
        for r, text in ((ok, spec.get("ok", "OK")), (cancel, spec.get("cancel", "Cancel"))):
            if r.contains(x, y):
                return f"the '{text}' button"
        return ""
    if s.open_dropdown is not None:
        w = s.widgets[s.open_dropdown]
        for opt, r in zip(w.options, s.dropdown_rows(w), strict=True):
            if r.contains(x, y):
                return f"the '{opt}' option"
    if s.open_menu is not None:
        for item, r in zip(s.menus[s.open_menu], s.menu_rows(s.open_menu), strict=True):
            if r.contains(x, y):
                return f"the '{item}' menu item"
    for name, r in s.menu_rects.items():
        if r.contains(x, y):
            return f"the '{name}' menu"
    for name, r in s.tab_rects.items():
        if r.contains(x, y):
            return f"the '{name}' tab"
    for w in s.widgets.values():
        if not s.on_page(w):
            continue
        label = w.label.rstrip(":")
        if w.kind == "radio":
            for opt, r in zip(w.options, w.parts, strict=True):
                if r.contains(x, y):
                    return f"the '{opt}' option of {label}"
        elif w.kind == "list":
            items = w.visible_items(s)
            for i in range(w.offset, min(len(items), w.offset + w.rows)):
                if w.row_rect(i).contains(x, y):
                    return f"'{items[i]}' in the {label} list"
            if w.list_box().contains(x, y):
                return f"the {label} list"
        elif w.rect.contains(x, y):
            kind = {"textfield": "field", "dropdown": "drop-down"}.get(w.kind, w.kind)
            return f"the '{label}' {kind}"
    return ""


def thought(s: Scene, a: Action) -> str:
    """The Thought a careful agent writes before `a`: it names the element it acts on, as the
    policy prompt asks, so that the words of the instruction reach the action's coordinates."""
    target = element_at(s, a.point) if a.point is not None else ""
    k = a.kind
    if k == ActionKind.FINISHED:
        return "The task is done."
    if k == ActionKind.TYPE:
        return f"I type '{a.text}'."
    if k == ActionKind.HOTKEY:
        return f"I press {a.text}."
    if k == ActionKind.SCROLL:
        return f"I scroll {target or 'the page'} {a.direction}."
    verb = {ActionKind.LEFT_DOUBLE: "double-click", ActionKind.RIGHT_SINGLE: "right-click"}
    return f"I {verb.get(k, k.value)} {target or 'there'}."
