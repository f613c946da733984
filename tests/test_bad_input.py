"""Malformed configs and task files stop `dart-ray train` in one line, and the run keeps its data.

Every case fails before Ray starts or the durable log is opened: one line (or, for a config,
one line per bad key) on stderr that names the file, line or key, exit code 2, no traceback.
A resumed run whose command line is wrong keeps every row, claim and status it had.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dart_ray.cli import main
from dart_ray.config import load_config
from dart_ray.store import open_store
from dart_ray.store.runs import get_run, register_run
from tests.factories import make_trajectory

TASK = {"task_id": "t/1", "instruction": "Click OK.", "env": "minidesk", "config": {}}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_bad_config_files_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        ("syntax.toml", "[algo\neps_high = 0.2\n", "syntax.toml is not valid TOML: Expected ']'"),
        ("unknown.toml", "[rollout]\nin_flihgt = 4\n", "rollout.in_flihgt: unknown key"),
        (
            "type.toml",
            "[train]\nlr = 'fast'\n",
            "train.lr = 'fast': Input should be a valid number",
        ),
        ("section.toml", "algo = 3\n", "algo = 3: Input should be a valid dictionary"),
        ("host.toml", "[policy]\nhttp_host = '0.0.0.0'\n", "policy.http_host = '0.0.0.0' serves"),
    ]
    for name, text, message in cases:
        f = _write(tmp_path / name, text)
        assert main(["train", "--config", str(f), f"run.root_dir={tmp_path}"]) == 2, name
        err = capsys.readouterr().err
        assert message in err, err
        assert name in err or "invalid configuration" in err


def test_a_bad_task_file_stops_train_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = _write(tmp_path / "tasks.jsonl", json.dumps(TASK) + "\n" + '{"task_id": "t/2"}\n')
    runs = tmp_path / "runs"
    assert main(["train", f"env.tasks={tasks}", f"run.root_dir={runs}"]) == 2
    assert capsys.readouterr().err == f"dart-ray train: {tasks}:2: instruction: missing\n"
    assert not runs.exists()  # nothing was started or written


def test_a_resumed_run_keeps_its_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = [f"run.root_dir={tmp_path}"]
    cfg = load_config(None, [*root, "run.run_id=run-a"])
    store = open_store(cfg, init=True)
    register_run(store.engine, "run-a", "demo", cfg.model_dump(mode="json"))
    store.log.append_many(
        [(make_trajectory(f"t{i}", task_id=f"task-{i % 2}"), f"/b/{i}") for i in range(6)]
    )
    claim = store.log.claim("run-a", 2, consumer="trainer", lease_s=600)
    before = (
        store.log.buffer("run-a"),
        store.log.task_stats("run-a"),
        get_run(store.engine, "run-a"),
    )
    store.dispose()

    bad_tasks = _write(tmp_path / "bad.jsonl", "{\n")
    for args in (
        ["algo.eps_low=0"],
        ["no.such_key=1"],
        [f"env.tasks={bad_tasks}"],
        [f"env.tasks={tmp_path / 'absent.jsonl'}"],
    ):
        assert main(["train", "--resume", "run-a", *root, *args]) == 2, args
        assert capsys.readouterr().err.startswith("dart-ray train: ")

    store = open_store(cfg)
    try:
        after = (
            store.log.buffer("run-a"),
            store.log.task_stats("run-a"),
            get_run(store.engine, "run-a"),
        )
        assert after == before
        assert store.log.ack(claim) == 2  # the claim the trainer held is still its own
    finally:
        store.dispose()
