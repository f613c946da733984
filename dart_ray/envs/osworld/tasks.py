"""OSWorld's task files as a dart-ray task JSONL (what `env.tasks` reads).

OSWorld keeps one JSON file per task under `evaluation_examples/examples/<domain>/<id>.json`
and index files (`test_all.json`, or any subset such as a training list) that map each
domain to its task ids. This turns an index into one JSONL line per task, with the domain as
the task's `family` (so `env.families = ["chrome"]` keeps one domain):

    python -m dart_ray.envs.osworld.tasks --examples evaluation_examples \\
        --index evaluation_examples/test_all.json --out test_all.jsonl --split heldout
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from dart_ray.envs.osworld.env import task_from_json
from dart_ray.records import Task

# Where our OSWorld task files come from (docs/ENVIRONMENTS.md, "Coverage"): OSWorld's own
# repository is not reachable from our machines; this fork's `evaluation_examples` has the
# same `test_all.json` (369 tasks, the same count per domain), unchanged since this commit.
TASKS_REPOSITORY = "https://github.com/pkueecszc/OSWorld"
TASKS_COMMIT = "be0b6285d58df9e12bc3d67238642ec177c6fd40"


def iter_tasks(examples: Path, index: Path, env: str, split: str) -> Iterator[Task]:
    """The tasks an index names, read from `examples/examples/<domain>/<id>.json`."""
    try:
        domains = json.loads(index.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{index}: not a readable OSWorld index ({e})") from None
    if not isinstance(domains, dict):
        raise ValueError(f"{index}: expected {{domain: [task ids]}}")
    for domain, ids in domains.items():
        for task_id in ids:
            path = examples / "examples" / domain / f"{task_id}.json"
            try:
                raw = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"{path}: not a readable OSWorld task ({e})") from None
            task = task_from_json(raw, env=env, split=split)
            yield Task(
                task.task_id,
                task.instruction,
                task.env,
                {**task.config, "family": domain},
                task.split,
            )


def write_jsonl(tasks: Iterator[Task], out: Path) -> int:
    """One line per task in the format `load_tasks` reads; returns the count."""
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("w") as f:
        for t in tasks:
            line = {
                "task_id": t.task_id,
                "instruction": t.instruction,
                "env": t.env,
                "config": t.config,
                "split": t.split,
            }
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            n += 1
    return n


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dart_ray.envs.osworld.tasks", description=__doc__)
    p.add_argument("--examples", type=Path, required=True, help="OSWorld evaluation_examples")
    p.add_argument("--index", type=Path, required=True, help="index JSON {domain: [ids]}")
    p.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    p.add_argument("--split", default="train", choices=["train", "heldout"])
    p.add_argument("--env", default="osworld", help="env kind stamped on each task")
    args = p.parse_args(argv)
    try:
        n = write_jsonl(iter_tasks(args.examples, args.index, args.env, args.split), args.out)
    except ValueError as e:
        print(f"osworld_tasks: {e}", file=sys.stderr)
        return 2
    print(f"{n} tasks written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
