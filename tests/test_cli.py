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

REPO = Path(__file__).resolve().parents[1]


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
        # 13 rows: 5 claimed, 3 acked, 1 dropped -> consumed 3, claimed 1, dropped 1, available 8
        assert (
            "log: 13 trajectories, versions 0-2: available 8, claimed 1, consumed 3, dropped 1"
        ) in out
        assert "dropped by reason: stale 1" in out
        # few tasks: each listed (task-0: t0, t2, ..., t10 -> 6 attempts, t0 and t6 succeed)
        assert "task-0         6          2    33.3%             1" in out
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
        # per family (task-0 and task-1 are family "task"): 13 rollouts, 3 trained -> 4.33
        assert ["task", "2", "13", "3", "0", "4.33"] in [r[1:7] for r in rows]
        assert ["all", "2", "13", "3", "0", "4.33"] in [r[1:7] for r in rows]
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
    # --docs shows the resolved values (file + overrides), the code default beside a change
    assert main(["config", "show", "--docs", "run.name=x", "policy.http_port=8123"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "run.name = 'x'  (default 'tiny-cpu')" in lines
    assert "policy.http_port = 8123  (default 8000)" in lines
    assert "run.seed = 0" in lines  # unchanged: no default beside it


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


def test_status_fits_a_screen_and_survives_a_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """300 tasks of two families: the summary is a screen (families, the 5 worst and 5 best
    tasks), `--tasks` lists all 300, and a task id is never cut (captured output is a pipe:
    a table fitted to 80 columns cut them to `minidesk/c...`, and printed 1,211 lines for the
    default run)."""
    overrides = [f"run.root_dir={tmp_path}"]
    cfg = load_config(None, overrides)
    store = open_store(cfg, init=True)
    register_run(store.engine, "run-b", "wide", cfg.redacted())
    items = []
    for k in range(300):
        fam = "click-target" if k < 200 else "menu-command"
        tid = f"minidesk/{fam}/t1/{k}"
        for i in range(2):  # task k succeeds k % 3 of its 2 attempts (at most 2)
            t = make_trajectory(f"{k}-{i}", run_id="run-b", task_id=tid, reward=float(i < k % 3))
            items.append((t, f"/b/{k}-{i}"))
    store.log.append_many(items)
    store.dispose()
    assert main(["status", "--run", "run-b", *overrides]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) < 30, out
    # k = 0..199: k % 3 is 0, 1, 2 for 67, 67, 66 tasks -> 0 + 67 + 132 = 199 of 400 successes;
    # k = 200..299: 33, 33, 34 tasks (200 % 3 = 2 first) -> 0 + 33 + 68 = 101 of 200
    assert "minidesk/click-target    200       400    49.8%" in out
    assert "minidesk/menu-command    100       200    50.5%" in out
    assert "worst 5 and best 5 of 300 tasks tried:" in out
    assert "minidesk/click-target/t1/0" in out  # worst: 0 of 2, id whole
    assert "minidesk/menu-command/t1/299" in out  # best: 2 of 2 (299 % 3 = 2), id whole
    assert main(["status", "--run", "run-b", "--tasks", *overrides]) == 0
    out = capsys.readouterr().out
    assert (
        sum(line.startswith("  minidesk/") and "/t1/" in line for line in out.splitlines()) == 300
    )


def test_report_refuses_an_evaluation_that_is_not_this_runs_greedy_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dart-ray report RUN --eval X.json` plotted any evaluation as the run's held-out point
    at the version its folder name gave. Now the checkpoint must be one of the run's and the
    evaluation greedy; otherwise it is refused with the reason."""
    import json

    overrides = [f"run.root_dir={tmp_path}"]
    _populate(overrides)  # run-a's checkpoint v1 lives at /ckpt/v1

    def ev(name: str, checkpoint: str, sampling: str = "greedy") -> str:
        f = tmp_path / f"{name}.json"
        summary = {"checkpoint": checkpoint, "tasks": 10, "success": 0.5, "sampling": sampling}
        f.write_text(json.dumps(summary))
        return str(f)

    other = ev("other", str(tmp_path / "other-run" / "checkpoints" / "v1"))
    assert main(["report", "run-a", *overrides, "--eval", other]) == 2
    assert "which is not a checkpoint of run run-a" in capsys.readouterr().err
    sampled = ev("sampled", "/ckpt/v1", "sampled (temperature 1, top-p 0.8)")
    assert main(["report", "run-a", *overrides, "--eval", sampled]) == 2
    assert "sampled (temperature 1, top-p 0.8) evaluation" in capsys.readouterr().err
    own = ev("own", "/ckpt/v1")
    assert main(["report", "run-a", *overrides, "--eval", own]) == 0
    assert "held out at v1: 50.0% (23.7%-76.3%, 10 tasks)" in capsys.readouterr().out


def test_the_versions_line_shows_count_and_rate_not_the_cap() -> None:
    """The versions bar read `195/10000`: run.max_versions is a cap, not a goal."""
    from rich.console import Console

    from dart_ray.run.command import make_progress

    console = Console(record=True, width=80, force_terminal=False)
    progress = make_progress(console)
    task = progress.add_task("versions", total=None)
    progress.update(task, completed=195)
    progress.tasks[0].start_time -= 480.0  # type: ignore[operator]  # 8 minutes in
    with progress:
        pass
    text = console.export_text()
    assert "versions" in text and "195 (24.4/min)" in text and "/10000" not in text


def test_progress_lines_reach_a_log_file_while_the_run_runs(tmp_path: Path) -> None:
    """`ray job logs` showed the progress only at the end: rich draws its bars on a
    non-terminal only when they stop. To a file, a plain line every `every_s`, flushed: the
    file holds it before the run ends."""
    from rich.console import Console

    from dart_ray.run.command import TrainProgress

    log_file = tmp_path / "job.log"
    with log_file.open("w") as f:
        progress = TrainProgress(Console(file=f, width=80), every_s=3600)
        with progress:
            progress.note("run r: policy server at http://127.0.0.1:8000/v1/chat/completions")
            progress.show({"trajectories": 5, "train steps": 1, "versions": 1})
            progress.show({"trajectories": 9, "train steps": 2, "versions": 2})  # within every_s
            lines = log_file.read_text().splitlines()  # read while the run still runs
            assert lines[0].endswith("/v1/chat/completions")
            assert len(lines) == 2 and "trajectories 5" in lines[1], lines
            assert "train steps 1" in lines[1] and "versions 1" in lines[1]
            progress._last = -1e9  # every_s has passed
            progress.show({"train steps": 3})  # trajectories keep their last count
            last = log_file.read_text().splitlines()[-1]
            assert "trajectories 9" in last and "train steps 3" in last


def test_overrides_may_follow_options() -> None:
    """`dart-ray report RUN --eval a.json key=value` refused its override ("unrecognized
    arguments"): argparse gives the trailing override list only the words before an option."""
    from dart_ray.cli import parse_args

    args = parse_args(["report", "r1", "--eval", "a.json", "run.root_dir=x", "--eval", "b.json"])
    assert (args.run, args.eval, args.overrides) == ("r1", ["a.json", "b.json"], ["run.root_dir=x"])
    args = parse_args(["train", "--config", "c.toml", "run.seed=3"])
    assert args.overrides == ["run.seed=3"]
    with pytest.raises(SystemExit):
        parse_args(["report", "r1", "--eval", "a.json", "--bogus"])
    with pytest.raises(SystemExit):
        parse_args(["report", "r1", "--eval", "a.json", "stray"])


def test_a_config_whose_token_variable_is_unset_fails_at_start_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45, point 7: a token the config names but the environment lacks fails `dart-ray
    train` at once (exit 2, before Ray starts), naming the key and the variable. Before,
    `read_secret` returned None and the requests went out without a token."""
    monkeypatch.delenv("DART_TEST_UNSET_TOKEN", raising=False)
    args = ["train", "-c", "configs/tiny-cpu.toml", f"run.root_dir={tmp_path}"]
    assert main([*args, "policy.auth_token_env=DART_TEST_UNSET_TOKEN"]) == 2
    err = capsys.readouterr().err
    assert "policy.auth_token_env names $DART_TEST_UNSET_TOKEN, which is not set" in err
    assert not (tmp_path / "dart-ray.sqlite").exists()  # nothing started
    desk = ["train", "-c", "configs/miniwob.toml", f"run.root_dir={tmp_path}", "env.kind=osworld"]
    desk += [
        'env.desktop.server_url="http://127.0.0.1:9"',
        "env.desktop.token_env=DART_TEST_UNSET_TOKEN",
    ]
    assert main(desk) == 2
    assert "env.desktop.token_env names $DART_TEST_UNSET_TOKEN" in capsys.readouterr().err


def test_the_osworld_env_refuses_to_start_without_the_token_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dart_ray.config import ConfigError, EnvConfig
    from dart_ray.envs.osworld.env import OSWorldEnv

    monkeypatch.delenv("DART_TEST_UNSET_TOKEN", raising=False)
    cfg = EnvConfig.model_validate(
        {
            "kind": "osworld",
            "desktop": {"server_url": "http://127.0.0.1:9", "token_env": "DART_TEST_UNSET_TOKEN"},
        }
    )
    with pytest.raises(ConfigError, match=r"env\.desktop\.token_env names \$DART_TEST_UNSET"):
        OSWorldEnv(cfg)


def test_status_of_a_home_path_expands_it_and_a_missing_log_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45, point 10: OPERATIONS.md's own `dart-ray status run.root_dir=~/dart-ray/runs`
    made a folder named `~` in the working directory and ended in a traceback (`no such
    table: run`). `~` is the home (as a shell reads it), and a log that is not there is one
    line naming where it looked; nothing is created."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    for cmd in (["status"], ["audit", "some-run"], ["report", "some-run"]):
        assert main([*cmd, "run.root_dir=~/dart-ray/runs"]) == 2
        err = capsys.readouterr().err
        assert f"no durable log at {home}/dart-ray/runs/dart-ray.sqlite" in err, err
        assert "Traceback" not in err
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []
    # a database file without dart-ray's tables is no log either
    (home / "runs").mkdir()
    (home / "runs" / "dart-ray.sqlite").write_bytes(b"")
    assert main(["status", "run.root_dir=~/runs"]) == 2
    assert "holds no dart-ray log" in capsys.readouterr().err
