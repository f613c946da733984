"""Operator mistakes on a real Ray cluster get a clear answer at once (issue 31; marker `slow`).

One head started with `ray start --head` on loopback ports of its own (2 CPUs, one `env`
unit, as cluster/node-resources.sh offers on a 2-core node), Ray's token authentication on,
no autoscaler; `dart-ray train`
pointed at it as a subprocess, as an operator runs it. Seen before the fixes:
- 4 sessions on 1 unit: 3 stayed pending for minutes, nothing in the log;
- no node offering `env.resource`: 120 s "waiting for the autoscaler" on a cluster with none;
- `ray job stop` (SIGTERM): the run stayed RUNNING, no report, the Serve application up;
  and a head with Ray's token authentication refused OPERATIONS.md's `ray job submit`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from dart_ray.store.db import create_engine
from dart_ray.testing.raycluster import LocalCluster, free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def head() -> Iterator[LocalCluster]:
    # PYTHONPATH: the raylet's workers import this checkout, not what the venv installed
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "RAY_ADDRESS": "", "PYTHONPATH": str(REPO)}
    cluster = LocalCluster(str(BIN / "ray"), env, auth=True)  # as SECURITY.md asks
    try:
        cluster.start_head(num_cpus=2, resources='{"env": 1}')
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _head_is_up(head: LocalCluster) -> None:
    """Every test starts on a live head: a head found dead (in CI, 2026-12-07, its raylet was
    gone and all four tests failed on it, one after another) is started again on fresh ports,
    with a warning that carries its logs, so one lost head costs no test but the one that
    lost it."""
    if not head.head_is_up():
        warnings.warn(
            f"the module's Ray head was down; starting it again:\n{head.logs()}", stacklevel=2
        )
        head.restart_head()


def _train(head: LocalCluster, root: Path, *overrides: str) -> list[str]:
    return [
        str(BIN / "dart-ray"),
        "train",
        "-c",
        "configs/tiny-cpu.toml",
        f"cluster.address={head.address}",
        f"run.root_dir={root}",
        f"policy.http_port={free_port()}",
        *overrides,
    ]


def _env(head: LocalCluster) -> dict[str, str]:
    return {**head.env, "PYTHONPATH": str(REPO)}


def _status(root: Path, run_id: str) -> str | None:
    engine = create_engine(f"sqlite:///{root / 'dart-ray.sqlite'}")
    try:
        with engine.connect() as c:
            return c.scalar(sa.text("SELECT status FROM run WHERE run_id = :r"), {"r": run_id})
    finally:
        engine.dispose()


def test_too_few_env_units_and_no_env_resource_fail_at_once(
    head: LocalCluster, tmp_path: Path
) -> None:
    cases = {
        # 4 sessions ask for 4 units; the head offers 1
        "short": (
            ["env.num_sessions=4"],
            ["need 4 units", "offers 1: lower env.num_sessions to 1"],
        ),
        # no node offers `desktop`: before, 120 s "waiting for the autoscaler" first
        "none": (
            ["env.resource=desktop"],
            ["no node of the Ray cluster offers the resource 'desktop'"],
        ),
    }
    for run_id, (overrides, expected) in cases.items():
        t0 = time.monotonic()
        p = subprocess.run(
            _train(head, tmp_path, f"run.run_id={run_id}", *overrides),
            capture_output=True,
            text=True,
            cwd=REPO,
            env=_env(head),
            timeout=300,
        )
        took = time.monotonic() - t0
        assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-3000:]
        [line] = [ln for ln in p.stderr.splitlines() if ln.startswith("dart-ray train:")]
        for text in [*expected, "this cluster has no autoscaler", "failing now rather than"]:
            assert text in line, line
        # connecting and starting Python take ~10-20 s here; the wait alone was 120 s
        assert took < 90, f"{run_id}: {took:.0f} s"
        assert _status(tmp_path, run_id) == "FAILED"


OTHER_APP = """
import sys, ray
from ray import serve

@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0.05})
class Other:
    def __call__(self, request) -> str:
        return "other"

ray.init(address=sys.argv[1], log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[2])})
serve.run(Other.bind(), name="other-app", route_prefix="/other")
"""


def _job(head: LocalCluster, *args: str) -> str:
    """`ray job ...` against the head's job API, with the head's token (the environment
    OPERATIONS.md says a client needs: RAY_AUTH_MODE=token and the token)."""
    p = subprocess.run(
        [str(BIN / "ray"), "job", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(head),
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


def test_ray_job_stop_stops_the_run_cleanly_and_leaves_other_apps_alone(
    head: LocalCluster, tmp_path: Path
) -> None:
    """`ray job submit` as OPERATIONS.md writes it (its runtime env, `--working-dir .`, a head
    with Ray's token authentication), then `ray job stop` mid-run (issue 45, point 7): Ray
    sends SIGTERM and, with the runtime env's RAY_JOB_STOP_WAIT_TIME_S, waits for the driver.
    The run must end STOPPED in the log, with its report, and leave no Serve application or
    actor of its own on the cluster, while another application on the same Serve stays. It
    runs with the one session the cluster offers (env.fit_to_cluster), said in one line."""
    run_id, port = "stopped", free_port()
    p = subprocess.run(
        [sys.executable, "-c", OTHER_APP, head.address, str(port)],
        capture_output=True, text=True, env=_env(head), timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = _job(
        head, "submit", "--no-wait", f"--address={head.dashboard}",
        "--runtime-env", "cluster/jobs/runtime-env.yaml", "--working-dir", ".",
        "--submission-id", "stop-me", "--",
        "dart-ray", "train", "-c", "configs/tiny-cpu.toml", "cluster.address=auto",
        f"run.root_dir={tmp_path}", f"run.run_id={run_id}", f"policy.http_port={port}",
        "env.num_sessions=2", "env.fit_to_cluster=true", "rollout.in_flight=2",
        "run.eval_tasks=1", "run.max_versions=1000", "run.max_minutes=10",
    )  # fmt: skip
    assert "stop-me" in out
    deadline = time.monotonic() + 500
    while time.monotonic() < deadline:  # mid-run: the first trajectory is in the log
        if (tmp_path / "dart-ray.sqlite").is_file() and _trajectories(tmp_path, run_id):
            break
        status = _job_state(head, "stop-me")
        assert status in ("RUNNING", "PENDING"), status
        time.sleep(3)
    _job(head, "stop", f"--address={head.dashboard}", "stop-me")
    while time.monotonic() < deadline + 300:
        status = _job_state(head, "stop-me")
        if status in ("STOPPED", "SUCCEEDED", "FAILED"):
            break
        time.sleep(2)
    logs = _job(head, "logs", f"--address={head.dashboard}", "stop-me")
    assert status == "STOPPED", status + logs[-3000:]
    fitted = "the cluster offers 1 units of 'env', so the run starts 1 of env.num_sessions = 2"
    assert fitted in logs
    assert "SIGTERM: stopping the run" in logs
    assert _status(tmp_path, run_id) == "STOPPED"
    run_dir = tmp_path / run_id
    assert (run_dir / "report.json").is_file()
    assert f"outputs in {run_dir}: report.json, curve.png, system.png, tb/" in logs
    assert _left_on_cluster(head, run_id) == {"apps": [], "actors": []}
    assert _left_on_cluster(head, "other-app")["apps"] == ["other-app"]


def _job_state(head: LocalCluster, submission_id: str) -> str:
    """The job's state from `ray job status`, which words it by state ("Status for job 'x':
    RUNNING", "Job 'x' was stopped" in Ray 2.60): a test that looked for "STOPPED" waited
    out its deadline (13 min) on a job that had stopped cleanly."""
    out = _job(head, "status", f"--address={head.dashboard}", submission_id)
    states = ("PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED")
    key = f"job '{submission_id}'"  # "Status for job 'x': RUNNING", "Job 'x' failed"
    line = next((ln for ln in out.splitlines() if key in ln.lower()), "")
    found = [s for s in states if re.search(rf"\b{s}\b", line, re.IGNORECASE)]
    assert len(found) == 1, f"no job state in `ray job status`: {out}"
    return found[0]


def _trajectories(root: Path, run_id: str) -> int:
    engine = create_engine(f"sqlite:///{root / 'dart-ray.sqlite'}")
    try:
        with engine.connect() as c:
            q = "SELECT COUNT(*) FROM rollout_run WHERE run_id = :r"
            return int(c.scalar(sa.text(q), {"r": run_id}) or 0)
    except sa.exc.OperationalError:  # the table is not there yet
        return 0
    finally:
        engine.dispose()


PROBE = """
import json, sys, ray
from ray import serve
from ray.util.state import list_actors
ray.init(address=sys.argv[1], log_to_driver=False)
run_id = sys.argv[2]
apps = [a for a in serve.status().applications if run_id in a]
actors = [a.name for a in list_actors(filters=[("state", "=", "ALIVE")]) if run_id in (a.name or "")]
print(json.dumps({"apps": apps, "actors": actors}))
"""


def _left_on_cluster(head: LocalCluster, run_id: str) -> dict[str, list[str]]:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, head.address, run_id],
        capture_output=True,
        text=True,
        env=_env(head),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


HAS_AUTOSCALER = """
from dart_ray.run.capacity import has_autoscaler
import ray, sys
ray.init(address=sys.argv[1], log_to_driver=False)
print(has_autoscaler(timeout_s=30))
"""

FAKE_CLUSTER = {
    "cluster_name": "fake",
    "max_workers": 2,
    "upscaling_speed": 1.0,
    "idle_timeout_minutes": 1,
    "provider": {"type": "fake_multinode", "disable_launch_config_check": True},
    "auth": {"ssh_user": "ray"},
    "available_node_types": {
        "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
        "env": {
            "resources": {"CPU": 1, "env": 2},
            "node_config": {},
            "min_workers": 0,
            "max_workers": 2,
        },
    },
    "head_node_type": "ray.head.default",
    # the autoscaler reads every one of these (a KeyError on the first missing)
    **{k: {} for k in ("docker", "file_mounts")},
    **{
        k: []
        for k in (
            "cluster_synced_files",
            "rsync_exclude",
            "rsync_filter",
            "initialization_commands",
            "setup_commands",
            "head_setup_commands",
            "worker_setup_commands",
            "head_start_ray_commands",
            "worker_start_ray_commands",
        )
    },
    "file_mounts_sync_continuously": False,
}


def test_an_autoscaler_is_told_from_a_plain_head(head: LocalCluster, tmp_path: Path) -> None:
    """A `ray start --head` (read-only provider) has none; a head started with a cluster YAML
    (Ray's fake_multinode provider, which would launch raylets here) has one, so a run there
    keeps waiting for nodes."""

    def probe(cluster: LocalCluster) -> str:
        p = subprocess.run(
            [sys.executable, "-c", HAS_AUTOSCALER, cluster.address],
            capture_output=True,
            text=True,
            env=_env(cluster),
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        return p.stdout.strip().splitlines()[-1]

    assert probe(head) == "False"
    config = tmp_path / "fake.yaml"
    config.write_text(json.dumps(FAKE_CLUSTER))  # JSON is YAML
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "RAY_ADDRESS": "", "PYTHONPATH": str(REPO)}
    env["RAY_FAKE_CLUSTER"] = "1"
    scaled = LocalCluster(str(BIN / "ray"), {**env, "AUTOSCALER_UPDATE_INTERVAL_S": "1"})
    try:
        scaled.start_head(num_cpus=1, autoscaling_config=config)
        assert probe(scaled) == "True"
    finally:
        scaled.stop()
    assert os.environ.get("RAY_FAKE_CLUSTER") is None  # nothing leaked into this process


def test_a_run_that_fails_to_start_is_failed_in_the_log_never_running(
    head: LocalCluster, tmp_path: Path
) -> None:
    """Two failures past the pre-start checks, each as an operator meets it:
    - a local run beside this head, where Ray would find it (`ray_current_cluster` under
      $RAY_TMPDIR, and $RAY_ADDRESS): it used to join the head and crash ("When connecting to
      an existing cluster, num_cpus and num_gpus must not be provided"), leaving a RUNNING
      run; it starts a Ray of its own, here one whose 1 CPU the parts do not fit;
    - a cluster run whose model folder is not on the nodes: the policy replicas fail in
      Serve, and the run stayed RUNNING in the log."""
    local = {**_env(head), "RAY_TMPDIR": str(head.tmp), "RAY_ADDRESS": head.address}
    argv = [a for a in _train(head, tmp_path, "run.run_id=local") if "cluster.address" not in a]
    p = subprocess.run(
        [*argv, "cluster.num_cpus=1", "cluster.dashboard_host=127.0.0.1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=local,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert "num_cpus and num_gpus must not be provided" not in p.stderr
    assert "the Ray cluster has 1: lower env.num_cpus" in p.stderr  # its own 1-CPU Ray
    assert _status(tmp_path, "local") == "FAILED"

    p = subprocess.run(
        _train(head, tmp_path, "run.run_id=nomodel", f"policy.model_path={tmp_path / 'none'}"),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(head),
        timeout=400,
    )
    assert p.returncode != 0, p.stdout[-2000:]
    assert _status(tmp_path, "nomodel") == "FAILED"
