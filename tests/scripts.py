"""Load a script of the repository (benchmarks/, scripts/) as a module, for tests of it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relpath: str) -> ModuleType:
    """`relpath` (from the repository root) imported under its file's stem; registered in
    `sys.modules` first, since a script's dataclasses look their module up there."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
