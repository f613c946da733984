"""Task files of the MiniWoB++ rung: training and held-out seeds of the oracle's tasks.

    python -m dart_ray.envs.miniwob.tasks --out fixtures/miniwob \\
        --train-per-task 100 --heldout-per-task 30

A task is `Task("miniwob/<subdomain>/<seed>", utterance, "miniwob", {"subdomain", "seed"})`.
Training seeds are 0, 1, ...; held-out seeds start at `HELDOUT_SEED` (100000), so the two are
disjoint for every task. The instruction is the page's own utterance for that seed (the env
returns it as the observation's `text` after reset: it is what MiniWoB shows above the task
area). Each task is played once by the oracle while it is written; a seed the oracle does not
solve (reward <= 0) is left out and named, so every task in the files is solvable.

Lines are interleaved across tasks (seed 0 of every task, then seed 1, ...), so that cutting a
file to its first N tasks (`dart-ray sft --tasks N`, `env.task_limit`) keeps the tasks mixed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dart_ray.config import EnvConfig
from dart_ray.envs.minidesk.generate import task_to_json
from dart_ray.envs.miniwob.oracle import TASKS, MiniWobOracle
from dart_ray.records import ActionKind, Task

if TYPE_CHECKING:
    from dart_ray.envs.miniwob.env import MiniWobEnv

HELDOUT_SEED = 100_000
"""First held-out seed; training seeds count up from 0."""


def make_task(subdomain: str, seed: int, split: str = "train", instruction: str = "") -> Task:
    return Task(
        f"miniwob/{subdomain}/{seed}",
        instruction,
        "miniwob",
        {"subdomain": subdomain, "seed": seed},
        split,
    )


def solve(env: MiniWobEnv, task: Task, max_steps: int = 6) -> tuple[float, int, str]:
    """Play `task` with the oracle: (the task's reward, steps taken, the page's utterance)."""
    oracle = MiniWobOracle(task.config["subdomain"])
    obs = env.reset(task)
    utterance = obs.text
    for n in range(1, max_steps + 1):
        action, _ = oracle.next_step(obs)
        if action.kind == ActionKind.FINISHED:
            break
        result = env.step(action)
        if result.done:
            return env.evaluate(), n, utterance
        obs = result.observation
    return env.evaluate(), max_steps, utterance


def write_split(
    env: MiniWobEnv, out: Path, split: str, per_task: int, tasks: Sequence[str] = TASKS
) -> tuple[int, list[str]]:
    """Write `out/<split>.jsonl`; (tasks written, ids left out because the oracle failed)."""
    first = 0 if split == "train" else HELDOUT_SEED
    seeds = range(first, first + per_task)
    played: dict[tuple[str, int], Task] = {}
    failed = []
    for sub in tasks:  # task by task: the env starts a new browser for each
        for seed in seeds:
            reward, _, utterance = solve(env, make_task(sub, seed, split))
            if reward > 0:
                played[sub, seed] = make_task(sub, seed, split, utterance)
            else:
                failed.append(f"miniwob/{sub}/{seed}")
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{split}.jsonl").open("w") as f:
        for seed in seeds:
            for sub in tasks:
                if (sub, seed) in played:
                    f.write(task_to_json(played[sub, seed]) + "\n")
    return len(played), failed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures/miniwob"))
    ap.add_argument("--train-per-task", type=int, default=100)
    ap.add_argument("--heldout-per-task", type=int, default=30)
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    args = ap.parse_args(argv)
    from dart_ray.envs.miniwob.env import MiniWobEnv

    env = MiniWobEnv(EnvConfig(kind="miniwob"))
    try:
        for split, per in (("train", args.train_per_task), ("heldout", args.heldout_per_task)):
            n, failed = write_split(env, args.out, split, per, args.tasks)
            print(f"{args.out / split}.jsonl: {n} tasks; oracle failed {len(failed)}: {failed}")
    finally:
        env.close()


if __name__ == "__main__":
    main()
