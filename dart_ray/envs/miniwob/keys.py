"""UI-TARS hotkeys in MiniWoB++'s key syntax, and the keys a MiniWoB++ page may be sent.

MiniWoB presses a key given as `C-`/`S-`/`A-`/`M-` prefixes (ctrl, shift, alt, meta) and then a
printable character or a WebDriver name in angle brackets (`C-a`, `S-<Tab>`, `<Escape>`), and
only keys on its gym's `allowed_keys` list. Its default list (Humphreys et al., 2022) lacks
Escape, Home, End and shift+Tab, keys a model uses on web forms; `ALLOWED_KEYS` adds them and
the other editing and navigation keys a page answers, and nothing that would close or leave the
page. `miniwob_key` translates what UI-TARS writes (`'ctrl a'`, `'shift+tab'`, `'esc'`, `'A'`)
and names, as an `InvalidAction`, what cannot be pressed.
"""

from __future__ import annotations

from dart_ray.envs.base import InvalidAction
from dart_ray.uitars.actions import split_keys

try:
    from miniwob.constants import ASCII_CHARSET, DEFAULT_ALLOWED_KEYS
except ImportError as e:  # pragma: no cover - depends on the optional extra
    raise ImportError(
        f"MiniWoB++ needs the `browser` extra: pip install 'dart-ray[browser]' ({e})"
    ) from e

_NAMED_KEYS = {
    "enter": "<Enter>",
    "return": "<Enter>",
    "esc": "<Escape>",
    "escape": "<Escape>",
    "tab": "<Tab>",
    "space": "<Space>",
    "backspace": "<Backspace>",
    "delete": "<Delete>",
    "del": "<Delete>",
    "insert": "<Insert>",
    "home": "<Home>",
    "end": "<End>",
    "pageup": "<PageUp>",
    "pgup": "<PageUp>",
    "pagedown": "<PageDown>",
    "pgdn": "<PageDown>",
    **{
        f"{a}{d}": f"<Arrow{d.title()}>"
        for a in ("", "arrow")
        for d in ("up", "down", "left", "right")
    },
    **{f"f{i}": f"<F{i}>" for i in range(1, 13)},
}
"""UI-TARS/pyautogui key names -> WebDriver's (`miniwob.constants.WEBDRIVER_SPECIAL_KEYS`)."""
_MODIFIERS = {
    "alt": "A-",
    "ctrl": "C-",
    "control": "C-",
    "meta": "M-",
    "cmd": "M-",
    "command": "M-",
    "win": "M-",
    "super": "M-",
    "shift": "S-",
}
_EDITING = ("<Home>", "<End>", "<ArrowLeft>", "<ArrowRight>", "<ArrowUp>", "<ArrowDown>")
ALLOWED_KEYS = tuple(
    dict.fromkeys(
        [
            *DEFAULT_ALLOWED_KEYS,
            "<Escape>",
            "<Home>",
            "<End>",
            "<Insert>",
            *(c for c in ASCII_CHARSET if c != " "),  # every printable key, shifted ones too
            "S-<Tab>",
            "S-<Enter>",
            "S-<PageUp>",
            "S-<PageDown>",
            *(f"S-{k}" for k in _EDITING),  # select
            *(f"C-{k}" for k in _EDITING),  # by word, to the start or end of the text
            *(f"C-S-{k}" for k in _EDITING),
            "C-<Backspace>",
            "C-<Delete>",
            "C-z",
            "C-y",
            "C-S-z",
        ]
    )
)
"""What a hotkey may press in MiniWoB++ (MiniWoB's syntax: `C-`/`S-`/`A-`/`M-` prefixes, in
that alphabetical order here, then a key): its default keys plus the keys a page answers that
the default lacks. Not browser shortcuts (ctrl w/t/l/r, alt F4, F5): they would close or leave
the page, and the episode would be lost to what looks like a crash."""


def miniwob_key(keys: str) -> str:
    """A UI-TARS hotkey (`'ctrl a'`, `'shift+tab'`, `'esc'`, `'A'`) in MiniWoB's key syntax
    (`'C-a'`, `'S-<Tab>'`, `'<Escape>'`, `'A'`); InvalidAction naming what it cannot press."""
    mods: set[str] = set()
    main: list[str] = []
    for raw in split_keys(keys):
        name = raw.lower()
        if name in _MODIFIERS:
            mods.add(_MODIFIERS[name])
        elif name in _NAMED_KEYS:
            main.append(_NAMED_KEYS[name])
        elif len(raw) == 1 and raw in ASCII_CHARSET:
            main.append(raw)
        else:
            raise InvalidAction(f"unknown key {raw!r}")
    if len(main) > 1:
        raise InvalidAction(f"{keys!r} presses more than one key besides modifiers")
    if not main:
        raise InvalidAction(f"{keys!r} presses no key besides modifiers")
    key = main[0]
    if len(key) == 1 and key.isalpha():  # shift+letter is the capital; ctrl+A is ctrl+a
        if mods == {"S-"}:
            key, mods = key.upper(), set()
        elif mods:
            key = key.lower()
    out = "".join(sorted(mods)) + key
    if out not in ALLOWED_KEYS:
        raise InvalidAction(
            f"MiniWoB++ does not press {keys!r} (editing and navigation keys only, "
            "no browser shortcuts)"
        )
    return out
