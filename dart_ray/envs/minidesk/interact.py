"""How MiniDesk answers input: the toolkit rules, separate from layout and drawing.

Each function mutates a `Scene` and returns an `info` dict naming what happened (it ends up in
`StepResult.info`, which makes episodes easy to read and to test). The rules follow common
desktop toolkits, so behaviour learned here transfers in spirit:

- A modal dialog takes every click; clicks outside it do nothing.
- An open dropdown list or menu takes the next click; a click elsewhere just closes it.
- Clicking a text field focuses it; `type` appends to the focused field; `ctrl a` selects all,
  so the next typing or backspace replaces it; Enter presses the window's default (first)
  commit button; Escape closes the open overlay; Tab moves focus to the next text field.
- Scrolling over a list moves it three rows; dragging inside a list scrolls it by the rows
  dragged (the list follows the pointer, as on a touch screen).
"""

from __future__ import annotations

from typing import Any

from dart_ray.envs.minidesk.scene import LIST_ROW_H, MAX_TEXT, SCROLL_ROWS, Scene, Widget

Info = dict[str, Any]


def click(s: Scene, x: float, y: float) -> Info:
    if s.dialog_of is not None:
        return _click_dialog(s, x, y)
    if s.open_dropdown is not None:
        w = s.widgets[s.open_dropdown]
        s.open_dropdown = None
        for opt, r in zip(w.options, s.dropdown_rows(w), strict=True):
            if r.contains(x, y):
                w.selected = opt
                return {"event": "selected", "target": w.id, "value": opt}
        return {"event": "closed", "target": w.id}
    if s.open_menu is not None:
        name = s.open_menu
        s.open_menu = None
        for item, r in zip(s.menus[name], s.menu_rows(name), strict=True):
            if r.contains(x, y):
                s.committed = f"menu:{name}/{item}"
                return {"event": "commit", "target": s.committed}
        # a click on another menu title switches menus, like a real menu bar
        for other, r in s.menu_rects.items():
            if other != name and r.contains(x, y):
                s.open_menu = other
                return {"event": "menu", "target": other}
        return {"event": "closed", "target": f"menu:{name}"}
    for name, r in s.menu_rects.items():
        if r.contains(x, y):
            s.open_menu = name
            return {"event": "menu", "target": name}
    for name, r in s.tab_rects.items():
        if r.contains(x, y):
            s.active_tab = name
            s.focus = None
            return {"event": "tab", "target": name}
    for w in s.widgets.values():
        if s.on_page(w) and w.rect.contains(x, y):
            return _click_widget(s, w, x, y)
    s.focus = None
    return {"event": "nothing"}


def _click_dialog(s: Scene, x: float, y: float) -> Info:
    ok, cancel = s.dialog_buttons()
    owner = s.dialog_of
    assert owner is not None
    if ok.contains(x, y):
        s.dialog_of = None
        s.committed = owner
        return {"event": "commit", "target": owner}
    if cancel.contains(x, y):
        s.dialog_of = None
        return {"event": "dialog_cancel", "target": owner}
    return {"event": "blocked_by_dialog", "target": owner}


def _click_widget(s: Scene, w: Widget, x: float, y: float) -> Info:
    if w.kind != "textfield":
        s.focus = None
    if w.kind == "button":
        if w.dialog is not None:
            s.dialog_of = w.id
            return {"event": "dialog", "target": w.id}
        if w.commit:
            s.committed = w.id
            return {"event": "commit", "target": w.id}
        return {"event": "pressed", "target": w.id}
    if w.kind == "checkbox":
        w.checked = not w.checked
        return {"event": "toggled", "target": w.id, "value": w.checked}
    if w.kind == "radio":
        for opt, r in zip(w.options, w.parts, strict=True):
            if r.contains(x, y):
                w.selected = opt
                return {"event": "selected", "target": w.id, "value": opt}
        return {"event": "nothing", "target": w.id}
    if w.kind == "textfield":
        s.focus = w.id
        s.select_all = False
        return {"event": "focus", "target": w.id}
    if w.kind == "dropdown":
        if w.field_box().contains(x, y):
            s.open_dropdown = w.id
            return {"event": "open", "target": w.id}
        return {"event": "nothing", "target": w.id}
    if w.kind == "list":
        items = w.visible_items(s)
        for i in range(w.offset, min(len(items), w.offset + w.rows)):
            if w.row_rect(i).contains(x, y):
                w.selected = items[i]
                return {"event": "selected", "target": w.id, "value": items[i]}
        return {"event": "nothing", "target": w.id}
    return {"event": "nothing", "target": w.id}


def type_text(s: Scene, text: str) -> Info:
    """Type into the focused field, each newline pressed as Enter (UI-TARS's `type`
    convention: `'ab\\ncd'` types ab, Enter, cd); an Enter that commits ends the typing, as
    it ends the episode."""
    if not text:
        return _type_line(s, text)
    info: Info = {"event": "typed_nowhere"}
    for i, line in enumerate(text.split("\n")):
        if i:
            info = key(s, "enter")
            if s.committed is not None:
                return info
        if line:
            info = _type_line(s, line)
    return info


def _type_line(s: Scene, line: str) -> Info:
    if s.focus is None or s.dialog_of is not None:
        return {"event": "typed_nowhere"}
    w = s.widgets[s.focus]
    if s.select_all:
        w.text = ""
        s.select_all = False
    w.text = (w.text + line)[:MAX_TEXT]
    _refilter(s, w.id)
    return {"event": "typed", "target": w.id, "value": w.text}


def _refilter(s: Scene, field_id: str) -> None:
    for w in s.widgets.values():
        if w.filter == field_id:
            w.offset = 0
            if w.selected not in w.visible_items(s):
                w.selected = None


def key(s: Scene, keys: str) -> Info:
    """A hotkey such as `ctrl a`, `enter`, `escape`, `backspace`, `tab` (space-separated)."""
    combo = tuple(k.lower() for k in keys.replace("+", " ").split())
    if combo in (("escape",), ("esc",)):
        closed = s.open_dropdown or s.open_menu or s.dialog_of
        s.open_dropdown = s.open_menu = s.dialog_of = None
        return {"event": "escape", "target": closed}
    if combo in (("enter",), ("return",)):
        if s.dialog_of is not None:
            owner, s.dialog_of = s.dialog_of, None
            s.committed = owner
            return {"event": "commit", "target": owner}
        for w in s.widgets.values():
            if w.kind == "button" and w.commit and s.on_page(w):
                s.committed = w.id
                return {"event": "commit", "target": w.id}
        return {"event": "nothing"}
    if combo == ("tab",):
        fields = [w.id for w in s.widgets.values() if w.kind == "textfield" and s.on_page(w)]
        if fields:
            i = fields.index(s.focus) + 1 if s.focus in fields else 0
            s.focus = fields[i % len(fields)]
            s.select_all = False
        return {"event": "focus", "target": s.focus}
    if s.focus is None:
        return {"event": "nothing"}
    w = s.widgets[s.focus]
    if combo == ("ctrl", "a"):
        s.select_all = True
        return {"event": "select_all", "target": w.id}
    if combo in (("backspace",), ("delete",)):
        w.text = "" if s.select_all else w.text[:-1]
        s.select_all = False
        _refilter(s, w.id)
        return {"event": "typed", "target": w.id, "value": w.text}
    return {"event": "nothing"}


def scroll(s: Scene, x: float, y: float, direction: str, rows: int = SCROLL_ROWS) -> Info:
    if s.dialog_of is not None or direction not in ("up", "down"):
        return {"event": "nothing"}
    for w in s.widgets.values():
        if w.kind == "list" and s.on_page(w) and w.list_box().contains(x, y):
            w.offset += rows if direction == "down" else -rows
            w.clamp_offset(s)
            return {"event": "scrolled", "target": w.id, "value": w.offset}
    return {"event": "nothing"}


def drag(s: Scene, start: tuple[float, float], end: tuple[float, float]) -> Info:
    rows = round((start[1] - end[1]) / LIST_ROW_H)
    if rows == 0:
        return click(s, *end)
    return scroll(s, *start, "down" if rows > 0 else "up", rows=abs(rows))
