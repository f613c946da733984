"""The `dart-ray` commands against a real SQLite log and a real MariaDB."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dart_ray.cli import main
from dart_ray.config import load_config
from dart_ray.records import Status
from dart_ray.store import open_store
from dart_ray.store.runs import register_run
from tests.conftest import mysql_database_url
from tests.factories import make_trajectory


def _populate(overrides: list[str]) -> None:
    cfg = load_config(None, overrides)
    store = open_store(cfg, init=True)
    register_run(store.engine, "run-a", "demo", cfg.redacted())
    items = [
        (
            make_trajectory(
                f"t{i}", task_id=f"task-{i % 2}", reward=float(i % 3 == 0), version=i % 3
            ),
            f"/b/{i}",
        )
        for i in range(12)
    ]
    items.append((make_trajectory("env", status=Status.ENV_ERROR, n_steps=0), "/b/env"))
    store.log.append_many(items)
    claim = store.log.claim("run-a", 5, consumer="test", lease_s=60)
    store.log.ack(claim, claim.row_ids[:3])
    store.log.drop(claim, claim.row_ids[3:4], "stale")
    cid = store.checkpoints.create("run-a", 1)
    store.checkpoints.start(cid)
    store.checkpoints.complete(cid, "/ckpt/v1")
    store.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def test_db_init_and_status(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = None
    overrides = [f"run.root_dir={tmp_path}"]
    if backend == "mysql":
        gen = mysql_database_url()
        overrides.append(f"store.dsn={next(gen)}")
    try:
        assert main(["db", "init", *overrides]) == 0
        assert main(["status", *overrides]) == 0
        assert "no record of any run" in capsys.readouterr().out
        _populate(overrides)
        assert main(["status", "--run", "run-a", *overrides]) == 0
        out = capsys.readouterr().out
        assert "run run-a (demo) RUNNING" in out
        assert "trajectories in the log" in out and "per-task success" in out
        # 13 rows: 5 claimed, 3 acked, 1 dropped -> consumed 3, claimed 1, dropped 1, available 8
        rows = [[c.strip() for c in line.split("│")] for line in out.splitlines()]
        assert next(r[2:6] for r in rows if r[1:2] == ["all"]) == ["8", "1", "3", "1"]
        assert "dropped by reason: stale 1" in out
        assert "newest checkpoint: v1 COMPLETED" in out
        assert main(["status", "--run", "nope", *overrides]) == 1
        # the learning figure and table, redrawn from the log (no report.json yet)
        assert main(["report", "run-a", *overrides]) == 0
        out = capsys.readouterr().out
        # 12 trainable rows over versions 0-2; reward 1 for t0, t3, t6, t9 (all version 0)
        rows = [[c.strip() for c in line.split("│")] for line in out.splitlines()]
        assert [r[1:4] for r in rows if r[1:2] and r[1].startswith("v")] == [
            ["v0-0", "4", "100.0%"],
            ["v1-1", "4", "0.0%"],
            ["v2-2", "4", "0.0%"],
        ]
        assert (tmp_path / "run-a" / "curve.png").stat().st_size > 0
        assert (tmp_path / "run-a" / "system.png").stat().st_size > 0
        assert main(["report", "nope", *overrides]) == 2
    finally:
        if gen is not None:
            for _ in gen:
                pass


@pytest.mark.parametrize(
    "args, expected",
    [
        (["status", "store.dsn=nonsense"], "store.dsn = 'nonsense': not a database URL"),
        (
            ["status", "store.dsn=mysql+pymysql://root@127.0.0.1:1/x", "store.retries=0"],
            "cannot reach the database server at 127.0.0.1:1",
        ),
        (["db", "init", "algo.eps_low=0"], "algo.eps_low = 0: Input should be greater than 0"),
        (
            ["status", "--config", "/nonexistent.toml"],
            "config file /nonexistent.toml does not exist",
        ),
        (
            ["train", "policy.model_path=/nonexistent-model"],
            "policy.model_path = /nonexistent-model: no model there (no config.json); build",
        ),
    ],
)
def test_errors_are_one_line_and_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "dart_ray.cli", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert expected in p.stderr
    assert "Traceback" not in p.stderr
    if "invalid configuration" not in p.stderr:
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_config_show_masks_and_documents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "show", "store.dsn=mysql+pymysql://dart@db/dart", "run.name=x"]) == 0
    out = capsys.readouterr().out
    assert '"name": "x"' in out and "mysql+pymysql://dart@db/dart" in out
    assert main(["config", "show", "--docs"]) == 0
    assert "Trajectories kept in flight" in capsys.readouterr().out


def test_model_init_writes_a_loadable_model(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from dart_ray.models.loading import PolicyProcessor, load_model

    out = tmp_path / "tiny"
    assert main(["model", "init", "--out", str(out), "--seed", "3"]) == 0
    assert "parameters, seed 3" in capsys.readouterr().out
    load_model(out)
    assert PolicyProcessor.from_dir(out).min_pixels == 100 * 28 * 28  # UI-TARS's budget
    # a second init does not overwrite silently
    assert main(["model", "init", "--out", str(out)]) == 2
    assert "already holds a model" in capsys.readouterr().err
    assert main(["model", "init", "--out", str(out), "--force", "--hidden-size", "50"]) == 2
    assert "even heads" in capsys.readouterr().err


def test_a_part_rejecting_the_config_inside_ray_is_one_line(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """A session that cannot be built (here: a desktop too small) fails inside a Ray actor;
    the command says why in one line, exit 2, no traceback."""
    import dart_ray.run.command as cli_train
    from dart_ray.cli import main
    from dart_ray.envs.base import EnvInputError

    class RayTaskError(Exception):  # the shape of ray.exceptions.RayTaskError
        def __init__(self, cause: BaseException) -> None:
            super().__init__(f"ray::Rollouter.run() ... {cause}")
            self.cause = cause

    def fail(config, out):  # type: ignore[no-untyped-def]
        raise RayTaskError(EnvInputError("a desktop needs at least 640x480 pixels"))

    monkeypatch.setattr(cli_train, "run_train", fail)
    assert main(["train", "env.kind=desktop"]) == 2
    err = capsys.readouterr().err
    assert err == "dart-ray train: a desktop needs at least 640x480 pixels\n"


def test_a_port_in_use_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run(
            [sys.executable, "-m", "dart_ray.cli", "train", f"policy.http_port={port}"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
    assert p.returncode == 2, p.stderr
    assert f"policy.http_port = {port}: 127.0.0.1:{port} is in use" in p.stderr
    assert f"policy.http_port={port + 1}" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was created


def test_known_raylet_notices_are_dropped_and_the_rest_printed(capsys) -> None:  # type: ignore[no-untyped-def]
    """What a healthy local run printed from the raylet (issue 20): the worker-pool notice
    (a fixed threshold of 4x min(cpus, num_cpus) workers, which fractional-CPU actors pass by
    design) and Serve's own shutdown. Anything else the raylet says still shows."""
    from ray._private import worker

    from dart_ray.cli import quiet_third_party

    original = worker.print_to_stdstream
    try:
        quiet_third_party()
        quiet_third_party()  # idempotent: wraps once
        lines = [
            "WARNING: 8 PYTHON worker processes have been started on node: abc with address: "
            "127.0.0.1, which is 4x the maximum expected startup concurrency (2).",
            "Task ServeController.listen_for_change failed. There are infinite retries "
            "remaining, so the task will be retried. Error: The actor is dead because it was "
            "killed by `ray.kill`.",
            "The node with node id: abc has been marked dead",
        ]
        worker.print_to_stdstream({"lines": lines, "pid": "raylet", "is_err": False}, False)
        out = capsys.readouterr().out
        assert "marked dead" in out
        assert "PYTHON worker processes" not in out and "ray.kill" not in out
    finally:
        worker.print_to_stdstream = original
