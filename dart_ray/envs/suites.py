"""The task suites a config names, and what makes two tasks the same.

A suite has up to four splits: `train` (what the policy trains on), `validation` (what every
choice reads: a warm start's stopping point, hyper-parameters, an arm), `heldout` (read once
per reported number) and `ood` (held out by construction: targets no other split names,
reported apart from the in-distribution held-out set). Every consumer of tasks (the run,
`dart-ray sft`, `dart-ray eval`, `dart-ray experiment`) reads them here, so a suite means the
same tasks everywhere.

Two tasks are the same when they show the same first screen and say the same instruction
(`taskfile.content_key`): a held-out task equal to a training task by content measures memory, not
generalisation, whatever their seeds or ids. The shipped suites are disjoint by content
between splits (tests/envs/test_suites.py renders every one).
"""

from __future__ import annotations

from dart_ray.config import Config, ConfigError
from dart_ray.config.tree import LATENCY_KIND
from dart_ray.envs.taskfile import SPLITS, content_key
from dart_ray.records import Task

__all__ = ["SPLITS", "content_key", "load_suite", "split_path"]


_KEYS = {
    "train": "env.tasks",
    "validation": "env.validation_tasks",
    "heldout": "env.heldout_tasks",
    "ood": "env.ood_tasks",
}


def split_path(config: Config, split: str) -> object:
    """The task file `config` names for `split` (None: the env's built-in split)."""
    if split not in _KEYS:
        raise ConfigError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    return getattr(config.env, _KEYS[split].split(".", 1)[1])


def load_suite(config: Config, split: str) -> list[Task]:
    """A split's tasks (the configured JSONL file, else the env's shipped split), filtered by
    `env.families` / `env.tiers` and cut to `env.task_limit`."""
    from dart_ray.envs.minidesk.generate import TASKS_DIR, load_tasks

    e = config.env
    path = split_path(config, split)
    if path is not None:
        tasks = load_tasks(path, split)  # type: ignore[arg-type]
    elif e.kind in ("minidesk", LATENCY_KIND):
        if split == "ood" and not (TASKS_DIR / "ood.jsonl").is_file():
            raise ConfigError(
                "env.ood_tasks is required: MiniDesk's built-in suite has no ood split"
            )
        tasks = load_tasks(split=split)
    else:
        raise ConfigError(f"{_KEYS[split]} is required for env.kind {e.kind!r} (no built-in suite)")
    if e.families:
        tasks = [t for t in tasks if t.config.get("family") in e.families]
    if e.tiers:
        tasks = [t for t in tasks if t.config.get("tier") in e.tiers]
    if not tasks:
        raise ConfigError(f"no {split} task is left after env.families / env.tiers filtering")
    return tasks[: e.task_limit] if e.task_limit else tasks
