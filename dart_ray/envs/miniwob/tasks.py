"""Task files of the MiniWoB++ rung: training, validation and held-out seeds of the oracle's
tasks, held out by seed and by content.

    python -m dart_ray.envs.miniwob.tasks --out fixtures/miniwob \\
        --train-per-task 100 --validation-per-task 30 --heldout-per-task 30

A task is `Task("miniwob/<subdomain>/<seed>", utterance, "miniwob", {"subdomain", "seed"})`.
Each split draws its own range of seeds (`SPLIT_SEEDS`: training from 0, validation from
100000, held-out from 200000), MiniWoB++'s convention. Validation's range was the held-out
range before the protocol of docs/LEARNING.md: the rung's earlier choices (the warm start's
stop, the advantage form) were read on it, which is what a validation split is for; the
held-out range is fresh. A seed is not enough: a page draws
its layout from a small space (click-test shows the same button for every seed), so a
held-out seed can show exactly what a training seed shows. Every split after `train` (in
`SPLITS` order: validation, then held-out) therefore skips a seed whose layout (`layout_key`:
the DOM after reset, in whole pixels, and the instruction) an earlier split or an earlier
seed of its own holds, and draws further seeds, up to `--tries` times the count it wants; a
page whose layouts run out gives fewer tasks (printed). `layouts.json` beside the task files
records every task's key; tests/envs/miniwob/test_tasks.py checks the splits are disjoint
by it and re-renders a sample in Chromium to check the keys are the pages'.

Each task is played once by the oracle while it is written; a seed the oracle does not
solve (reward <= 0) is left out and named, so every task in the files is solvable. The
instruction is the page's own utterance for that seed (the env returns it as the
observation's `text` after reset: it is what MiniWoB shows above the task area).

Lines are interleaved across tasks (the first seed of every task, then the second, ...), so
that cutting a file to its first N tasks (`dart-ray sft --tasks N`, `env.task_limit`) keeps
the tasks mixed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from dart_ray.config import EnvConfig
from dart_ray.envs.minidesk.generate import task_to_json
from dart_ray.envs.miniwob.oracle import TASKS, MiniWobOracle
from dart_ray.envs.taskfile import SPLITS
from dart_ray.records import ActionKind, Observation, Task

if TYPE_CHECKING:
    from dart_ray.envs.miniwob.env import MiniWobEnv

SPLIT_SEEDS = {"train": 0, "validation": 100_000, "heldout": 200_000}
"""First seed of each split's range; a split counts up from it."""
LAYOUTS = "layouts.json"
"""Beside the task files: {task_id: layout_key} of every task they hold."""


def make_task(subdomain: str, seed: int, split: str = "train", instruction: str = "") -> Task:
    return Task(
        f"miniwob/{subdomain}/{seed}",
        instruction,
        "miniwob",
        {"subdomain": subdomain, "seed": seed},
        split,
    )


def layout_key(obs: Observation) -> str:
    """What a policy meets on a MiniWoB++ page before it acts: a digest of the DOM after reset
    (each element's tag, text, value, classes and box, in whole pixels: sub-pixel font
    metrics are the browser's, not the task's) and the instruction. Two seeds with the same
    key are the same task, whatever their numbers. Needs the env's accessibility JSON."""
    if obs.accessibility is None:
        raise ValueError("a MiniWoB++ layout needs the observation's DOM (accessibility)")
    dom = json.loads(obs.accessibility)
    boxes = ("left", "top", "width", "height")
    elements = [
        [e["tag"], e["text"], e["value"], e["id"], e["classes"], *(round(e[b]) for b in boxes)]
        for e in dom["elements"]
    ]
    payload = json.dumps([obs.text or "", elements], separators=(",", ":"))
    return hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()


class Solved(NamedTuple):
    reward: float
    """The task's own reward for the oracle's play."""
    steps: int
    utterance: str
    """The page's instruction for this seed."""
    layout: str
    """`layout_key` of the first observation."""


def solve(env: MiniWobEnv, task: Task, max_steps: int = 6) -> Solved:
    """Play `task` with the oracle."""
    oracle = MiniWobOracle(task.config["subdomain"])
    obs = env.reset(task)
    utterance, layout = obs.text, layout_key(obs)
    for n in range(1, max_steps + 1):
        action, _ = oracle.next_step(obs)
        if action.kind == ActionKind.FINISHED:
            break
        result = env.step(action)
        if result.done:
            return Solved(env.evaluate(), n, utterance, layout)
        obs = result.observation
    return Solved(env.evaluate(), max_steps, utterance, layout)


class Split(NamedTuple):
    tasks: list[Task]
    """Interleaved across pages (see the module's docstring)."""
    layouts: dict[str, str]
    """{task_id: layout_key} of `tasks`."""
    failed: list[str]
    """Seeds the oracle did not solve."""
    repeats: list[str]
    """Seeds skipped: their layout was an earlier split's or an earlier seed's."""
    short: dict[str, int]
    """Pages that ran out of new layouts within the tries: how many tasks they gave."""


def play_split(
    env: MiniWobEnv,
    split: str,
    per_task: int,
    tasks: Sequence[str] = TASKS,
    taken: frozenset[str] = frozenset(),
    tries: int = 4,
) -> Split:
    """`per_task` solved seeds of each page from the split's seed range. `train` keeps every
    seed (a layout may repeat there); any other split skips a layout in `taken` (the earlier
    splits') or one it already holds, trying at most `tries * per_task` seeds a page."""
    first = SPLIT_SEEDS[split]
    distinct = split != "train"
    per_page: dict[str, list[Task]] = {}
    layouts: dict[str, str] = {}
    failed: list[str] = []
    repeats: list[str] = []
    short: dict[str, int] = {}
    for sub in tasks:  # page by page: the env starts a new browser for each
        seen = set(taken)
        got: list[Task] = []
        for seed in range(first, first + (tries * per_task if distinct else per_task)):
            if len(got) == per_task:
                break
            s = solve(env, make_task(sub, seed, split))
            task = make_task(sub, seed, split, s.utterance)
            if distinct and s.layout in seen:
                repeats.append(task.task_id)
            elif s.reward <= 0:
                failed.append(task.task_id)
            else:
                seen.add(s.layout)
                got.append(task)
                layouts[task.task_id] = s.layout
        per_page[sub] = got
        if len(got) < per_task and distinct:
            short[sub] = len(got)
    rows = [page[i] for i in range(per_task) for page in per_page.values() if i < len(page)]
    return Split(rows, layouts, failed, repeats, short)


def write_suite(
    env: MiniWobEnv,
    out: Path,
    per_split: dict[str, int],
    tasks: Sequence[str] = TASKS,
    tries: int = 4,
) -> dict[str, Split]:
    """Write `out/<split>.jsonl` for each split of `per_split` (in `SPLITS` order, each held
    out by content from the ones before) and `out/layouts.json`."""
    out.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    done: dict[str, Split] = {}
    for split in (s for s in SPLITS if s in per_split):
        sp = play_split(env, split, per_split[split], tasks, frozenset(taken), tries)
        taken |= set(sp.layouts.values())
        with (out / f"{split}.jsonl").open("w") as f:
            f.writelines(task_to_json(t) + "\n" for t in sp.tasks)
        done[split] = sp
    layouts = {k: v for sp in done.values() for k, v in sp.layouts.items()}
    (out / LAYOUTS).write_text(json.dumps(layouts, indent=0, sort_keys=True) + "\n")
    return done


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fixtures/miniwob"))
    ap.add_argument("--train-per-task", type=int, default=100)
    ap.add_argument("--validation-per-task", type=int, default=30)
    ap.add_argument("--heldout-per-task", type=int, default=30)
    ap.add_argument("--tries", type=int, default=4, help="seeds tried per task wanted (held out)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    args = ap.parse_args(argv)
    from dart_ray.envs.miniwob.env import MiniWobEnv

    per_split = {
        "train": args.train_per_task,
        "validation": args.validation_per_task,
        "heldout": args.heldout_per_task,
    }
    env = MiniWobEnv(EnvConfig(kind="miniwob"))
    try:
        done = write_suite(env, args.out, per_split, args.tasks, args.tries)
    finally:
        env.close()
    for split, sp in done.items():
        print(
            f"{args.out / split}.jsonl: {len(sp.tasks)} tasks; oracle failed {len(sp.failed)}: "
            f"{sp.failed}; layouts repeated {len(sp.repeats)}; pages short of new layouts: "
            f"{sp.short or 'none'}"
        )


if __name__ == "__main__":
    main()
