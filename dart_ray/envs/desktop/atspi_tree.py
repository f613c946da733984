"""Print the desktop's AT-SPI widget tree as XML in the shape OSWorld's agents and getters read.

Run as a script by Debian's python3 (which has `pyatspi`, python3-pyatspi) in the desktop's
environment (its D-Bus session bus): `python3 atspi_tree.py [max_depth] [max_width]`. It
imports only the standard library and pyatspi, never dart_ray, so that interpreter needs
nothing else. Exit status 3 without pyatspi, so the server can fall back to its window list.

The shape (written from OSWorld's description of its Ubuntu tree, not from its code): one
element per accessible, named by its role with spaces as dashes (`push-button`), with
`name`; each state as `st:<state>="true"`; object attributes as `attr:<name>`; for a visible
and showing component `cp:screencoord="(x, y)"` and `cp:size="(w, h)"`; a value's
`val:value`/`val:min`/`val:max`/`val:step`; each action's `act:<name>_desc` and `_kb`; and the
text, if any, as the element's text. Namespaces are OSWorld's Ubuntu ones (below).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
# Debian's interpreter, which python3-pyatspi (and its gi) belong to
SYSTEM_PYTHON = "/usr/bin/python3"

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
for _prefix, _uri in NS.items():
    ET.register_namespace(_prefix, _uri)


def _q(prefix: str, name: str) -> str:
    return f"{{{NS[prefix]}}}{name}"


def _states(node: Any, pyatspi: Any) -> dict[str, str]:
    out = {}
    for st in node.getState().getStates():
        name = pyatspi.StateType._enum_lookup[st].split("_", 1)[1].lower()
        if name:
            out[_q("st", name)] = "true"
    return out


def _component(node: Any, pyatspi: Any, attrs: dict[str, str]) -> None:
    if attrs.get(_q("st", "visible")) != "true" or attrs.get(_q("st", "showing")) != "true":
        return
    try:
        x, y, w, h = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
    except NotImplementedError:
        return
    attrs[_q("cp", "screencoord")] = str((x, y))
    attrs[_q("cp", "size")] = str((w, h))


def _value_and_actions(node: Any, attrs: dict[str, str]) -> None:
    try:
        v = node.queryValue()
        for key, get in (
            ("value", lambda: v.currentValue),
            ("min", lambda: v.minimumValue),
            ("max", lambda: v.maximumValue),
            ("step", lambda: v.minimumIncrement),
        ):
            attrs[_q("val", key)] = str(get())
    except NotImplementedError:
        pass
    try:
        a = node.queryAction()
        for i in range(a.nActions):
            name = a.getName(i).replace(" ", "-")
            attrs[_q("act", f"{name}_desc")] = a.getDescription(i)
            attrs[_q("act", f"{name}_kb")] = a.getKeyBinding(i)
    except NotImplementedError:
        pass


def _text(node: Any) -> str:
    try:
        t = node.queryText()
        return t.getText(0, t.characterCount).replace("\ufffc", "").replace("\ufffd", "")
    except NotImplementedError:
        return ""


def node_xml(node: Any, pyatspi: Any, depth: int, max_depth: int, max_width: int) -> ET.Element:
    attrs = {"name": node.name or ""} | _states(node, pyatspi)
    for item in node.getAttributes() or []:  # "name:value" strings
        k, _, v = item.partition(":")
        if k:
            attrs[_q("attr", k)] = v
    _component(node, pyatspi, attrs)
    _value_and_actions(node, attrs)
    role = (node.getRoleName().strip() or "unknown").replace(" ", "-")
    el = ET.Element(role, attrs)
    text = _text(node)
    if text:
        el.text = text
    if depth < max_depth:
        for i in range(min(node.childCount, max_width)):
            child = node.getChildAtIndex(i)
            if child is not None:
                el.append(node_xml(child, pyatspi, depth + 1, max_depth, max_width))
    return el


def collect(env: dict[str, str], timeout_s: float = 30.0) -> str | None:
    """The tree, walked by this file run under Debian's python3 in the desktop's environment,
    or None (logged) where there is none: no pyatspi, no bus, a walk that hangs."""
    try:
        r = subprocess.run(
            [SYSTEM_PYTHON, str(Path(__file__).resolve())],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("no AT-SPI tree, answering the window list: %s", e)
        return None
    if r.returncode != 0 or not r.stdout:
        log.warning(
            "no AT-SPI tree (exit %s), answering the window list: %s", r.returncode, r.stderr[-300:]
        )
        return None
    return r.stdout


def main(argv: list[str]) -> int:
    try:
        import pyatspi
    except ImportError:
        print("pyatspi is not installed (Debian: python3-pyatspi)", file=sys.stderr)
        return 3
    max_depth = int(argv[0]) if argv else 50
    max_width = int(argv[1]) if len(argv) > 1 else 1024
    desktop = pyatspi.Registry.getDesktop(0)
    root = node_xml(desktop, pyatspi, 0, max_depth, max_width)
    sys.stdout.write(ET.tostring(root, encoding="unicode"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
