"""MiniDesk's task families: seeded generators of scene specs, goals and instructions.

Each family is a function `(rng, tier) -> (instruction, spec)`. Tier 1 is the easiest (few
distractors, one or two steps); tier 3 adds distractors, more fields and more steps. Every
instruction names its targets in words ("Click the 'Save' button"), never by position, so a
policy must ground words to pixels.

Goals list *every* value-bearing widget a careless policy might change (all checkboxes of a
panel, not just the one to tick), so toggling the wrong thing and committing fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from dart_ray.envs.minidesk.vocab import (
    BUTTONS,
    CHECKS,
    DROPDOWNS,
    FILES,
    FRUITS,
    MENUS,
    NAMES,
    RADIOS,
    ROLES,
    TARGET_LABELS,
)

Spec = dict[str, Any]

FIELD_BOX = 72
"""Input box width of type-field's and dropdown's fields: ten characters, the longest word
typed or option shown, and narrow enough for a field to sit on a 28 px grid cell of a 168 px
screen (a 110 px box would not, and the layout would fall back to one fixed flow)."""
Family = Callable[[random.Random, int], tuple[str, Spec]]


def _buttons(ids_labels: list[tuple[str, str]], commit: bool = True) -> list[Spec]:
    return [{"id": i, "kind": "button", "label": lbl, "commit": commit} for i, lbl in ids_labels]


def _ok_cancel(rng: random.Random) -> tuple[list[Spec], str, str]:
    ok = rng.choice(["OK", "Apply", "Save", "Done"])
    return _buttons([("ok", ok), ("cancel", "Cancel")]), "ok", ok


def click_button(rng: random.Random, tier: int) -> tuple[str, Spec]:
    n = {1: 2, 2: 4, 3: 7}[tier]
    labels = rng.sample(BUTTONS, n)
    target = rng.randrange(n)
    widgets = _buttons([(f"b{i}", lbl) for i, lbl in enumerate(labels)])
    goal = {"commit": f"b{target}", "values": {}}
    return f"Click the '{labels[target]}' button.", {
        "title": "Toolbar",
        "widgets": widgets,
        "goal": goal,
    }


def click_target(rng: random.Random, tier: int) -> tuple[str, Spec]:
    """One button, at every tier: pure grounding (where is it?) with no distractor to tell
    apart, the first rung of docs/LEARNING.md's ladder and the default run's task. Its label
    is one of `TARGET_LABELS` (80), so screens differ by label as well as by position."""
    label = rng.choice(TARGET_LABELS)
    widgets = _buttons([("b0", label)])
    return f"Click the '{label}' button.", {
        "title": "Toolbar",
        "widgets": widgets,
        "goal": {"commit": "b0", "values": {}},
    }


def toggle_checkbox(rng: random.Random, tier: int) -> tuple[str, Spec]:
    n = {1: 2, 2: 4, 3: 6}[tier]
    labels = rng.sample(CHECKS, n)
    state = [rng.random() < 0.5 for _ in range(n)]
    boxes = [
        {"id": f"c{i}", "kind": "checkbox", "label": lbl, "checked": st}
        for i, (lbl, st) in enumerate(zip(labels, state, strict=True))
    ]
    buttons, ok, ok_label = _ok_cancel(rng)
    if tier == 1:
        t = rng.randrange(n)
        want = list(state)
        want[t] = not state[t]
        verb = "Check" if want[t] else "Uncheck"
        instr = f"{verb} '{labels[t]}', then click '{ok_label}'."
    else:
        want = [rng.random() < 0.5 for _ in range(n)]
        if want == state:
            want[0] = not want[0]
        on = [f"'{lbl}'" for lbl, w in zip(labels, want, strict=True) if w]
        instr = (
            f"Make sure that only {', '.join(on)} {'is' if len(on) == 1 else 'are'} checked, "
            f"then click '{ok_label}'."
            if on
            else f"Uncheck every option, then click '{ok_label}'."
        )
    goal = {"commit": ok, "values": {f"c{i}": w for i, w in enumerate(want)}}
    return instr, {"title": "Settings", "widgets": boxes + buttons, "goal": goal}


def select_radio(rng: random.Random, tier: int) -> tuple[str, Spec]:
    groups = rng.sample(sorted(RADIOS), {1: 1, 2: 2, 3: 3}[tier])
    widgets: list[Spec] = []
    values: dict[str, Any] = {}
    parts = []
    for i, g in enumerate(groups):
        opts = RADIOS[g]
        start = rng.choice(opts)
        want = rng.choice([o for o in opts if o != start])
        widgets.append(
            {"id": f"r{i}", "kind": "radio", "label": f"{g}:", "options": opts, "selected": start}
        )
        values[f"r{i}"] = want
        parts.append(f"{g} to '{want}'")
    buttons, ok, ok_label = _ok_cancel(rng)
    instr = f"Set {' and '.join(parts)}, then click '{ok_label}'."
    return instr, {
        "title": "Preferences",
        "widgets": widgets + buttons,
        "goal": {"commit": ok, "values": values},
    }


def type_field(rng: random.Random, tier: int) -> tuple[str, Spec]:
    fields = rng.sample(
        ["Name", "City", "Title", "Tag", "Author", "Label"], {1: 1, 2: 2, 3: 2}[tier]
    )
    widgets: list[Spec] = []
    values: dict[str, Any] = {}
    parts = []
    for i, f in enumerate(fields):
        want = rng.choice(NAMES + FRUITS).lower() if f != "Name" else rng.choice(NAMES)
        pre = rng.choice(FRUITS) if tier == 3 else ""
        widgets.append(
            {"id": f"t{i}", "kind": "textfield", "label": f"{f}:", "text": pre, "box": FIELD_BOX}
        )
        values[f"t{i}"] = want
        parts.append(f"'{want}' as the {f}")
    buttons, ok, ok_label = _ok_cancel(rng)
    verb = "Replace the text and enter" if tier == 3 else "Enter"
    instr = f"{verb} {' and '.join(parts)}, then click '{ok_label}'."
    return instr, {
        "title": "Details",
        "widgets": widgets + buttons,
        "goal": {"commit": ok, "values": values},
    }


def dropdown(rng: random.Random, tier: int) -> tuple[str, Spec]:
    names = rng.sample(sorted(DROPDOWNS), 2 if tier == 3 else 1)
    widgets: list[Spec] = []
    values: dict[str, Any] = {}
    parts = []
    for i, nm in enumerate(names):
        opts = DROPDOWNS[nm] if tier > 1 else DROPDOWNS[nm][:3]
        want = rng.choice(opts)
        widgets.append(
            {
                "id": f"d{i}",
                "kind": "dropdown",
                "label": f"{nm}:",
                "options": opts,
                "box": FIELD_BOX,
            }
        )
        values[f"d{i}"] = want
        parts.append(f"'{want}' as the {nm}")
    buttons, ok, ok_label = _ok_cancel(rng)
    instr = f"Choose {' and '.join(parts)} from the drop-down, then click '{ok_label}'."
    return instr, {
        "title": "Format",
        "widgets": widgets + buttons,
        "goal": {"commit": ok, "values": values},
    }


def menu_command(rng: random.Random, tier: int) -> tuple[str, Spec]:
    names = rng.sample(list(MENUS), {1: 2, 2: 3, 3: 5}[tier])
    menus = {m: MENUS[m] for m in names}
    menu = rng.choice(names)
    item = rng.choice(menus[menu])
    widgets = _buttons([("close", "Close")])
    spec = {
        "title": "Editor",
        "menus": menus,
        "widgets": widgets,
        "goal": {"commit": f"menu:{menu}/{item}", "values": {}},
    }
    return f"Choose '{item}' from the '{menu}' menu.", spec


def switch_tab(rng: random.Random, tier: int) -> tuple[str, Spec]:
    tabs = rng.sample(["General", "Advanced", "Privacy", "Display"], {1: 2, 2: 3, 3: 4}[tier])
    labels = rng.sample(CHECKS, 2 * len(tabs))
    widgets: list[Spec] = []
    values: dict[str, Any] = {}
    for i, lbl in enumerate(labels):
        st = rng.random() < 0.5
        widgets.append(
            {"id": f"c{i}", "kind": "checkbox", "label": lbl, "checked": st, "tab": tabs[i // 2]}
        )
        values[f"c{i}"] = st
    t = rng.randrange(2, len(labels))  # never on the first (open) tab
    values[f"c{t}"] = not values[f"c{t}"]
    buttons, ok, ok_label = _ok_cancel(rng)
    verb = "check" if values[f"c{t}"] else "uncheck"
    instr = f"On the '{tabs[t // 2]}' tab, {verb} '{labels[t]}', then click '{ok_label}'."
    return instr, {
        "title": "Options",
        "tabs": tabs,
        "widgets": widgets + buttons,
        "goal": {"commit": ok, "values": values},
    }


def confirm_dialog(rng: random.Random, tier: int) -> tuple[str, Spec]:
    files = rng.sample(FILES, {1: 3, 2: 5, 3: 9}[tier])
    target = rng.choice(files)
    widgets: list[Spec] = [
        {"id": "files", "kind": "list", "label": "Files", "items": files, "rows": 5},
        {
            "id": "delete",
            "kind": "button",
            "label": "Delete",
            "dialog": {"text": "Delete the selected file?", "ok": "Delete", "cancel": "Keep"},
        },
        {"id": "close", "kind": "button", "label": "Close", "commit": True},
    ]
    instr = f"Delete the file '{target}' and confirm the dialog."
    return instr, {
        "title": "Files",
        "widgets": widgets,
        "goal": {"commit": "delete", "values": {"files": target}},
    }


def scroll_list(rng: random.Random, tier: int) -> tuple[str, Spec]:
    n = {1: 5, 2: 12, 3: 20}[tier]
    items = sorted(rng.sample(FRUITS, n))
    target = rng.choice(items[5:] if tier > 1 else items)  # tiers 2-3 need scrolling
    widgets: list[Spec] = [
        {"id": "items", "kind": "list", "label": "Fruit", "items": items, "rows": 5},
        *_buttons([("open", "Open"), ("cancel", "Cancel")]),
    ]
    instr = f"Select '{target}' in the Fruit list, then click 'Open'."
    return instr, {
        "title": "Pick fruit",
        "widgets": widgets,
        "goal": {"commit": "open", "values": {"items": target}},
    }


def search_select(rng: random.Random, tier: int) -> tuple[str, Spec]:
    n = {1: 10, 2: 25, 3: 40}[tier]
    items = sorted(rng.sample(FRUITS, n))
    target = rng.choice(items)
    widgets: list[Spec] = [
        {"id": "query", "kind": "textfield", "label": "Search:"},
        {
            "id": "results",
            "kind": "list",
            "label": "Results",
            "items": items,
            "rows": 5,
            "filter": "query",
        },
        *_buttons([("open", "Open"), ("cancel", "Cancel")]),
    ]
    instr = f"Search for '{target}', select it in the results and click 'Open'."
    return instr, {
        "title": "Search",
        "widgets": widgets,
        "goal": {"commit": "open", "values": {"results": target}},
    }


def fill_form(rng: random.Random, tier: int) -> tuple[str, Spec]:
    name = rng.choice(NAMES)
    email = f"{name.lower()}@{rng.choice(['example.org', 'mail.test', 'lab.invalid'])}"
    widgets: list[Spec] = [{"id": "name", "kind": "textfield", "label": "Name:"}]
    values: dict[str, Any] = {"name": name}
    parts = [f"Name '{name}'"]
    if tier >= 2:
        role = rng.choice(ROLES)
        widgets += [
            {"id": "email", "kind": "textfield", "label": "Email:"},
            {"id": "role", "kind": "dropdown", "label": "Role:", "options": ROLES},
        ]
        values |= {"email": email, "role": role}
        parts += [f"Email '{email}'", f"Role '{role}'"]
    if tier == 3:
        sub = rng.random() < 0.5
        widgets.append(
            {"id": "news", "kind": "checkbox", "label": "Newsletter", "checked": not sub}
        )
        values["news"] = sub
        parts.append("the newsletter " + ("on" if sub else "off"))
    widgets += _buttons([("submit", "Submit"), ("cancel", "Cancel")])
    instr = f"Fill in the form with {', '.join(parts)}, then click 'Submit'."
    return instr, {
        "title": "Sign up",
        "widgets": widgets,
        "goal": {"commit": "submit", "values": values},
    }


FAMILIES: dict[str, Family] = {
    "click-button": click_button,
    "toggle-checkbox": toggle_checkbox,
    "select-radio": select_radio,
    "type-field": type_field,
    "dropdown": dropdown,
    "menu-command": menu_command,
    "switch-tab": switch_tab,
    "confirm-dialog": confirm_dialog,
    "scroll-list": scroll_list,
    "search-select": search_select,
    "fill-form": fill_form,
    "click-target": click_target,
}
TIERS = (1, 2, 3)
