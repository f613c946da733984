"""MiniDesk's world: one application window of widgets, their layout, state and input rules.

A task's `config` holds a *scene spec* (plain JSON: window title, optional menus and tabs, a
list of widgets, the goal). `Scene.from_spec` validates it and builds mutable widgets; `layout`
places them for a screen size; the `click`/`type_text`/`key`/`scroll` methods apply UI-TARS
actions the way a desktop toolkit would: a modal dialog swallows clicks outside it, an open
dropdown or menu takes the next click, typing goes to the focused field.

An episode ends on a *commit*: a button marked `commit`, a menu item, or the confirm button of
a dialog. The evaluator compares the commit and the widget values with the goal, so a random
policy, which mostly commits the wrong thing or nothing, scores near zero.

Everything here is pure Python and deterministic: the same spec, screen and placement give the
same pixels and the same outcome, which keeps task files reproducible and steps cheap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from dart_ray.envs.base import EnvInputError

CHAR_W, CHAR_H = 6, 11  # Pillow's built-in bitmap font
TITLE_H, MENUBAR_H, TABS_H, ROW_H, LIST_ROW_H = 16, 14, 16, 18, 12
PAD = 6
SCROLL_ROWS = 3
MAX_TEXT = 40


@dataclass
class Rect:
    x: int
    y: int
    w: int
    h: int

    def contains(self, px: float, py: float) -> bool:
        return self.x <= px < self.x + self.w and self.y <= py < self.y + self.h

    @property
    def center(self) -> tuple[float, float]:
        return (self.x + self.w / 2, self.y + self.h / 2)

    def overlaps(self, o: Rect, margin: int = 0) -> bool:
        return not (
            self.x + self.w + margin <= o.x
            or o.x + o.w + margin <= self.x
            or self.y + self.h + margin <= o.y
            or o.y + o.h + margin <= self.y
        )


def text_w(s: str) -> int:
    return CHAR_W * len(s)


def _scatter_one(w: Widget, area: Rect, placed: list[Rect], rng: random.Random) -> Rect | None:
    ww, hh = w.size()
    if ww > area.w or hh > area.h:
        return None
    for _ in range(200):
        r = Rect(
            rng.randint(area.x, area.x + area.w - ww),
            rng.randint(area.y, area.y + area.h - hh),
            ww,
            hh,
        )
        if not any(r.overlaps(p, margin=4) for p in placed):
            return r
    return None


GRID = 28
"""The `grid` placement's cell: Qwen2.5-VL's merged patch (2 x 14 px) on an unscaled screen."""


def _grid_one(
    w: Widget, area: Rect, placed: list[Rect], rng: random.Random, jitter: int = 0
) -> Rect | None:
    """w centred on the centre of a seeded free grid cell, or None when no cell fits it.

    `jitter` > 0 moves it off the centre by a seeded offset of up to `jitter` px across and
    `jitter // 2` down (kept inside `area`), so positions differ by the pixel, not only by
    the cell; a widget wider than 2 x `jitter` and taller than `jitter` still covers its
    cell's centre."""
    ww, hh = w.size()
    cells = [
        (cx - ww // 2, cy - hh // 2)
        for cx in range(GRID // 2, area.x + area.w, GRID)
        for cy in range(GRID // 2, area.y + area.h, GRID)
        if area.x <= cx - ww // 2 and cx - ww // 2 + ww <= area.x + area.w
        if area.y <= cy - hh // 2 and cy - hh // 2 + hh <= area.y + area.h
    ]
    rng.shuffle(cells)
    for x, y in cells:
        if jitter:
            x = min(max(x + rng.randint(-jitter, jitter), area.x), area.x + area.w - ww)
            y = min(max(y + rng.randint(-(jitter // 2), jitter // 2), area.y), area.y + area.h - hh)
        r = Rect(x, y, ww, hh)
        if not any(r.overlaps(p, margin=4) for p in placed):
            return r
    return None


@dataclass
class Widget:
    """One widget: spec fields, current value, and its rectangles after layout."""

    id: str
    kind: str
    label: str
    tab: str | None = None
    options: list[str] = field(default_factory=list)  # radio, dropdown
    items: list[str] = field(default_factory=list)  # list
    rows: int = 5  # list
    filter: str | None = None  # list: id of the text field that filters it
    box: int = 110  # textfield, dropdown: width of the input box
    commit: bool = False  # button
    dialog: dict[str, str] | None = None  # button: {"text", "ok", "cancel"}
    checked: bool = False
    selected: str | None = None
    text: str = ""
    offset: int = 0  # list scroll offset, in rows
    rect: Rect = field(default_factory=lambda: Rect(0, 0, 0, 0))
    parts: list[Rect] = field(default_factory=list)  # radio option boxes

    @property
    def value(self) -> Any:
        if self.kind == "checkbox":
            return self.checked
        if self.kind == "textfield":
            return self.text
        if self.kind in ("radio", "dropdown", "list"):
            return self.selected
        return None

    def size(self) -> tuple[int, int]:
        """Width and height this widget needs."""
        lbl = text_w(self.label)
        if self.kind == "button":
            return lbl + 14, ROW_H
        if self.kind == "checkbox":
            return lbl + 16, 14
        if self.kind == "radio":
            return lbl + 6 + sum(text_w(o) + 18 for o in self.options), 14
        if self.kind in ("textfield", "dropdown"):
            return lbl + 6 + self.box, ROW_H
        if self.kind == "list":
            return max(lbl, 120), CHAR_H + 2 + self.rows * LIST_ROW_H + 2
        raise EnvInputError(f"widget {self.id!r}: unknown kind {self.kind!r}")

    # ---- list helpers
    def visible_items(self, scene: Scene) -> list[str]:
        if self.filter is None:
            return self.items
        q = scene.widgets[self.filter].text.strip().lower()
        return [i for i in self.items if q in i.lower()]

    def list_box(self) -> Rect:
        r = self.rect
        return Rect(r.x, r.y + CHAR_H + 2, r.w, self.rows * LIST_ROW_H + 2)

    def row_rect(self, visible_idx: int) -> Rect:
        b = self.list_box()
        return Rect(
            b.x + 1, b.y + 1 + (visible_idx - self.offset) * LIST_ROW_H, b.w - 2, LIST_ROW_H
        )

    def field_box(self) -> Rect:
        """The input box of a text field or dropdown (right of the label)."""
        r = self.rect
        lbl = text_w(self.label) + 6
        return Rect(r.x + lbl, r.y, r.w - lbl, r.h)

    def clamp_offset(self, scene: Scene) -> None:
        n = len(self.visible_items(scene))
        self.offset = max(0, min(self.offset, n - self.rows))


_KINDS = {"button", "checkbox", "radio", "textfield", "dropdown", "list"}
_VALUE_KINDS = {"checkbox", "radio", "textfield", "dropdown", "list"}


@dataclass
class Scene:
    """The window, its widgets, overlays and what has been committed."""

    title: str
    widgets: dict[str, Widget]
    goal: dict[str, Any]
    menus: dict[str, list[str]] = field(default_factory=dict)
    tabs: list[str] = field(default_factory=list)
    active_tab: str | None = None
    focus: str | None = None
    select_all: bool = False
    open_dropdown: str | None = None
    open_menu: str | None = None
    dialog_of: str | None = None  # id of the button whose dialog is showing
    committed: str | None = None
    width: int = 0
    height: int = 0
    menu_rects: dict[str, Rect] = field(default_factory=dict)
    tab_rects: dict[str, Rect] = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Scene:
        """Validate a scene spec and build fresh widgets; errors name the offending part."""
        if not isinstance(spec, dict):
            raise EnvInputError(
                f"MiniDesk task config must be an object, got {type(spec).__name__}"
            )
        raw = spec.get("widgets")
        if not isinstance(raw, list) or not raw:
            raise EnvInputError("MiniDesk task config needs a non-empty 'widgets' list")
        widgets: dict[str, Widget] = {}
        allowed = set(Widget.__dataclass_fields__) - {"rect", "parts", "offset"}
        for i, w in enumerate(raw):
            if not isinstance(w, dict) or not {"id", "kind", "label"} <= set(w):
                raise EnvInputError(f"widget #{i} needs 'id', 'kind' and 'label'")
            if w["kind"] not in _KINDS:
                raise EnvInputError(f"widget {w['id']!r}: unknown kind {w['kind']!r}")
            extra = set(w) - allowed
            if extra:
                raise EnvInputError(f"widget {w['id']!r}: unknown keys {sorted(extra)}")
            if w["id"] in widgets:
                raise EnvInputError(f"duplicate widget id {w['id']!r}")
            widgets[w["id"]] = Widget(**w)
        tabs = list(spec.get("tabs", []))
        scene = cls(
            title=str(spec.get("title", "MiniDesk")),
            widgets=widgets,
            goal=spec.get("goal", {}),
            menus={str(k): list(v) for k, v in spec.get("menus", {}).items()},
            tabs=tabs,
            active_tab=tabs[0] if tabs else None,
        )
        scene._check()
        return scene

    def _check(self) -> None:
        for w in self.widgets.values():
            if w.tab is not None and w.tab not in self.tabs:
                raise EnvInputError(f"widget {w.id!r}: tab {w.tab!r} is not one of {self.tabs}")
            if w.filter is not None and self.widgets.get(w.filter, Widget("", "", "")).kind != (
                "textfield"
            ):
                raise EnvInputError(f"list {w.id!r}: filter {w.filter!r} is not a text field")
        goal = self.goal
        if not isinstance(goal, dict) or "commit" not in goal:
            raise EnvInputError("MiniDesk task config needs a goal with a 'commit'")
        for wid in goal.get("values", {}):
            if wid not in self.widgets or self.widgets[wid].kind not in _VALUE_KINDS:
                raise EnvInputError(f"goal names {wid!r}, which is not a widget with a value")
        if goal["commit"] not in self.commit_targets():
            raise EnvInputError(f"goal commit {goal['commit']!r} is not something one can commit")

    def commit_targets(self) -> set[str]:
        out = {w.id for w in self.widgets.values() if w.kind == "button" and (w.commit or w.dialog)}
        out |= {f"menu:{m}/{item}" for m, items in self.menus.items() for item in items}
        return out

    # ------------------------------------------------------------------ layout
    def layout(self, width: int, height: int, placement: str, seed: int, jitter: int = 0) -> None:
        """Place every widget for a `width` x `height` screen (`flow`, `scatter` or `grid`;
        `jitter`: the grid's offset off the cell's centre, `_grid_one`)."""
        self.width, self.height = width, height
        top = TITLE_H
        x = PAD
        if self.menus:
            for name in self.menus:
                self.menu_rects[name] = Rect(x, top, text_w(name) + 10, MENUBAR_H)
                x += text_w(name) + 10
            top += MENUBAR_H
        x = PAD
        if self.tabs:
            for name in self.tabs:
                self.tab_rects[name] = Rect(x, top + 2, text_w(name) + 12, TABS_H - 2)
                x += text_w(name) + 14
            top += TABS_H
        area = Rect(PAD, top + PAD, width - 2 * PAD, height - top - 2 * PAD)
        groups: dict[str | None, list[Widget]] = {}
        for w in self.widgets.values():
            groups.setdefault(w.tab, []).append(w)
        # global widgets (no tab) are placed first; each tab's page then avoids them
        global_rects = self._place(groups.pop(None, []), area, placement, seed, [], jitter)
        for i, ws in enumerate(groups.values()):
            self._place(ws, area, placement, seed + 7919 * (i + 1), global_rects, jitter)

    def _place(
        self,
        ws: list[Widget],
        area: Rect,
        placement: str,
        seed: int,
        taken: list[Rect],
        jitter: int = 0,
    ) -> list[Rect]:
        if placement in ("scatter", "grid"):
            rng = random.Random(seed)
            placed = list(taken)
            for w in ws:
                if placement == "scatter":
                    r = _scatter_one(w, area, placed, rng)
                else:
                    r = _grid_one(w, area, placed, rng, jitter)
                if r is None:  # too crowded to scatter: fall back to flow, deterministically
                    return self._flow(ws, area, taken)
                self._set_rect(w, r)
                placed.append(r)
            return placed
        if placement != "flow":
            raise EnvInputError(f"unknown placement {placement!r}: use 'flow', 'scatter' or 'grid'")
        return self._flow(ws, area, taken)

    def _flow(self, ws: list[Widget], area: Rect, taken: list[Rect]) -> list[Rect]:
        """Rows top to bottom; buttons share rows at the bottom. Raises if it cannot fit."""
        bottom = min([r.y - 4 for r in taken] + [area.y + area.h])
        rows: list[list[Widget]] = []
        x = area.w
        for b in (w for w in ws if w.kind == "button"):
            bw = b.size()[0]
            if x + bw > area.w:
                rows.append([])
                x = 0
            rows[-1].append(b)
            x += bw + 6
        placed = list(taken)
        y_buttons = bottom - len(rows) * (ROW_H + 4) + 4
        for i, row in enumerate(rows):
            x = area.x
            for b in row:
                r = Rect(x, y_buttons + i * (ROW_H + 4), *b.size())
                self._set_rect(b, r)
                placed.append(r)
                x += r.w + 6
        y = area.y
        for w in (w for w in ws if w.kind != "button"):
            ww, hh = w.size()
            r = Rect(area.x, y, min(ww, area.w), hh)
            self._set_rect(w, r)
            placed.append(r)
            y += hh + 5
        limit = y_buttons - 4 if rows else bottom
        if y - 5 > limit:
            raise EnvInputError(
                f"scene {self.title!r} does not fit a {self.width}x{self.height} screen "
                f"({y - 5 - limit}px short); use a larger screen or fewer widgets"
            )
        return placed

    def _set_rect(self, w: Widget, r: Rect) -> None:
        w.rect = r
        if w.kind == "radio":
            x = r.x + text_w(w.label) + 6
            w.parts = []
            for o in w.options:
                w.parts.append(Rect(x, r.y, text_w(o) + 14, r.h))
                x += text_w(o) + 18

    # ------------------------------------------------------------------ queries
    def on_page(self, w: Widget) -> bool:
        return w.tab is None or w.tab == self.active_tab

    def dialog_rect(self) -> Rect:
        w, h = min(220, self.width - 20), 70
        return Rect((self.width - w) // 2, (self.height - h) // 2, w, h)

    def dialog_buttons(self) -> tuple[Rect, Rect]:
        d = self.dialog_rect()
        y = d.y + d.h - ROW_H - 6
        return Rect(d.x + d.w - 124, y, 56, ROW_H), Rect(d.x + d.w - 62, y, 56, ROW_H)

    def dropdown_rows(self, w: Widget) -> list[Rect]:
        b = w.field_box()
        n = len(w.options)
        y0 = b.y + b.h if b.y + b.h + n * LIST_ROW_H <= self.height else b.y - n * LIST_ROW_H
        return [Rect(b.x, y0 + i * LIST_ROW_H, b.w, LIST_ROW_H) for i in range(n)]

    def menu_rows(self, name: str) -> list[Rect]:
        m = self.menu_rects[name]
        items = self.menus[name]
        wd = max(text_w(i) for i in items) + 16
        return [Rect(m.x, m.y + m.h + i * LIST_ROW_H, wd, LIST_ROW_H) for i in range(len(items))]

    def success(self) -> bool:
        if self.committed != self.goal["commit"]:
            return False
        return all(self.widgets[k].value == v for k, v in self.goal.get("values", {}).items())
