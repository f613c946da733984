"""Where the tests find OSWorld's venv (`make osworld-venv`): $DART_OSWORLD_VENV, else
`.venv-osworld` at the repository's root; tests that need it skip, saying so, without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

VENV = Path(
    os.environ.get("DART_OSWORLD_VENV") or Path(__file__).resolve().parents[3] / ".venv-osworld"
).absolute()
has_venv = pytest.mark.skipif(
    not (VENV / "bin" / "python").exists(),
    reason=f"needs OSWorld's venv {VENV} (make osworld-venv)",
)
