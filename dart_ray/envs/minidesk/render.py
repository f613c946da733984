"""Drawing a MiniDesk scene with PIL, fast enough for hundreds of steps per second per core.

The background (wallpaper, window frame, title bar) is drawn once per reset and copied for each
frame; only widgets and overlays are drawn per step, with Pillow's built-in bitmap font (no
FreeType, no font files, identical pixels on every machine).

The `position` wallpaper encodes screen coordinates in colour: red = 255 * x / (W - 1), green =
255 * y / (H - 1), blue = 96. With it the window body is left transparent, so a model can learn
to read positions from pixels, a warm-up for learning to ground clicks.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from dart_ray.envs.minidesk.scene import (
    CHAR_H,
    MENUBAR_H,
    TITLE_H,
    Rect,
    Scene,
    Widget,
    text_w,
)
from dart_ray.envs.minidesk.vocab import BUTTONS

FONT = ImageFont.load_default_imagefont()


def drawable(text: str) -> str:
    """`text` as FONT (a Latin-1 bitmap font) can draw it: a character outside Latin-1, which
    a model may type (U+FFFD from a token cut mid-character, another script), is drawn as '?'.
    Only the drawing changes: a field keeps what was typed, and is scored on it."""
    return text.encode("latin-1", "replace").decode("latin-1")


DESKTOP = (58, 110, 165)
WINDOW = (236, 236, 236)
TITLE = (40, 60, 110)
WHITE = (255, 255, 255)
BLACK = (20, 20, 20)
GREY = (150, 150, 150)
FACE = (214, 214, 214)
ACCENT = (50, 100, 200)
SELECTED = (170, 200, 240)


def position_wallpaper(width: int, height: int) -> Image.Image:
    """Red rises with x, green with y: pixel (x, y) = (255x/(W-1), 255y/(H-1), 96)."""
    xs = np.linspace(0, 255, width).round().astype(np.uint8)
    ys = np.linspace(0, 255, height).round().astype(np.uint8)
    arr = np.empty((height, width, 3), dtype=np.uint8)
    arr[:, :, 0] = xs[None, :]
    arr[:, :, 1] = ys[:, None]
    arr[:, :, 2] = 96
    return Image.fromarray(arr, "RGB")


def background(scene: Scene, wallpaper: str) -> Image.Image:
    """Wallpaper plus window chrome: everything that does not change during an episode.

    Shared, not copied: the sessions of a process showing the same window at the same size
    draw on copies of one image (`render` copies it), so a 1920x1080 session holds its current
    frame only, not a background of its own too (6.2 MB each; docs/BENCHMARKS.md, memory per
    session). Never draw on the image returned."""
    return _background(scene.width, scene.height, scene.title, bool(scene.menus), wallpaper)


@lru_cache(maxsize=16)
def _background(w: int, h: int, title: str, menus: bool, wallpaper: str) -> Image.Image:
    img = position_wallpaper(w, h) if wallpaper == "position" else Image.new("RGB", (w, h), DESKTOP)
    d = ImageDraw.Draw(img)
    if wallpaper != "position":
        d.rectangle((1, 1, w - 2, h - 2), fill=WINDOW, outline=GREY)
    d.rectangle((1, 1, w - 2, TITLE_H - 1), fill=TITLE)
    d.text((PAD_TITLE, 3), title, font=FONT, fill=WHITE)
    if menus:
        d.rectangle((1, TITLE_H, w - 2, TITLE_H + MENUBAR_H - 1), fill=FACE)
    return img


PAD_TITLE = 6


def button_face(label: str) -> tuple[int, int, int]:
    """A colour for a button's face, fixed by its label (the same label, the same colour, on
    every screen), like an application's icon: one of 18 well-separated colours, light enough
    for the black text to stay legible; each of MiniDesk's 18 button labels has its own, any
    other label takes one by a stable hash."""
    if label in BUTTONS:
        return FACES[BUTTONS.index(label) % len(FACES)]
    return FACES[zlib.crc32(label.encode()) % len(FACES)]


FACES = [
    (250, 120, 120),
    (120, 220, 120),
    (250, 230, 90),
    (110, 170, 250),
    (250, 170, 80),
    (200, 130, 240),
    (100, 230, 230),
    (250, 130, 230),
    (200, 240, 90),
    (250, 200, 210),
    (60, 190, 170),
    (220, 200, 255),
    (210, 160, 100),
    (255, 250, 200),
    (200, 90, 90),
    (170, 255, 200),
    (170, 170, 60),
    (140, 140, 230),
]


def render(scene: Scene, base: Image.Image, button_colours: bool = False) -> Image.Image:
    img = base.copy()
    d = ImageDraw.Draw(img)
    for name, r in scene.menu_rects.items():
        if scene.open_menu == name:
            _box(d, r, fill=SELECTED)
        d.text((r.x + 5, r.y + 2), name, font=FONT, fill=BLACK)
    for name, r in scene.tab_rects.items():
        active = name == scene.active_tab
        _box(d, r, fill=WINDOW if active else FACE, outline=ACCENT if active else GREY)
        d.text((r.x + 6, r.y + 2), name, font=FONT, fill=BLACK)
    for w in scene.widgets.values():
        if scene.on_page(w):
            _widget(d, scene, w, button_colours)
    if scene.open_dropdown is not None:
        w = scene.widgets[scene.open_dropdown]
        for opt, r in zip(w.options, scene.dropdown_rows(w), strict=True):
            _box(d, r, fill=SELECTED if opt == w.selected else WHITE, outline=GREY)
            d.text((r.x + 3, r.y + 1), opt, font=FONT, fill=BLACK)
    if scene.open_menu is not None:
        for item, r in zip(
            scene.menus[scene.open_menu], scene.menu_rows(scene.open_menu), strict=True
        ):
            _box(d, r, fill=WHITE, outline=GREY)
            d.text((r.x + 5, r.y + 1), item, font=FONT, fill=BLACK)
    if scene.dialog_of is not None:
        _dialog(d, scene)
    return img


def _box(
    d: ImageDraw.ImageDraw,
    r: Rect,
    fill: tuple[int, int, int] | None = None,
    outline: tuple[int, int, int] | None = GREY,
) -> None:
    d.rectangle((r.x, r.y, r.x + r.w - 1, r.y + r.h - 1), fill=fill, outline=outline)


def _button(d: ImageDraw.ImageDraw, r: Rect, label: str, coloured: bool = False) -> None:
    _box(d, r, fill=button_face(label) if coloured else FACE, outline=BLACK)
    d.text(
        (r.x + (r.w - text_w(label)) // 2, r.y + (r.h - CHAR_H) // 2), label, font=FONT, fill=BLACK
    )


def _widget(d: ImageDraw.ImageDraw, s: Scene, w: Widget, button_colours: bool) -> None:
    r = w.rect
    if w.kind == "button":
        _button(d, r, w.label, button_colours)
    elif w.kind == "checkbox":
        _box(d, Rect(r.x, r.y + 2, 10, 10), fill=WHITE, outline=BLACK)
        if w.checked:
            d.line((r.x + 2, r.y + 7, r.x + 4, r.y + 10, r.x + 8, r.y + 3), fill=BLACK, width=2)
        d.text((r.x + 14, r.y + 1), w.label, font=FONT, fill=BLACK)
    elif w.kind == "radio":
        d.text((r.x, r.y + 1), w.label, font=FONT, fill=BLACK)
        for opt, p in zip(w.options, w.parts, strict=True):
            d.ellipse((p.x, p.y + 2, p.x + 9, p.y + 11), fill=WHITE, outline=BLACK)
            if opt == w.selected:
                d.ellipse((p.x + 3, p.y + 5, p.x + 6, p.y + 8), fill=BLACK)
            d.text((p.x + 12, p.y + 1), opt, font=FONT, fill=BLACK)
    elif w.kind in ("textfield", "dropdown"):
        d.text((r.x, r.y + (r.h - CHAR_H) // 2), w.label, font=FONT, fill=BLACK)
        b = w.field_box()
        focused = s.focus == w.id
        _box(d, b, fill=WHITE, outline=ACCENT if focused else GREY)
        shown = w.text if w.kind == "textfield" else (w.selected or "")
        if s.select_all and focused and shown:
            _box(
                d,
                Rect(b.x + 2, b.y + 3, text_w(shown) + 1, CHAR_H + 1),
                fill=SELECTED,
                outline=None,
            )
        d.text(
            (b.x + 3, b.y + (b.h - CHAR_H) // 2),
            drawable(shown[-(b.w // 6 - 2) :]),
            font=FONT,
            fill=BLACK,
        )
        if w.kind == "dropdown":
            ax, ay = b.x + b.w - 10, b.y + b.h // 2 - 2
            d.polygon([(ax, ay), (ax + 6, ay), (ax + 3, ay + 4)], fill=BLACK)
        elif focused and not s.select_all:
            cx = b.x + 3 + min(text_w(shown), b.w - 8)
            d.line((cx, b.y + 3, cx, b.y + b.h - 4), fill=BLACK)
    elif w.kind == "list":
        d.text((r.x, r.y), w.label, font=FONT, fill=BLACK)
        box = w.list_box()
        _box(d, box, fill=WHITE, outline=GREY)
        items = w.visible_items(s)
        for i in range(w.offset, min(len(items), w.offset + w.rows)):
            rr = w.row_rect(i)
            if items[i] == w.selected:
                _box(d, rr, fill=SELECTED, outline=None)
            d.text((rr.x + 3, rr.y + 1), items[i], font=FONT, fill=BLACK)
        if len(items) > w.rows:  # scroll bar thumb
            frac0, frac1 = w.offset / len(items), (w.offset + w.rows) / len(items)
            y0 = box.y + 1 + round(frac0 * (box.h - 2))
            y1 = box.y + round(frac1 * (box.h - 2))
            d.rectangle((box.x + box.w - 5, y0, box.x + box.w - 2, y1), fill=GREY)


def _dialog(d: ImageDraw.ImageDraw, s: Scene) -> None:
    owner = s.widgets[s.dialog_of or ""]
    spec = owner.dialog or {}
    r = s.dialog_rect()
    _box(d, r, fill=WINDOW, outline=BLACK)
    d.rectangle((r.x, r.y, r.x + r.w - 1, r.y + 13), fill=TITLE)
    d.text((r.x + 5, r.y + 1), owner.label, font=FONT, fill=WHITE)
    d.text((r.x + 8, r.y + 20), spec.get("text", "Are you sure?"), font=FONT, fill=BLACK)
    ok, cancel = s.dialog_buttons()
    _button(d, ok, spec.get("ok", "OK"))
    _button(d, cancel, spec.get("cancel", "Cancel"))
