"""UI-TARS hotkeys in MiniWoB++'s key syntax (no browser: the translation alone; the browser
tests in test_miniwob.py press them on a real page)."""

from __future__ import annotations

import pytest

pytest.importorskip("miniwob", reason="needs the browser extra")
from dart_ray.envs.base import InvalidAction
from dart_ray.envs.miniwob.keys import ALLOWED_KEYS, miniwob_key


@pytest.mark.parametrize(
    "keys, key",
    [
        ("enter", "<Enter>"),
        ("esc", "<Escape>"),
        ("Escape", "<Escape>"),
        ("home", "<Home>"),
        ("end", "<End>"),
        ("shift+tab", "S-<Tab>"),
        ("shift tab", "S-<Tab>"),
        ("a", "a"),
        ("A", "A"),
        ("shift a", "A"),  # the capital, as MiniWoB's own list has it
        ("ctrl a", "C-a"),
        ("Control+A", "C-a"),
        ("ctrl shift z", "C-S-z"),
        ("shift ctrl z", "C-S-z"),  # one order of prefixes, whatever the model's
        ("ctrl shift left", "C-S-<ArrowLeft>"),
        ("arrowdown", "<ArrowDown>"),
        ("+", "+"),
        ("!", "!"),
        ("pgdn", "<PageDown>"),
    ],
)
def test_what_miniwob_can_press(keys: str, key: str) -> None:
    assert miniwob_key(keys) == key
    assert key in ALLOWED_KEYS


@pytest.mark.parametrize(
    "keys, why",
    [
        ("ctrl w", "MiniWoB++ does not press 'ctrl w'"),  # would close the page
        ("ctrl l", "MiniWoB++ does not press 'ctrl l'"),
        ("alt f4", "MiniWoB++ does not press 'alt f4'"),
        ("f5", "MiniWoB++ does not press 'f5'"),  # would reload it
        ("hyper", "unknown key 'hyper'"),
        ("ctrl shift", "'ctrl shift' presses no key besides modifiers"),
        ("a b", "'a b' presses more than one key besides modifiers"),
    ],
)
def test_what_it_cannot_press_is_named(keys: str, why: str) -> None:
    with pytest.raises(InvalidAction) as e:
        miniwob_key(keys)
    assert str(e.value).startswith(why)
