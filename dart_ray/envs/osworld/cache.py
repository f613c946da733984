"""What OSWorld's tasks download, and where each file goes in a cache folder, for filling the
cache on a machine with the internet and copying it to one without.

OSWorld keeps one cache folder per task (`DesktopEnv`: `<cache>/<task id>`). Two kinds of file
go there, named as OSWorld names them, so one cache serves OSWorld's own `DesktopEnv` and
dart-ray (`env.desktop.osworld_cache_dir`, `osworld_coverage --cache`):

- a `download` set-up step's file (also in an evaluator's `postconfig`):
  `<task id>/<uuid5(NAMESPACE_URL, url)>_<basename of its path on the desktop>`
  (`setup.cache_name`);
- a `cloud_file` getter's file: `<task id>/<dest>` (with `multi`, each `path`/`dest` pair).

    python -m dart_ray.envs.osworld.cache --osworld /path/to/OSWorld [--domains os] \\
        [--missing-from DIR]

prints one line per file, the URL and the path under the cache folder, separated by a tab
(`--missing-from`: only those not yet there).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dart_ray.envs.osworld.setup import cache_name


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def task_files(raw: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(url, path under the cache folder) for every file the task downloads."""
    task_id = str(raw.get("id"))
    found = raw.get("evaluator")
    evaluator: dict[str, Any] = found if isinstance(found, dict) else {}
    steps = list(raw.get("config", [])) + list(evaluator.get("postconfig", []))
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "download":
            for f in step.get("parameters", {}).get("files", []):
                yield f["url"], f"{task_id}/{cache_name(f['url'], f['path'])}"
    for key in ("result", "expected"):
        for g in _as_list(evaluator.get(key)):
            if isinstance(g, dict) and g.get("type") == "cloud_file":
                for url, dest in zip(
                    _as_list(g.get("path")), _as_list(g.get("dest")), strict=False
                ):
                    yield str(url), f"{task_id}/{dest}"


def index_files(osworld: Path, index: str, domains: set[str] | None) -> Iterator[tuple[str, str]]:
    """task_files of every task of the index (`evaluation_examples/<index>`), once each."""
    root = osworld / "evaluation_examples"
    seen: set[str] = set()
    for domain, ids in json.loads((root / index).read_text()).items():
        if domains and domain not in domains:
            continue
        for task_id in ids:
            raw = json.loads((root / "examples" / domain / f"{task_id}.json").read_text())
            for url, path in task_files(raw):
                if path not in seen:
                    seen.add(path)
                    yield url, path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dart_ray.envs.osworld.cache", description=__doc__)
    p.add_argument("--osworld", type=Path, required=True, help="a checkout of OSWorld")
    p.add_argument("--index", default="test_all.json", help="under evaluation_examples/")
    p.add_argument("--domains", default="", help="comma-separated; default: all")
    p.add_argument("--missing-from", type=Path, help="list only files not in this cache folder")
    a = p.parse_args(argv)
    domains = {d for d in a.domains.split(",") if d} or None
    for url, path in index_files(a.osworld, a.index, domains):
        if a.missing_from is None or not (a.missing_from / path).is_file():
            print(f"{url}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
