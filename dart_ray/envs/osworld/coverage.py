"""How much of OSWorld's benchmark our local desktop runs offline, task by task and by domain.

For every task of an index (`test_all.json`: 369 tasks in 10 domains) of a local OSWorld
checkout, three questions:

- **loads**: our converter (`tasks.iter_tasks` / `task_from_json`) accepts the file;
- **sets up**: its `config` steps run without error on our desktop (`LocalDesktopEnv` with
  the OSWorld profile: HOME /home/user, the Debian apps, sudo), within a time limit;
- **evaluates**: OSWorld's own evaluator (`env.desktop.evaluator = "osworld"`) scores the state
  right after set-up 0, without an error (an initial state that scores 1 is reported too);
- **a solution scores 1** (`--solutions`): set up afresh, our written solution of the task
  (`dart_ray.envs.osworld.solutions`) played through the env as UI-TARS actions, and scored 1
  by OSWorld's evaluator.

A task is excluded before anything runs when reading it shows it cannot run here, and the
reason is recorded: it downloads its files or reads `cloud_file` (the internet) and they are
not in the `--cache` folder, opens a web page or needs Google Drive or a login, needs VS Code
(not packaged by Debian), GNOME (VM-only), or a metric whose package the venv leaves out. Set-up and
evaluation run only for the rest, one desktop reused (a reset between tasks), and a desktop
that fails or overruns is replaced.

    python -m dart_ray.envs.osworld.coverage --osworld /path/to/OSWorld --json out.json \\
        [--domains os,vlc] [--limit-s 120] [--static] [--cache DIR] [--solutions]

`--static` only loads and classifies (seconds). `--cache DIR` is OSWorld's cache folder, laid
out as OSWorld's `DesktopEnv` lays it (`<DIR>/<task id>/<uuid5(NAMESPACE_URL, url)>_<file
name>` for a `download` step's file, `<DIR>/<task id>/<dest>` for a `cloud_file` getter's):
a task whose files are all there is run, its set-up and evaluation reading them from there. The table (domain, tasks, loads, excluded,
run, sets up, evaluates, solved) goes to stdout; the JSON has the task files' source and one
record per task.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dart_ray.envs.osworld.env import task_from_json
from dart_ray.envs.osworld.setup import cache_name
from dart_ray.envs.osworld.solutions import SOLUTIONS
from dart_ray.envs.osworld.tasks import TASKS_COMMIT, TASKS_REPOSITORY
from dart_ray.envs.osworld.worker import BROWSER_ONLINE, LEFT_OUT
from dart_ray.records import Action, Task

ONLINE_SETUP = {"googledrive", "login", "proxy"}
GNOME = ("gsettings", "gnome-", "nautilus", "check_gnome_favorite_apps", "dconf")


@dataclass
class Coverage:
    """One task's answers; `reasons` say why it was excluded or what failed."""

    task_id: str
    domain: str
    loads: bool = False
    excluded: bool = False
    ran: bool = False
    sets_up: bool = False
    evaluates: bool = False
    score: float | None = None
    solved: bool | None = None
    """Our solution scored 1 (None: no solution, or not played)."""
    seconds: float = 0.0
    reasons: list[str] = field(default_factory=list)


def _getters(evaluator: dict[str, Any]) -> Iterator[str]:
    for key in ("result", "expected"):
        value = evaluator.get(key)
        for g in value if isinstance(value, list) else [value]:
            if isinstance(g, dict) and isinstance(g.get("type"), str):
                yield g["type"]


def _metrics(evaluator: dict[str, Any]) -> list[str]:
    func = evaluator.get("func", [])
    return [f for f in (func if isinstance(func, list) else [func]) if isinstance(f, str)]


def _steps(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's set-up steps and its evaluator's postconfig steps."""
    evaluator = raw.get("evaluator", {}) if isinstance(raw.get("evaluator"), dict) else {}
    steps = list(raw.get("config", [])) + list(evaluator.get("postconfig", []))
    return [s for s in steps if isinstance(s, dict)]


def _cloud_files(evaluator: dict[str, Any]) -> Iterator[str]:
    """The `dest` names of the task's `cloud_file` getters (files of its cache folder)."""
    for key in ("result", "expected"):
        value = evaluator.get(key)
        for g in value if isinstance(value, list) else [value]:
            if isinstance(g, dict) and g.get("type") == "cloud_file":
                dest = g.get("dest", [])
                yield from dest if isinstance(dest, list) else [dest]


def uncached(raw: dict[str, Any], cache: Path | None) -> tuple[list[str], list[str]]:
    """The task's download URLs and `cloud_file` names not in `<cache>/<task id>/`, as OSWorld
    keys them (all of them without a cache)."""
    folder = cache / str(raw.get("id")) if cache is not None else None
    downloads = [
        f["url"]
        for s in _steps(raw)
        if s.get("type") == "download"
        for f in s.get("parameters", {}).get("files", [])
        if folder is None or not (folder / cache_name(f["url"], f["path"])).is_file()
    ]
    evaluator = raw.get("evaluator", {}) if isinstance(raw.get("evaluator"), dict) else {}
    clouds = [
        d for d in _cloud_files(evaluator) if folder is None or not (folder / str(d)).is_file()
    ]
    return downloads, clouds


def exclusion_reasons(raw: dict[str, Any], domain: str, cache: Path | None = None) -> list[str]:
    """Why this task cannot run on our offline desktop (empty: it may). With a `cache`, files
    found there (`download` steps' and `cloud_file` getters') need no internet."""
    reasons: list[str] = []
    steps = _steps(raw)
    evaluator = raw.get("evaluator", {}) if isinstance(raw.get("evaluator"), dict) else {}
    kinds = {s.get("type") for s in steps}
    downloads, clouds = uncached(raw, cache)
    if downloads:
        reasons.append("internet: downloads its files (setup `download`)")
    if kinds & ONLINE_SETUP:
        reasons.append(f"internet: setup {sorted(kinds & ONLINE_SETUP)}")
    # a download's URL is the cache's business; browsing history rows are only written down
    fetched = [s for s in steps if s.get("type") not in ("download", "update_browse_history")]
    commands = json.dumps([s.get("parameters", {}) for s in fetched])
    if "http://" in commands or "https://" in commands:
        reasons.append("internet: a setup step names a URL")
    getters = set(_getters(evaluator))
    if clouds:
        reasons.append("internet: getter `cloud_file`")
    if getters & BROWSER_ONLINE:
        reasons.append(f"internet: getter {sorted(getters & BROWSER_ONLINE)}")
    left_out = {m: pkg for pkg, ms in LEFT_OUT.items() for m in ms}
    for m in _metrics(evaluator):
        if m in left_out:
            reasons.append(f"metric `{m}` needs {left_out[m]} (left out of the venv)")
    text = json.dumps(raw)
    if domain == "vs_code" or '"code"' in commands or "vscode" in " ".join(getters):
        reasons.append("app not packaged by Debian: VS Code")
    if any(g in text for g in GNOME):
        reasons.append("VM-only: GNOME (gsettings, nautilus, GNOME settings)")
    return reasons


def classify(
    osworld: Path, index: Path, domains: set[str] | None, cache: Path | None = None
) -> list[tuple[Coverage, Task]]:
    """Every task of the index with its static answers (loads, excluded and why)."""
    out: list[tuple[Coverage, Task]] = []
    for domain, ids in json.loads(index.read_text()).items():
        if domains and domain not in domains:
            continue
        for task_id in ids:
            cov = Coverage(task_id, domain)
            path = osworld / "evaluation_examples" / "examples" / domain / f"{task_id}.json"
            try:
                raw = json.loads(path.read_text())
                task = task_from_json(raw, env="desktop", split="heldout")
            except (OSError, ValueError) as e:
                cov.reasons.append(f"does not load: {e}")
                out.append((cov, Task(task_id, "", "desktop", {})))
                continue
            cov.loads = True
            cov.reasons = exclusion_reasons(raw, domain, cache)
            cov.excluded = bool(cov.reasons)
            out.append((cov, task))
    return out


def _with_limit(limit_s: float, fn: Any, *args: Any) -> Any:
    """fn(*args) in a thread; TimeoutError if it has not returned within limit_s."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except Exception as e:  # handed to the caller, who records it against the task
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        raise TimeoutError(f"over {limit_s:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def run_tasks(
    todo: list[tuple[Coverage, Task]],
    venv: Path,
    limit_s: float,
    cache: Path | None = None,
    solutions: dict[str, list[Action]] | None = None,
) -> None:
    """Set up and evaluate each task on one desktop (replaced when a task breaks it); where
    `solutions` has the task's, set it up again, play it and score it."""
    from dart_ray.config import EnvConfig
    from dart_ray.config.env import DesktopOptions
    from dart_ray.envs.osworld.env import LocalDesktopEnv

    options = DesktopOptions(
        evaluator="osworld",
        osworld_venv=venv,
        osworld_profile=True,
        request_timeout_s=limit_s,
        osworld_cache_dir=cache,
    )
    cfg = EnvConfig(kind="desktop", screen_width=1920, screen_height=1080, desktop=options)
    env: LocalDesktopEnv | None = None
    for n, (cov, task) in enumerate(todo, 1):
        start = time.monotonic()
        cov.ran = True
        stage = "desktop start"
        try:
            env = env or LocalDesktopEnv(cfg)
            stage = "set-up"
            _with_limit(limit_s, env.reset, task)
            cov.sets_up = True
            stage = "evaluation"
            cov.score = _with_limit(limit_s, env.evaluate)
            cov.evaluates = cov.score == 0.0
            if cov.score != 0.0:
                cov.reasons.append(f"the initial state scores {cov.score}")
            actions = (solutions or {}).get(task.task_id)
            if cov.evaluates and actions is not None:
                stage = "solution"
                _with_limit(limit_s, env.reset, task)
                for action in actions:
                    _with_limit(limit_s, env.step, action)
                solved = _with_limit(limit_s, env.evaluate)
                cov.solved = solved == 1.0
                if not cov.solved:
                    cov.reasons.append(f"the solution scores {solved}")
        except Exception as e:  # recorded against the task: the point of the measurement
            cov.reasons.append(f"{stage}: {type(e).__name__}: {str(e)[:300]}")
            if env is not None:
                env.close()
            env = None
        cov.seconds = round(time.monotonic() - start, 1)
        print(f"[{n}/{len(todo)}] {cov.domain}/{cov.task_id}: {_verdict(cov)}", flush=True)
    if env is not None:
        env.close()


def _verdict(cov: Coverage) -> str:
    if cov.evaluates and cov.solved is not False:
        return f"ok{', solved' if cov.solved else ''} ({cov.seconds}s)"
    return f"{cov.reasons[-1] if cov.reasons else '?'} ({cov.seconds}s)"


def table(rows: list[Coverage]) -> str:
    cols = ("tasks", "loads", "excluded", "run", "sets up", "evaluates", "a solution scores 1")
    lines = ["| domain | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]
    domains = sorted({r.domain for r in rows})
    for d in [*domains, "all"]:
        rs = [r for r in rows if d in ("all", r.domain)]
        counts = (
            len(rs),
            sum(r.loads for r in rs),
            sum(r.excluded for r in rs),
            sum(r.ran for r in rs),
            sum(r.sets_up for r in rs),
            sum(r.evaluates for r in rs),
            sum(bool(r.solved) for r in rs),
        )
        name = "**all**" if d == "all" else d
        lines.append(f"| {name} | " + " | ".join(str(c) for c in counts) + " |")
    return "\n".join(lines)


def reason_counts(rows: list[Coverage]) -> dict[str, int]:
    """How many tasks each reason excludes or fails (a task may have several)."""
    counts: dict[str, int] = {}
    for r in rows:
        for why in r.reasons:
            why = re.sub(r"task \S+: ", "", why.split("\n")[0])  # alike failures together
            key = why if len(why) < 110 else why[:107] + "..."
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dart_ray.envs.osworld.coverage", description=__doc__
    )
    p.add_argument("--osworld", type=Path, required=True, help="a checkout of OSWorld")
    p.add_argument("--index", default="test_all.json", help="under evaluation_examples/")
    p.add_argument("--json", type=Path, help="write one record per task here")
    p.add_argument("--domains", default="", help="comma-separated; default: all")
    p.add_argument("--limit-s", type=float, default=120.0, help="per task, set-up and evaluation")
    p.add_argument("--venv", type=Path, default=Path(".venv-osworld"), help="OSWorld's venv")
    p.add_argument("--static", action="store_true", help="only load and classify")
    p.add_argument(
        "--cache",
        type=Path,
        help="OSWorld's cache folder (<dir>/<task id>/<uuid5(url)>_<name>, cloud_file dests): "
        "tasks whose files are all there count as offline, and set up and score from it",
    )
    p.add_argument(
        "--solutions",
        action="store_true",
        help="also play our written solution of each task that evaluates, and score it",
    )
    a = p.parse_args(argv)
    index = a.osworld / "evaluation_examples" / a.index
    if not index.is_file():
        print(f"osworld_coverage: no index {index}", file=sys.stderr)
        return 2
    cache = a.cache.absolute() if a.cache is not None else None
    rows = classify(a.osworld, index, {d for d in a.domains.split(",") if d} or None, cache)
    if not a.static:
        todo = [(c, t) for c, t in rows if c.loads and not c.excluded]
        solutions = {k: acts for k, (_, acts) in SOLUTIONS.items()} if a.solutions else None
        run_tasks(todo, a.venv, a.limit_s, cache, solutions)
    covs = [c for c, _ in rows]
    print(table(covs))
    for why, n in reason_counts(covs).items():
        print(f"{n:4d}  {why}")
    if a.json is not None:
        source = {"repository": TASKS_REPOSITORY, "commit": TASKS_COMMIT, "index": a.index}
        out = {"task_files": source, "solutions": a.solutions, "tasks": [asdict(c) for c in covs]}
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
