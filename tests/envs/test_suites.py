"""Every shipped MiniDesk suite is held out by content: rendered through the env with the
config that uses it, no validation, held-out or ood task shows a first screen and instruction
that an earlier split shows (docs/LEARNING.md, "Suites")."""

from __future__ import annotations

from pathlib import Path

import pytest

from dart_ray.config import Config, ConfigError, EnvConfig, load_config
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.envs.minidesk.generate import TASKS_DIR, load_tasks, names_held_out_word, write_suite
from dart_ray.envs.suites import SPLITS, content_key, load_suite, split_path

ROOT = Path(__file__).resolve().parents[2]
MINIDESK_CONFIGS = sorted(
    p
    for p in (ROOT / "configs").glob("*.toml")
    if load_config(p, []).env.kind == "minidesk" and load_config(p, []).env.tasks is not None
)
"""The configs that name their own suite (the others play the built-in one, checked below)."""


def _keys(env: MiniDeskEnv, tasks: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {content_key(env, t): t.task_id for t in tasks}


def _assert_disjoint(env: MiniDeskEnv, splits: dict[str, list]) -> None:  # type: ignore[type-arg]
    """Each split shares no content with any earlier one, nor with itself."""
    earlier: dict[str, str] = {}
    for split in SPLITS:
        if split not in splits:
            continue
        keys = _keys(env, splits[split])
        assert len(keys) == len(splits[split]), f"{split} repeats a screen and instruction"
        same = sorted(f"{keys[k]} = {earlier[k]}" for k in keys.keys() & earlier.keys())
        assert not same, f"{split} tasks equal earlier tasks by content: {same[:5]}"
        earlier |= keys
        held_out_words = [t.task_id for t in splits[split] if names_held_out_word(t)]
        if split == "ood":
            assert len(held_out_words) == len(splits[split])
        else:
            assert not held_out_words, f"{split} names held-out words: {held_out_words[:5]}"


def _splits(cfg: Config) -> dict[str, list]:  # type: ignore[type-arg]
    out = {}
    for split in SPLITS:
        try:
            out[split] = load_suite(cfg, split)
        except ConfigError:  # a suite without that split
            continue
    return out


@pytest.mark.parametrize("path", MINIDESK_CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_suite_is_disjoint_by_content(path: Path) -> None:
    cfg = load_config(path, [])
    splits = _splits(cfg)
    assert {"train", "validation", "heldout"} <= splits.keys(), f"{path.name}: splits {splits}"
    _assert_disjoint(MiniDeskEnv(cfg.env), splits)


def test_the_builtin_suite_is_disjoint_by_content() -> None:
    """Under the options it was generated with (each task's own placement, 320x240)."""
    splits = {s: load_tasks(split=s) for s in ("train", "validation", "heldout")}
    _assert_disjoint(MiniDeskEnv(EnvConfig()), splits)


def test_every_minidesk_task_file_is_checked_by_a_config() -> None:
    """A suite no config names would escape the test above."""
    named = {
        Path(str(split_path(load_config(p, []), s))).resolve()
        for p in MINIDESK_CONFIGS
        for s in SPLITS
        if split_path(load_config(p, []), s) is not None
    }
    shipped = {
        p.resolve()
        for d in (ROOT / "fixtures").iterdir()
        for p in d.glob("*.jsonl")
        if '"env": "minidesk"' in p.read_text(encoding="utf-8")[:4000]
    }
    assert shipped and shipped <= named, sorted(str(p) for p in shipped - named)
    assert {p.name for p in TASKS_DIR.glob("*.jsonl")} == {
        "train.jsonl",
        "validation.jsonl",
        "heldout.jsonl",
    }


def test_the_generator_skips_a_task_equal_by_content_to_an_earlier_one(tmp_path: Path) -> None:
    """Without jitter a one-button screen is one of a few cells x labels: the generator must
    walk past repeats rather than write them, and says so when it runs out of seeds."""
    env = EnvConfig.model_validate(
        {"screen_width": 168, "screen_height": 112, "minidesk": {"placement": "grid"}}
    )
    n = write_suite(
        tmp_path,
        {"train": 40, "validation": 10, "heldout": 10},
        ["click-button"],
        [1],
        env,
    )
    assert n == {"train": 40, "validation": 10, "heldout": 10}
    splits = {s: load_tasks(tmp_path / f"{s}.jsonl", s) for s in n}
    _assert_disjoint(MiniDeskEnv(env), splits)
    # 8 cells x a few labels: 5,000 one-button screens cannot be distinct
    with pytest.raises(RuntimeError, match="scene space is too small"):
        write_suite(tmp_path / "small", {"train": 5000}, ["click-target"], [1], env)


def test_the_ood_split_names_only_held_out_words(tmp_path: Path) -> None:
    env = EnvConfig.model_validate(
        {
            "screen_width": 168,
            "screen_height": 112,
            "minidesk": {"placement": "grid", "jitter": 10, "wallpaper": "position"},
        }
    )
    n = write_suite(
        tmp_path,
        {"train": 30, "validation": 10, "heldout": 10, "ood": 10},
        ["click-target", "click-button"],
        [1],
        env,
    )
    # click-button's labels include no held-out word: its ood cell stays empty
    assert n["ood"] == 10
    splits = {s: load_tasks(tmp_path / f"{s}.jsonl", s) for s in n}
    assert {t.config["family"] for t in splits["ood"]} == {"click-target"}
    _assert_disjoint(MiniDeskEnv(env), splits)
