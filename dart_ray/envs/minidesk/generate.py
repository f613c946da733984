"""Generate MiniDesk task suites: `python -m dart_ray.envs.minidesk.generate [--out DIR]`.

Tasks come from (family, tier, seed); each split walks its own range of seeds (`SEEDS`). A
task enters a split only if its content (its first screen, rendered under the suite's env
options, and its instruction: `dart_ray.envs.suites.content_key`) is not already in this or
an earlier split, so `validation` and `heldout` share no screen-and-instruction with `train`,
nor with each other: a held-out task is a scene and a goal the policy never trained on. The
`ood` split (`--ood-per-cell`) holds tasks whose instruction names one of `HELD_OUT_WORDS`;
the other splits hold none of those, so `ood` measures targets never trained on.

Each line of the JSONL files is one `Task` (task_id, instruction, env, config, split), with the
whole scene spec in `config`, so a file stays valid even if the generators change later.
Every generated task is checked before it is written: the oracle must solve it under the
suite's env options (`--config`; with the `task` placement, under both flow and scatter).
The built-in suite is `tasks/{train,validation,heldout}.jsonl` beside this module (default
env options); `load_tasks` reads them (or any JSONL task file).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from dart_ray.config import EnvConfig, MiniDeskOptions
from dart_ray.envs.minidesk.families import FAMILIES, TIERS
from dart_ray.envs.minidesk.vocab import HELD_OUT_WORDS
from dart_ray.envs.taskfile import read_task_file, task_from_dict
from dart_ray.records import Task

TASKS_DIR = Path(__file__).parent / "tasks"
SEEDS = {
    "train": range(0, 100_000),
    "heldout": range(100_000, 200_000),
    "validation": range(200_000, 300_000),
    "ood": range(300_000, 400_000),
}
"""Each split's seeds: disjoint, so task ids never repeat across splits."""
TRAIN_SEEDS, HELDOUT_SEEDS = SEEDS["train"], SEEDS["heldout"]
_HELD_OUT = {w.lower() for w in HELD_OUT_WORDS}


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


def names_held_out_word(task: Task) -> bool:
    """Whether the instruction names (in quotes) one of `HELD_OUT_WORDS`, in any case."""
    return any(w.lower() in _HELD_OUT for w in re.findall(r"'([^']*)'", task.instruction))


def iter_tasks(
    per_cell: int,
    split: str,
    families: Sequence[str] = tuple(FAMILIES),
    tiers: Sequence[int] = TIERS,
) -> Iterator[Task]:
    """The first `per_cell` seeds of `split` for every family and tier (no content check:
    `write_suite` makes the shipped files)."""
    seeds = SEEDS[split]
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


def as_shipped(t: Task) -> Task:
    """`t` as its line in a task file reads back: keys sorted, so a scene's menus come back
    in name order, which is the order the menu bar draws them in (and the content a file's
    task shows)."""
    return task_from_dict(json.loads(task_to_json(t)), t.task_id, t.split)


def load_tasks(path: str | Path | None = None, split: str = "train") -> list[Task]:
    """Tasks from a JSONL file, or MiniDesk's shipped split when `path` is None.

    Any environment's task file reads through here; a bad line raises `TaskFileError` naming
    the file, the line and the field (`dart_ray.envs.taskfile`)."""
    return read_task_file(path if path is not None else TASKS_DIR / f"{split}.jsonl", split)


def _check_configs(env: EnvConfig) -> list[EnvConfig]:
    """The env options the oracle must solve every task under: the suite's own, or, with the
    `task` placement (each task says), both placements a task may say."""
    if env.minidesk.placement != "task":
        return [env]
    return [
        env.model_copy(update={"minidesk": env.minidesk.model_copy(update={"placement": p})})
        for p in ("flow", "scatter")
    ]


def write_suite(
    out: Path,
    per_cell: Mapping[str, int],
    families: Sequence[str] = tuple(FAMILIES),
    tiers: Sequence[int] = TIERS,
    env: EnvConfig | None = None,
) -> dict[str, int]:
    """Write `out/<split>.jsonl` for every split with `per_cell[split]` > 0 (the module
    docstring); returns the tasks written per split. Raises if a split cannot find enough
    distinct tasks among its seeds; an `ood` cell whose family names no held-out word is left
    empty (a family without such targets has no ood tasks)."""
    from dart_ray.envs.minidesk.env import MiniDeskEnv
    from dart_ray.envs.taskfile import SPLITS, content_key

    env = env or EnvConfig()
    probe = MiniDeskEnv(env)
    checks = _check_configs(env)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    written: dict[str, int] = {}
    for split in (s for s in SPLITS if per_cell.get(s, 0) > 0):
        n, written[split] = per_cell[split], 0
        with (out / f"{split}.jsonl").open("w") as f:
            for family in families:
                for tier in tiers:
                    taken = 0
                    # an ood cell looks a while for instructions naming a held-out word
                    tries = SEEDS[split] if split != "ood" else SEEDS[split][: 200 * n + 2000]
                    for seed in tries:
                        if taken == n:
                            break
                        t = as_shipped(make_task(family, tier, seed, split))
                        if names_held_out_word(t) != (split == "ood"):
                            continue
                        key = content_key(probe, t)
                        if key in seen:
                            continue
                        for cfg in checks:
                            if solve(t, cfg)[0] != 1.0:
                                raise RuntimeError(
                                    f"oracle fails {t.task_id} with {cfg.minidesk.placement} "
                                    f"placement at {cfg.screen_width}x{cfg.screen_height}"
                                )
                        seen.add(key)
                        f.write(task_to_json(t) + "\n")
                        taken += 1
                    if taken < n and (split != "ood" or taken > 0):
                        raise RuntimeError(
                            f"{split}: only {taken} of {n} distinct {family} tier-{tier} tasks; "
                            "the scene space is too small for the suite asked for"
                        )
                    written[split] += taken
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=TASKS_DIR)
    ap.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML config whose [env] options render the suite (default: EnvConfig's)",
    )
    ap.add_argument("--train-per-cell", type=int, default=20, help="tasks per family and tier")
    ap.add_argument("--validation-per-cell", type=int, default=None, help="default: as held-out")
    ap.add_argument("--heldout-per-cell", type=int, default=6, help="tasks per family and tier")
    ap.add_argument("--ood-per-cell", type=int, default=0, help="tasks naming held-out words")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=sorted(FAMILIES))
    ap.add_argument("--tiers", nargs="+", type=int, default=list(TIERS), choices=TIERS)
    a = ap.parse_args(argv)
    env = EnvConfig(minidesk=MiniDeskOptions())
    if a.config is not None:
        from dart_ray.config import load_config

        env = load_config(a.config, []).env
    per_cell = {
        "train": a.train_per_cell,
        "validation": a.heldout_per_cell
        if a.validation_per_cell is None
        else a.validation_per_cell,
        "heldout": a.heldout_per_cell,
        "ood": a.ood_per_cell,
    }
    n = write_suite(a.out, per_cell, a.families, a.tiers, env)
    print(f"wrote {', '.join(f'{k} {v}' for k, v in n.items())} tasks to {a.out}")


if __name__ == "__main__":
    main()
