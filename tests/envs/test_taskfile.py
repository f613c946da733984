"""Task files are read strictly: the first bad line is named with its file, line and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dart_ray.envs.minidesk.generate import load_tasks
from dart_ray.envs.osworld.env import task_from_json
from dart_ray.envs.taskfile import MAX_ID_LEN, TaskFileError, read_task_file

GOOD = {"task_id": "t/1", "instruction": "Click OK.", "env": "minidesk", "config": {"seed": 1}}


def _file(tmp_path: Path, *lines: Any) -> Path:
    f = tmp_path / "tasks.jsonl"
    f.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return f


def test_a_good_file_reads_back_every_field(tmp_path: Path) -> None:
    f = _file(tmp_path, GOOD, "", {**GOOD, "task_id": "t/2", "split": "heldout"})
    a, b = load_tasks(f, "train")
    assert (a.task_id, a.instruction, a.env, a.config, a.split) == (
        "t/1",
        "Click OK.",
        "minidesk",
        {"seed": 1},
        "train",
    )
    assert (b.task_id, b.split) == ("t/2", "heldout")


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", ":2: not JSON"),
        ("[1, 2]", ":2: a task must be a JSON object, not list"),
        ({"instruction": "x", "env": "minidesk"}, ":2: task_id: missing"),
        ({**GOOD, "task_id": 7}, ":2: task_id: must be a JSON string, got 7"),
        ({**GOOD, "task_id": ""}, ":2: task_id: must be a non-empty string"),
        ({**GOOD, "task_id": "t/1 "}, ":2: task_id: must not start or end with whitespace"),
        (
            {**GOOD, "task_id": "x" * (MAX_ID_LEN + 1)},
            f":2: task_id: is {MAX_ID_LEN + 1} characters",
        ),
        ({**GOOD, "instruction": None}, ":2: instruction: must be a JSON string, got null"),
        ({**GOOD, "env": ""}, ":2: env: must be a non-empty string"),
        ({**GOOD, "config": "seed=1"}, ':2: config: must be a JSON object, got "seed=1"'),
        ({**GOOD, "id": "osworld-style"}, ":2: id: unknown field"),
        (GOOD, ":2: task_id: 't/1' is also on line 1"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, line: Any, message: str) -> None:
    f = _file(tmp_path, GOOD, line)
    with pytest.raises(TaskFileError) as e:
        load_tasks(f)
    assert f"{f}{message}" in str(e.value)


def test_missing_empty_and_undecodable_files(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="does not exist"):
        read_task_file(tmp_path / "absent.jsonl")
    with pytest.raises(TaskFileError, match="holds no task"):
        read_task_file(_file(tmp_path, ""))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"task_id": "caf\xe9"}\n')
    with pytest.raises(TaskFileError, match="cannot be read"):
        read_task_file(latin)


def test_sql_looking_and_unicode_ids_are_kept_verbatim(tmp_path: Path) -> None:
    nasty = "x'); DROP TABLE rollout_run; -- \\ \" `t` % _ \u00e9\u4e2d\U0001f600"
    [t] = load_tasks(_file(tmp_path, {**GOOD, "task_id": nasty, "instruction": nasty}))
    assert t.task_id == nasty and t.instruction == nasty


@pytest.mark.parametrize(
    "task, message",
    [
        ({"instruction": "x"}, "id: must be a non-empty string"),
        ({"id": "a", "instruction": 3}, "OSWorld task 'a': instruction: must be a string"),
        ({"id": "a", "instruction": "x", "config": {}}, "config: must be a list"),
        ({"id": "a", "instruction": "x", "evaluator": []}, "evaluator: must be an object"),
    ],
)
def test_osworld_tasks_name_the_field(task: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskFileError) as e:
        task_from_json(task)
    assert message in str(e.value)
