"""The task suites a config names: training or held-out tasks, filtered and cut.

Every consumer of tasks (the run, `dart-ray sft`, `dart-ray eval`) reads them here, so a
suite means the same tasks everywhere.
"""

from __future__ import annotations

from dart_ray.config import Config, ConfigError
from dart_ray.config.tree import LATENCY_KIND
from dart_ray.records import Task


def load_suite(config: Config, split: str) -> list[Task]:
    """Training or held-out tasks (the configured JSONL file, else the env's shipped split),
    filtered by `env.families` / `env.tiers` and cut to `env.task_limit`."""
    from dart_ray.envs.minidesk.generate import load_tasks

    e = config.env
    path = e.tasks if split == "train" else e.heldout_tasks
    if path is not None:
        tasks = load_tasks(path, split)
    elif e.kind in ("minidesk", LATENCY_KIND):
        tasks = load_tasks(split=split)
    else:
        key = "env.tasks" if split == "train" else "env.heldout_tasks"
        raise ConfigError(f"{key} is required for env.kind {e.kind!r} (no built-in suite)")
    if e.families:
        tasks = [t for t in tasks if t.config.get("family") in e.families]
    if e.tiers:
        tasks = [t for t in tasks if t.config.get("tier") in e.tiers]
    if not tasks:
        raise ConfigError(f"no {split} task is left after env.families / env.tiers filtering")
    return tasks[: e.task_limit] if e.task_limit else tasks
