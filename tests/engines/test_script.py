"""The script engine: written solutions played through the same episode code as a model."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from dart_ray.cli import main
from dart_ray.config import Config, ConfigError, EnvConfig, PolicyConfig, load_config
from dart_ray.engines.script import ScriptError, next_response, read_scripts
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.envs.minidesk.oracle import oracle_action
from dart_ray.uitars.prompts import Turn, build_messages

REPO = Path(__file__).resolve().parents[2]


def _scripts(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / "scripts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_step_comes_from_the_newest_response_in_the_prompt(tmp_path: Path) -> None:
    scripts = read_scripts(
        _scripts(
            tmp_path, [{"instruction": "make a folder", "actions": ["wait()", "type(content='x')"]}]
        )
    )
    turns = [Turn(b"png")]
    answers = []
    for _ in range(4):
        answer = next_response(scripts, build_messages("make a folder", turns, 1, 1))
        answers.append(answer.split("Action: ")[1])
        turns = [*turns[:-1], Turn(b"png", answer), Turn(b"png")]
    assert answers == [
        "wait()",
        "type(content='x')",
        "finished(content='')",
        "finished(content='')",
    ]


def test_an_instruction_with_spaces_around_it_finds_its_script(tmp_path: Path) -> None:
    """OSWorld's instructions may end in a space, which the prompt does not show: four of its
    tasks answered 'no script' (POLICY_ERROR) before."""
    scripts = read_scripts(_scripts(tmp_path, [{"instruction": "Do it. ", "actions": ["wait()"]}]))
    answer = next_response(scripts, build_messages("Do it. ", [Turn(b"png")]))
    assert answer.endswith("Action: wait()")


def test_an_unknown_task_and_a_bad_file_are_named(tmp_path: Path) -> None:
    scripts = read_scripts(_scripts(tmp_path, [{"instruction": "a", "actions": []}]))
    assert next_response(scripts, build_messages("a", [Turn(b"p")])).endswith(
        "finished(content='')"
    )
    with pytest.raises(ScriptError, match="no script for the task 'b'"):
        next_response(scripts, build_messages("b", [Turn(b"p")]))
    bad = _scripts(
        tmp_path, [{"instruction": "a", "actions": ["wait()"]}, {"instruction": "a", "actions": []}]
    )
    with pytest.raises(ScriptError, match=r"scripts.jsonl:2: a second, different script"):
        read_scripts(bad)
    with pytest.raises(ValueError, match="history_turns must be at least 1"):
        PolicyConfig(engine="script", history_turns=0)


def test_eval_with_the_solution_scores_1_and_with_an_empty_script_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dart-ray eval` with the script engine, through the same episodes as a model: the
    oracle's click written as a script solves each task, an empty script solves none."""
    _solved_and_empty(tmp_path, monkeypatch, [])


@pytest.mark.usefixtures("ray_local")
def test_eval_on_ray_plays_in_env_session_actors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dart-ray eval --ray`: the same, with the environments in EnvSession actors."""
    import ray

    from actors import env_host

    started: list[object] = []
    real = env_host.start_sessions

    def spy(*args: object, **kwargs: object) -> list[object]:
        started.extend(real(*args, **kwargs))  # type: ignore[arg-type]
        return started[-2:]

    monkeypatch.setattr("actors.env_host.start_sessions", spy)
    _solved_and_empty(tmp_path, monkeypatch, ["--ray", "env.num_sessions=2"])
    assert len(started) == 4  # two EnvSession actors for each of the two evaluations
    assert all(isinstance(s, ray.actor.ActorHandle) for s in started)
    time.sleep(1.0)  # the killed sessions leave the list
    alive = ray.util.list_named_actors(all_namespaces=True)  # the named actors still alive
    assert not [a for a in alive if a["name"].startswith("eval-")]  # none left over


def _solved_and_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str]) -> None:
    tasks = [make_task("click-button", 1, 3), make_task("click-button", 1, 11)]
    assert tasks[0].instruction != tasks[1].instruction
    solutions = []
    env = load_config(REPO / "configs" / "default.toml").env  # what `dart-ray eval` plays
    for task in tasks:
        desk = MiniDeskEnv(env)
        desk.reset(task)
        x, y = oracle_action(desk).point  # type: ignore[misc]
        click = f"click(start_box='({x:.0f},{y:.0f})')"
        solutions.append({"instruction": task.instruction, "actions": [click]})
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(asdict(t)) + "\n" for t in tasks))
    for name, rows, want in (
        ("solved", solutions, 1.0),
        ("empty", [{**s, "actions": []} for s in solutions], 0.0),
    ):
        (tmp_path / name).mkdir()
        scripts = _scripts(tmp_path / name, rows)
        out = tmp_path / f"{name}.json"
        argv = ["eval", "--checkpoint", str(scripts), "--suite", str(suite), "--json", str(out)]
        with monkeypatch.context() as m:
            m.chdir(REPO)  # where the command finds configs/default.toml, as a user runs it
            overrides = ["policy.engine='script'", f"run.root_dir={tmp_path}"]
            assert main([*argv, *extra, *overrides]) == 0
        summary = json.loads(out.read_text())
        assert summary["tasks"] == 2 and summary["success"] == want, summary


def test_a_run_refuses_the_script_engine() -> None:
    from dart_ray.run.runtime import start

    with pytest.raises(ConfigError, match="no weights to train"):
        start(Config(env=EnvConfig(), policy=PolicyConfig(engine="script")))
