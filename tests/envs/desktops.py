"""What the desktop tests share: the 800x600 desktop they run, and OSWorld's two-visit browser
history (the `update_browse_history` step's example)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dart_ray.config import EnvConfig
from dart_ray.envs.osworld.env import LocalDesktopEnv
from dart_ray.testing.procs import serving

CFG = EnvConfig(kind="desktop", screen_width=800, screen_height=600)


def desktop() -> Iterator[LocalDesktopEnv]:
    """A `CFG` desktop for a test module's fixture (`yield from desktop()`), closed after."""
    env = LocalDesktopEnv(CFG)
    try:
        yield env
    finally:
        env.close()


def two_visits() -> list[dict[str, Any]]:
    """An `update_browse_history` step's history: a page an hour ago, one a minute ago."""
    return [
        {
            "url": "http://example.test/1",
            "title": "An hour ago",
            "visit_time_from_now_in_seconds": 3600,
        },
        {
            "url": "http://example.test/2",
            "title": "A minute ago",
            "visit_time_from_now_in_seconds": 60,
        },
    ]


@contextlib.contextmanager
def serving_pages(root: Path) -> Iterator[str]:
    """Base URL of a web server on this machine with pages a.html and b.html under `root`."""
    for name in ("a", "b"):
        (root / f"{name}.html").write_text(f"<title>{name}</title>page {name}")
    with serving(root) as url:
        yield url
