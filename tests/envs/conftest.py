"""Fixtures of the environment tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dart_ray.envs.osworld.env import LocalDesktopEnv
from tests.envs.desktops import desktop


@pytest.fixture(scope="module")
def desk() -> Iterator[LocalDesktopEnv]:
    """A real X desktop per test module (a module may define its own `desk` instead)."""
    yield from desktop()
