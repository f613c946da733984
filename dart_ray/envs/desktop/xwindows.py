"""What the X server knows about the desktop's windows, read with python-xlib.

OSWorld's `/accessibility` returns the AT-SPI tree (every widget of every GTK/Qt app). That
needs a D-Bus session bus, the AT-SPI registry and applications built with the bridge; xterm
has none. We return the level every X11 application shares: the window tree the window
manager publishes (`_NET_CLIENT_LIST`), with each window's title, class, owning process,
geometry and which one has focus. It is enough for evaluators that check window titles
(e.g. that the editor shows `notes.txt` saved, without the `*` of unsaved changes) and for a
policy that wants text alongside pixels. The XML is built with ElementTree, so titles chosen by
applications (or by the model, through file names) are escaped, never markup.
"""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from Xlib import X, Xatom, display
from Xlib.error import XError


@dataclass(frozen=True, slots=True)
class Window:
    id: int
    name: str
    wm_class: str
    pid: int
    x: int
    y: int
    width: int
    height: int
    active: bool


class XWindows:
    """A connection to one display, reused across requests (opening one costs ~1 ms)."""

    def __init__(self, display_name: str) -> None:
        self._lock = threading.Lock()  # one X connection, many server threads
        self.d = display.Display(display_name)
        self.root = self.d.screen().root
        self._atoms = {
            n: self.d.intern_atom(n)
            for n in (
                "_NET_CLIENT_LIST",
                "_NET_ACTIVE_WINDOW",
                "_NET_WM_NAME",
                "_NET_WM_PID",
                "_NET_SUPPORTING_WM_CHECK",
                "UTF8_STRING",
            )
        }

    def close(self) -> None:
        self.d.close()

    def _prop(self, win: Any, name: str, kind: int = X.AnyPropertyType) -> Any:
        p = win.get_full_property(self._atoms[name], kind)
        return None if p is None else p.value

    def wm_ready(self) -> bool:
        """True once a window manager has announced itself (EWMH's supporting-WM check
        window on the root): from then on new windows are managed and listed."""
        with self._lock:
            try:
                return bool(self._prop(self.root, "_NET_SUPPORTING_WM_CHECK"))
            except XError:
                return False

    def windows(self) -> list[Window]:
        with self._lock:
            return self._windows()

    def _windows(self) -> list[Window]:
        ids = self._prop(self.root, "_NET_CLIENT_LIST") or []
        active = (self._prop(self.root, "_NET_ACTIVE_WINDOW") or [0])[0]
        out = []
        for wid in ids:
            w = self.d.create_resource_object("window", wid)
            try:
                name = self._prop(w, "_NET_WM_NAME", self._atoms["UTF8_STRING"])
                if name is None:
                    legacy = w.get_full_property(Xatom.WM_NAME, X.AnyPropertyType)
                    name = legacy.value if legacy is not None else b""
                cls = w.get_wm_class() or ("", "")
                pid = (self._prop(w, "_NET_WM_PID") or [0])[0]
                g = w.get_geometry()
                pos = w.translate_coords(self.root, 0, 0)
            except XError:  # the window went away while we looked
                continue
            text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            out.append(
                Window(
                    wid, text, cls[1], int(pid), -pos.x, -pos.y, g.width, g.height, wid == active
                )
            )
        return out

    def set_background(self, image: Any) -> None:
        """Paint `image` (a PIL image, already the screen's size) on the root window: what
        OSWorld's GNOME wallpaper is on a bare X server. The server keeps its own copy, so
        the pixmap is freed at once."""
        with self._lock:
            pixmap = self.root.create_pixmap(image.width, image.height, self.d.screen().root_depth)
            gc = pixmap.create_gc()
            pixmap.put_pil_image(gc, 0, 0, image.convert("RGB"))
            self.root.change_attributes(background_pixmap=pixmap)
            self.root.clear_area(0, 0, 0, 0)
            gc.free()
            pixmap.free()
            self.d.sync()

    def pointer(self) -> tuple[int, int]:
        with self._lock:
            p = self.root.query_pointer()
        return p.root_x, p.root_y

    def tree_xml(self, width: int, height: int) -> str:
        top = ET.Element("desktop-frame", name="Desktop", width=str(width), height=str(height))
        for w in self.windows():
            ET.SubElement(
                top,
                "window",
                name=w.name,
                **{"class": w.wm_class},
                pid=str(w.pid),
                x=str(w.x),
                y=str(w.y),
                width=str(w.width),
                height=str(w.height),
                active=str(w.active).lower(),
                id=hex(w.id),
            )
        return ET.tostring(top, encoding="unicode")


def find(
    windows: list[Window], name: str, strict: bool = False, by_class: bool = False
) -> list[Window]:
    """Windows whose title (or class) equals `name` (strict) or contains it."""

    def key(w: Window) -> str:
        return w.wm_class if by_class else w.name

    if strict:
        return [w for w in windows if key(w) == name]
    return [w for w in windows if name.lower() in key(w).lower()]
