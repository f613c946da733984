"""The MiniWoB++ rung's task files are held out by seed and by content: no validation or
held-out task shows a layout (the DOM after reset, and the instruction) that a training task,
or an earlier split, shows. The first test reads the committed `layouts.json`; the browser
tests re-render a sample in Chromium (the keys are the pages', not stale) and write a split
that must skip what an earlier one holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dart_ray.config import EnvConfig
from dart_ray.envs.miniwob.oracle import TASKS
from dart_ray.envs.miniwob.tasks import LAYOUTS, SPLIT_SEEDS, layout_key, make_task
from dart_ray.envs.taskfile import read_task_file

SUITE = Path(__file__).resolve().parents[3] / "fixtures/miniwob"
SPLITS = ("train", "validation", "heldout")
FILES = {s: read_task_file(SUITE / f"{s}.jsonl") for s in SPLITS}
KEYS = json.loads((SUITE / LAYOUTS).read_text())


def test_no_validation_or_held_out_task_shows_a_layout_an_earlier_split_shows() -> None:
    assert set(KEYS) == {t.task_id for ts in FILES.values() for t in ts}, (
        f"{LAYOUTS} and the task files name different tasks"
    )
    earlier: dict[str, str] = {}
    for split, tasks in FILES.items():
        keys = {KEYS[t.task_id]: t.task_id for t in tasks}
        if split != "train":
            assert len(keys) == len(tasks), f"{split} repeats a layout"
            same = sorted(f"{keys[k]} = {earlier[k]}" for k in keys.keys() & earlier.keys())
            assert not same, f"{split} tasks equal earlier tasks by layout: {same[:5]}"
            assert len(tasks) >= 0.9 * 30 * len(TASKS), f"{split} has {len(tasks)} tasks"
        earlier |= keys
        first = SPLIT_SEEDS[split]  # the ranges are 100,000 seeds apart
        assert all(first <= t.config["seed"] < first + 100_000 for t in tasks), split
        assert all(t.split == split for t in tasks), split
    assert {t.config["subdomain"] for t in FILES["heldout"]} == set(TASKS)


browser = pytest.mark.browser


@pytest.fixture(scope="module")
def env() -> Iterator[object]:
    pytest.importorskip("miniwob", reason="needs the browser extra")
    from dart_ray.envs.miniwob.env import MiniWobEnv

    e = MiniWobEnv(EnvConfig(kind="miniwob"))
    yield e
    e.close()


@browser
def test_the_committed_layouts_are_the_pages_own(env: object) -> None:
    """One task of each page and split, rendered again: the key is the committed one."""
    sample = [
        next(t for t in FILES[split] if t.config["subdomain"] == sub)
        for split in SPLITS
        for sub in TASKS
    ]
    wrong = [t.task_id for t in sample if layout_key(env.reset(t)) != KEYS[t.task_id]]  # type: ignore[attr-defined]
    assert not wrong, f"layouts changed since {LAYOUTS} was written: {wrong}"


@browser
def test_a_held_out_split_skips_layouts_an_earlier_split_holds(env: object) -> None:
    from dart_ray.envs.miniwob.tasks import play_split

    train = play_split(env, "train", 3, ["click-dialog"])  # type: ignore[arg-type]
    # the held-out range, with seeds 0-2's layouts marked taken and the first held-out
    # seed's layout too: that seed is skipped as a repeat and a later one drawn
    first = make_task("click-dialog", SPLIT_SEEDS["heldout"])
    taken = frozenset(train.layouts.values()) | {layout_key(env.reset(first))}  # type: ignore[attr-defined]
    held = play_split(env, "heldout", 2, ["click-dialog"], taken)  # type: ignore[arg-type]
    assert held.repeats == [first.task_id]
    assert [t.config["seed"] - first.config["seed"] for t in held.tasks] == [1, 2]
    assert not set(held.layouts.values()) & taken
    # a split that runs out of new layouts within its tries gives fewer tasks and says so
    tried = [make_task("click-dialog", SPLIT_SEEDS["heldout"] + i) for i in range(2)]
    all_taken = frozenset(layout_key(env.reset(t)) for t in tried)  # type: ignore[attr-defined]
    short = play_split(env, "heldout", 1, ["click-dialog"], all_taken, tries=2)  # type: ignore[arg-type]
    assert (short.tasks, short.short) == ([], {"click-dialog": 0})
    assert short.repeats == [t.task_id for t in tried]
