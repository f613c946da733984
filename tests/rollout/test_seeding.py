"""Seeding the success-replay pool with written solutions (`curation.replay_seeds`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from dart_ray.config import load_config
from dart_ray.data.curator import CuratorCore
from dart_ray.engines.base import GenerateRequest, SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.envs.minidesk.oracle import oracle_action
from dart_ray.evaluation.local import LocalPolicy, LocalSession
from dart_ray.records import Trajectory
from dart_ray.rollout.episode import EpisodeSettings
from dart_ray.rollout.seeding import ReplaySeeder, ScriptedPolicy, in_frame, needs_seed
from dart_ray.store.blobs import BlobStore
from dart_ray.store.log import DurableLog
from dart_ray.uitars.geometry import CoordinateMap
from dart_ray.uitars.prompts import Turn, build_messages
from tests.data.curator_support import settings, write_group
from tests.factories import make_trajectory

REPO = Path(__file__).resolve().parents[2]


def test_a_solution_is_played_in_the_env_with_the_policys_own_tokens_and_log_probs(
    tiny_model_dir: Path,
) -> None:
    """Two tasks solved by the oracle's click written as a script, one with a wrong click,
    one without a script: the solved two are kept, each response is the script's text as
    the policy's tokens (the end token last) with the log-probs the policy gives them at
    the run's version, scored by the environment's evaluator; the wrong one is played and
    scores 0; the one without a script is not played. The screen (320 x 240) is not the
    model's frame: the forced click is written in the model's pixels, as a model would."""
    config = load_config(REPO / "configs" / "tiny-cpu.toml")
    tasks = [make_task("click-button", 1, s) for s in (3, 11, 5, 7)]
    scripts = {}
    for task in tasks[:2]:
        desk = MiniDeskEnv(config.env)
        desk.reset(task)
        x, y = oracle_action(desk).point  # type: ignore[misc]
        scripts[task.instruction] = [f"click(start_box='({x:.0f},{y:.0f})')"]
    scripts[tasks[2].instruction] = ["click(start_box='(1,1)')"]

    engine = HFEngine(tiny_model_dir)
    policy = LocalPolicy(engine, SamplingParams(temperature=1.0, max_new_tokens=8))
    kept: list[Trajectory] = []
    screen = MiniDeskEnv(config.env).reset(tasks[0]).screenshot
    prompt = GenerateRequest(tuple(build_messages("x", [Turn(screen)])))
    encoded = engine.prepare(prompt, SamplingParams()).encoded
    assert encoded is not None
    frame = CoordinateMap(320, 240, *encoded.model_sizes[-1])  # the engine's own resize
    assert (frame.model_width, frame.model_height) != (320, 240)

    def keep(t: Trajectory) -> bool:
        if t.reward < 1.0:
            return False
        kept.append(t)
        return True

    seeder = ReplaySeeder(
        ScriptedPolicy(policy, scripts),
        EpisodeSettings(max_steps=1, history_turns=5),  # a seed gets its script's length
        run_id="run-a",
        bound=4,
        last_success=lambda task_id: None,
        record=keep,
    )
    sessions = [LocalSession(config), LocalSession(config)]
    outcomes = asyncio.run(seeder.play(tasks, sessions, version=3))  # the 4th has no script
    assert [(o.task_id, o.reward, o.seeded) for o in outcomes] == [
        (tasks[0].task_id, 1.0, True),
        (tasks[1].task_id, 1.0, True),
        (tasks[2].task_id, 0.0, False),
    ]
    assert {t.task.task_id for t in kept} == {tasks[0].task_id, tasks[1].task_id}
    for t in kept:
        assert t.min_version == engine.version == 0  # the weights that scored it
        click = t.steps[0]
        assert click.response_text != scripts[t.task.instruction][0]  # in the model's frame
        action = click.response_text[click.response_text.rindex("Action:") :]
        assert action == in_frame(f"Action: {scripts[t.task.instruction][0]}", frame)
        assert click.response_ids[-1] == engine.processor.eos_id
        want = engine.forced_ids(click.response_text)
        assert tuple(click.response_ids) == want
        assert all(lp < 0 for lp in click.behaviour_logprobs)  # the policy's, not the script's
        assert len(click.entropy) == len(click.response_ids)

    # renewal: a task is due once its newest success has used half the bound
    seeder.last_success = lambda task_id: 3
    due = [asyncio.run(seeder.due(tasks[0], v)) for v in (5, 6)]
    assert due == [False, True] and not asyncio.run(seeder.due(tasks[3], 9))  # no script


def test_a_task_is_seeded_again_once_its_success_has_used_half_the_bound() -> None:
    # bound 4: a success of version 3 serves groups opened up to version 5 (lag 2), then
    # one opened at 6 could be curated past the bound (the versions its episodes take)
    assert [needs_seed(3, v, 4) for v in (3, 4, 5, 6, 9)] == [False, False, False, True, True]
    assert needs_seed(None, 0, 4)  # never succeeded
    assert [needs_seed(2, v, 0) for v in (2, 3)] == [False, True]  # on-policy: every version
    assert [needs_seed(0, v, 1) for v in (0, 1)] == [False, True]


def test_a_seed_is_replayed_into_an_all_fail_group_and_counts_as_no_attempt(
    log: DurableLog, tmp_path: Path
) -> None:
    """`record_seed` makes a solution its task's newest success without logging it: the
    task's attempts and successes are the policy's own, the curator never claims it, and
    an all-fail group of the task gets it as its replay until the policy's own success
    replaces it."""
    blobs = BlobStore(tmp_path / "blobs")
    seed = make_trajectory("run-a/seed/t", task_id="t", reward=1.0, version=0)
    with pytest.raises(ValueError, match="only a success seeds replay"):
        log.record_seed(make_trajectory("x", task_id="t", reward=0.0), "/b/x")
    log.record_seed(seed, blobs.write(seed))
    s = log.task_stat("run-a", "t")
    assert s is not None and (s.attempts, s.successes, s.last_success_trajectory_id) == (
        0,
        0,
        seed.trajectory_id,
    )
    write_group(log, blobs, "t", 0, [0.0, 0.0, 0.0, 0.0])
    core = CuratorCore(log, blobs, settings(groups_per_step=1))
    core.poll()
    step = core.take_step()
    assert step is not None and core.metrics.replays_by_task == {"t": 1}
    ids = pa.concat_arrays([b.column("trajectory_id") for b in step.shards]).to_pylist()
    assert seed.trajectory_id in ids
    s = log.task_stat("run-a", "t")
    assert s is not None and (s.attempts, s.successes) == (4, 0)  # the group's, not the seed's

    write_group(log, blobs, "t", 1, [1.0, 0.0, 0.0, 0.0])  # the policy's own success
    s = log.task_stat("run-a", "t")
    assert s is not None and s.last_success_trajectory_id == "t#1/0"
