"""The MiniWoB++ oracle in real headless Chromium (marker `browser`): it solves every task of
the rung on seeds its development never saw (it was written against seeds 0-59), scored by
each task's own JavaScript reward; the committed task files hold each page's utterance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dart_ray.config import EnvConfig

pytest.importorskip("miniwob", reason="needs the browser extra")
from dart_ray.envs.miniwob.env import MiniWobEnv
from dart_ray.envs.miniwob.oracle import TASKS
from dart_ray.envs.miniwob.tasks import make_task, solve
from dart_ray.envs.taskfile import read_task_file

pytestmark = pytest.mark.browser
UNSEEN = range(900_000, 900_010)
HELDOUT = read_task_file(Path(__file__).resolve().parents[3] / "fixtures/miniwob/heldout.jsonl")


@pytest.fixture(scope="module")
def env() -> Iterator[MiniWobEnv]:
    e = MiniWobEnv(EnvConfig(kind="miniwob"))
    yield e
    e.close()


@pytest.mark.parametrize("sub", TASKS)
def test_oracle_solves_unseen_seeds(env: MiniWobEnv, sub: str) -> None:
    results = [solve(env, make_task(sub, seed)) for seed in UNSEEN]
    solved = [seed for seed, s in zip(UNSEEN, results, strict=True) if s.reward > 0]
    assert len(solved) >= 9, (sub, results)
    # each task takes its one to three actions and no more
    most = {"click-button-sequence": 2, "click-option": 2, "enter-text": 3}.get(sub, 1)
    assert max(steps for _, steps, _, _ in results) == most, (sub, results)
    assert all(s.utterance for s in results)  # the page's instruction
    # the committed task files carry each seed's own utterance as the instruction
    for t in [t for t in HELDOUT if t.config["subdomain"] == sub][:2]:
        assert env.reset(t).text == t.instruction, t.task_id


def test_oracle_finishes_what_a_policy_started(env: MiniWobEnv) -> None:
    """Closed loop: a wrong word in enter-text's field is selected and typed over."""
    from dart_ray.envs.miniwob.oracle import MiniWobOracle
    from dart_ray.records import Action, ActionKind

    task = make_task("enter-text", 900_100)
    oracle = MiniWobOracle("enter-text")
    obs = env.reset(task)
    click_field, _ = oracle.next_step(obs)
    obs = env.step(click_field).observation
    obs = env.step(Action(ActionKind.TYPE, text="wrong")).observation  # the policy's mistake
    kinds = []
    for _ in range(4):
        action, _ = oracle.next_step(obs)
        kinds.append(action.kind)
        result = env.step(action)
        if result.done:
            break
        obs = result.observation
    assert kinds == [ActionKind.HOTKEY, ActionKind.TYPE, ActionKind.CLICK]
    assert env.evaluate() > 0


def test_raw_reward_is_one_or_minus_one_whatever_the_time() -> None:
    """`env.miniwob.raw_reward`: the task's verdict without MiniWoB's 1 - elapsed/600 s on a
    success, so that a group of successes has equal rewards (GRPO standardises a group's
    rewards: it would otherwise train on the engine's latency)."""
    from dart_ray.config import MiniWobOptions
    from dart_ray.envs.miniwob.oracle import MiniWobOracle, Page, click

    e = MiniWobEnv(EnvConfig(kind="miniwob", miniwob=MiniWobOptions(raw_reward=True)))
    try:
        obs = e.reset(make_task("click-button", 900_200))
        r = e.step(MiniWobOracle("click-button").next_step(obs)[0])
        assert r.done and 0.99 < r.info["reward"] < 1.0  # MiniWoB's own, scaled by time
        assert e.evaluate() == 1.0
        for seed in range(900_201, 900_220):  # a page with a button besides the target
            page = Page.of(e.reset(make_task("click-button", seed)))
            buttons = [x for x in page.elements if x["tag"] == "button"]
            wrong = [x for x in buttons if x["text"] != page.target()]
            if wrong:
                break
        r = e.step(click(wrong[0], "the wrong button")[0])
        assert r.done and e.evaluate() == -1.0
    finally:
        e.close()
