"""Generate MiniDesk task files: `python -m dart_ray.envs.minidesk.generate [--out DIR]`.

Tasks come from (family, tier, seed); the train and held-out splits use disjoint seeds, so a
held-out task is a scene and a goal the policy never trained on, drawn from the same families.
Each line of the JSONL files is one `Task` (task_id, instruction, env, config, split), with the
whole scene spec in `config`, so a file stays valid even if the generators change later.

Every generated task is checked before it is written: the oracle must solve it at the default
320x240 screen with both placements. The shipped files are `tasks/train.jsonl` and
`tasks/heldout.jsonl` beside this module; `load_tasks` reads them (or any JSONL task file).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from dart_ray.config import EnvConfig, MiniDeskOptions
from dart_ray.envs.minidesk.families import FAMILIES, TIERS
from dart_ray.envs.taskfile import read_task_file
from dart_ray.records import Task

TASKS_DIR = Path(__file__).parent / "tasks"
TRAIN_SEEDS = range(0, 1000)
HELDOUT_SEEDS = range(100_000, 101_000)


def make_task(family: str, tier: int, seed: int, split: str = "train") -> Task:
    """The task of one (family, tier, seed); the same arguments always give the same task."""
    if family not in FAMILIES:
        raise ValueError(f"unknown MiniDesk family {family!r}; families: {sorted(FAMILIES)}")
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, got {tier}")
    rng = random.Random(f"{family}/{tier}/{seed}")
    instruction, spec = FAMILIES[family](rng, tier)
    spec |= {
        "family": family,
        "tier": tier,
        "seed": seed,
        "placement": "scatter" if rng.random() < 0.5 else "flow",
    }
    return Task(f"minidesk/{family}/t{tier}/{seed}", instruction, "minidesk", spec, split)


def iter_tasks(
    per_cell: int,
    split: str,
    families: Sequence[str] = tuple(FAMILIES),
    tiers: Sequence[int] = TIERS,
) -> Iterator[Task]:
    seeds = TRAIN_SEEDS if split == "train" else HELDOUT_SEEDS
    if per_cell > len(seeds):
        raise ValueError(f"at most {len(seeds)} tasks per family and tier, got {per_cell}")
    for family in families:
        for tier in tiers:
            for seed in seeds[:per_cell]:
                yield make_task(family, tier, seed, split)


def solve(task: Task, config: EnvConfig | None = None, max_steps: int = 20) -> tuple[float, int]:
    """Run the oracle on a task: (reward, steps)."""
    from dart_ray.envs.minidesk.env import MiniDeskEnv
    from dart_ray.envs.minidesk.oracle import oracle_action

    env = MiniDeskEnv(config)
    env.reset(task)
    steps = 0
    while not env.done and steps < max_steps:
        env.step(oracle_action(env))
        steps += 1
    return env.evaluate(), steps


def task_to_json(t: Task) -> str:
    return json.dumps(
        {
            "task_id": t.task_id,
            "instruction": t.instruction,
            "env": t.env,
            "config": t.config,
            "split": t.split,
        },
        sort_keys=True,
    )


def load_tasks(path: str | Path | None = None, split: str = "train") -> list[Task]:
    """Tasks from a JSONL file, or MiniDesk's shipped split when `path` is None.

    Any environment's task file reads through here; a bad line raises `TaskFileError` naming
    the file, the line and the field (`dart_ray.envs.taskfile`)."""
    return read_task_file(path if path is not None else TASKS_DIR / f"{split}.jsonl", split)


def write_split(
    out: Path,
    split: str,
    per_cell: int,
    families: Sequence[str] = tuple(FAMILIES),
    tiers: Sequence[int] = TIERS,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    with (out / f"{split}.jsonl").open("w") as f:
        for t in iter_tasks(per_cell, split, families, tiers):
            for placement in ("flow", "scatter"):
                cfg = EnvConfig(minidesk=MiniDeskOptions(placement=placement))
                reward, _ = solve(t, cfg)
                if reward != 1.0:
                    raise RuntimeError(f"oracle fails {t.task_id} with {placement} placement")
            f.write(task_to_json(t) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=TASKS_DIR)
    ap.add_argument("--train-per-cell", type=int, default=20, help="tasks per family and tier")
    ap.add_argument("--heldout-per-cell", type=int, default=6, help="tasks per family and tier")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=sorted(FAMILIES))
    ap.add_argument("--tiers", nargs="+", type=int, default=list(TIERS), choices=TIERS)
    a = ap.parse_args(argv)
    n_train = write_split(a.out, "train", a.train_per_cell, a.families, a.tiers)
    n_held = write_split(a.out, "heldout", a.heldout_per_cell, a.families, a.tiers)
    print(f"wrote {n_train} train and {n_held} held-out tasks to {a.out}")


if __name__ == "__main__":
    main()
