"""Our evaluator against OSWorld's own (`desktop-env` in .venv-osworld) on the desktop suite:
for every task, both score the state after reset (0) and after the scripted solution (1)
the same, and both run an evaluator's `postconfig` before reading the state. Markers
`desktop` and `osworld`: needs Xvfb and the venv (`make osworld-venv`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from dart_ray.config.env import DesktopOptions
from dart_ray.envs.desktop.suite import demo, load_desktop_tasks
from dart_ray.envs.osworld.env import LocalDesktopEnv
from dart_ray.envs.osworld.official import OSWorldEvaluator
from dart_ray.records import Task
from tests.envs.desktop_demo import demo_actions
from tests.envs.desktops import CFG, desktop
from tests.envs.osworld.venv import VENV, has_venv

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.osworld,
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb (install-test-deps.sh)"),
    has_venv,
]


@pytest.fixture(scope="module")
def desk() -> Iterator[LocalDesktopEnv]:
    yield from desktop()


@pytest.fixture(scope="module")
def official(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OSWorldEvaluator]:
    ev = OSWorldEvaluator(VENV, tmp_path_factory.mktemp("osworld-cache"), timeout_s=120)
    yield ev
    ev.close()


def _both(desk: LocalDesktopEnv, official: OSWorldEvaluator, task: Task) -> tuple[float, float]:
    assert desk.client is not None
    theirs = official.evaluate(task, desk.client.base, desk.token, desk.last_action, (800, 600))
    return desk.evaluate(), theirs


@pytest.mark.parametrize("task", load_desktop_tasks(), ids=lambda t: t.task_id)
def test_ours_and_osworlds_agree_on_the_suite(
    desk: LocalDesktopEnv, official: OSWorldEvaluator, task: Task
) -> None:
    desk.reset(task)
    assert _both(desk, official, task) == (0.0, 0.0)  # nothing done yet
    assert desk.client is not None
    for a in demo_actions(demo(task.task_id), desk.client.accessibility):
        desk.step(a)
    assert _both(desk, official, task) == (1.0, 1.0)


def test_postconfig_runs_before_the_getters_in_both(
    desk: LocalDesktopEnv, official: OSWorldEvaluator
) -> None:
    # the postconfig writes the file the getter reads: without it both would score 0
    evaluator = {
        "postconfig": [
            {
                "type": "execute",
                "parameters": {"command": "printf done > ~/post.txt", "shell": True},
            }
        ],
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "cat ~/post.txt", "shell": True},
        "expected": {"type": "rule", "rules": {"expected": "done"}},
    }
    task = Task("postconfig", "nothing to do", "desktop", {"config": [], "evaluator": evaluator})
    desk.reset(task)
    assert desk.evaluate() == 1.0
    desk.reset(task)  # a fresh home: only OSWorld's postconfig can write the file now
    assert desk.client is not None
    assert official.evaluate(task, desk.client.base, desk.token, None) == 1.0


def test_env_scores_with_osworlds_evaluator_when_configured() -> None:
    cfg = CFG.model_copy(update={"desktop": DesktopOptions(evaluator="osworld", osworld_venv=VENV)})
    env = LocalDesktopEnv(cfg)
    try:
        task = next(t for t in load_desktop_tasks() if t.task_id == "term-mkdir")
        env.reset(task)
        assert env.evaluate() == 0.0
        assert env.client is not None
        for a in demo_actions(demo(task.task_id), env.client.accessibility):
            env.step(a)
        assert env.evaluate() == 1.0
        assert env._official is not None and env._official.proc is not None
    finally:
        env.close()
    assert env._official is None  # its worker went with the env


def test_with_osworlds_evaluator_the_set_up_is_osworlds_too() -> None:
    """Placeholders OSWorld's controller fills, a command that exits non-zero (OSWorld logs
    it and goes on; ours failed the task), and `until`: the set-up ran by OSWorld's
    SetupController on our desktop, and the state it left scored by OSWorld's evaluator."""
    cfg = CFG.model_copy(update={"desktop": DesktopOptions(evaluator="osworld", osworld_venv=VENV)})
    env = LocalDesktopEnv(cfg)
    steps = [
        {"type": "execute", "parameters": {"command": "false", "shell": True}},
        {
            "type": "execute",
            "parameters": {
                "command": "printf {SCREEN_WIDTH}x{SCREEN_HEIGHT_HALF} > ~/w.txt; cat ~/w.txt",
                "shell": True,
                "until": {"stdout": "800x300"},
            },
        },
    ]
    evaluator = {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "cat ~/w.txt", "shell": True},
        "expected": {"type": "rule", "rules": {"expected": "800x300"}},
    }
    task = Task("set-up", "nothing to do", "desktop", {"config": steps, "evaluator": evaluator})
    try:
        env.reset(task)
        assert env.evaluate() == 1.0
    finally:
        env.close()
