"""Env nodes added and removed by Ray's autoscaler (marker `slow`, the cluster tier): a head
started from cluster/fake-multinode.yaml through Ray's fake multi-node provider, with no `env`
node up (the YAML's env type: min_workers 0), and `dart-ray train` pointed at it asking for
sessions that need `env` units nobody offers yet. The run must wait for the autoscaler
(`cluster.resource_wait_s`) rather than fail, the autoscaler must add an env node, the run
must finish (`FINISHED`, `dart-ray audit` clean), and once the run is over the idle env node
must be removed (the YAML's idle_timeout_minutes: 0.1).

It prints (and writes to $DART_RAY_AUTOSCALING_SUMMARY, if set) what docs/OPERATIONS.md
records: seconds from the train command to its first trajectory with no env node up, from the
run asking for nodes to the first env node alive, and from the run's sessions gone (the node
idle) to the node gone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.util.state import list_actors, list_nodes

from dart_ray.testing.raycluster import LocalCluster
from dart_ray.testing.runs import audit, report, run_log, sql, start_tiny_run, stop

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
YAML = REPO / "cluster" / "fake-multinode.yaml"
NS = "dart-autoscaling"
RUN = "autoscaling"
SESSIONS = 2
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """The head of the YAML, started as the YAML says (its head type's resources), its
    monitor running the autoscaler with the fake provider, which starts an env node as a
    raylet on this machine in the head's temp folder (so `stop()` ends it too)."""
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "RAY_ADDRESS": "",
        # the raylets' workers import this checkout, not what the venv installed
        "PYTHONPATH": str(REPO),
        "RAY_FAKE_CLUSTER": "1",  # the fake provider refuses to start without it
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",  # (default 5) as Ray's AutoscalingCluster does
    }
    c = LocalCluster(str(BIN / "ray"), env)
    try:
        cfg = yaml.safe_load(YAML.read_text())
        cfg["provider"]["gcs_address"] = c.address  # where the launched raylets join
        config = tmp_path / "cluster.yaml"
        config.write_text(json.dumps(cfg))  # JSON is YAML
        head = dict(cfg["available_node_types"][cfg["head_node_type"]]["resources"])
        c.start_head(
            num_cpus=head.pop("CPU"), resources=json.dumps(head), autoscaling_config=config
        )
        yield c
    finally:
        c.stop()


def _train(c: LocalCluster, tmp: Path) -> subprocess.Popen[bytes]:
    return start_tiny_run(
        c,
        tmp,
        RUN,
        NS,
        SESSIONS,
        "run.max_versions=3",
        "run.max_minutes=4",
        "cluster.resource_wait_s=120",
    )


def _log(tmp: Path) -> str:
    return run_log(tmp)


def _sql(tmp: Path, query: str) -> Any:
    return sql(tmp, query, r=RUN)


def _alive_nodes(c: LocalCluster) -> list[Any]:
    return list_nodes(
        address=c.dashboard, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False
    )


def _sessions_on(c: LocalCluster) -> dict[str, str]:
    """The run's live sessions -> the node each runs on."""
    actors = list_actors(
        address=c.dashboard, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False
    )
    return {a.name: a.node_id for a in actors if a.name and a.name.startswith(f"env-{RUN}-")}


def _wait(what: str, pred: Callable[[], Any], timeout_s: float, tmp: Path, every: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(every)
    raise AssertionError(f"no {what} in {timeout_s:.0f} s:\n{_log(tmp)}")


def test_env_nodes_come_when_the_run_asks_and_go_when_it_ends(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the cluster's processes run
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    [head] = _wait("head in the state API", lambda: _alive_nodes(cluster), 60, tmp_path, 1.0)
    assert "env" not in (head.resources_total or {}), head  # 0 env nodes up
    t_start = time.monotonic()
    proc = _train(cluster, tmp_path)
    try:
        marks: dict[str, float] = {}

        def watch() -> bool:
            """One poll of the run: when it said it waits, when an env node joined, when its
            first trajectory was logged."""
            now = time.monotonic()
            if "wait" not in marks and "for the autoscaler to add nodes" in _log(tmp_path):
                marks["wait"] = now
            if "up" not in marks and len(_alive_nodes(cluster)) > 1:
                marks["up"] = now
            if "first" not in marks and _sql(
                tmp_path, "SELECT COUNT(*) FROM rollout_run WHERE run_id = :r"
            ):
                marks["first"] = now
            if proc.poll() is not None and "first" not in marks:
                raise AssertionError(f"the run exited ({proc.returncode}):\n{_log(tmp_path)}")
            return {"wait", "up", "first"} <= marks.keys()

        _wait("env node and first trajectory", watch, 300, tmp_path, every=0.5)
        # the sessions run on the node the autoscaler added, nowhere else
        placed = _sessions_on(cluster)
        assert len(placed) == SESSIONS and head.node_id not in placed.values(), placed
        # until the run exits: when its sessions went (its stop kills them, then it reports),
        # from when the env node is idle
        deadline, t_gone = time.monotonic() + 300, None
        while proc.poll() is None and time.monotonic() < deadline:
            if t_gone is None and not _sessions_on(cluster):
                t_gone = time.monotonic()
            time.sleep(1.0)
        rc = proc.wait(timeout=10)
        t_end = time.monotonic()
        t_gone = t_gone or t_end
        assert rc == 0, _log(tmp_path)
        assert _sql(tmp_path, "SELECT status FROM run WHERE run_id = :r") == "FINISHED"
        peak = len(_alive_nodes(cluster))
        # the env node, idle now, is removed (idle_timeout_minutes: 0.1 = 6 s)
        _wait("scale-down", lambda: len(_alive_nodes(cluster)) == 1, 90, tmp_path, every=1.0)
        t_down = time.monotonic()
        audited = audit(cluster, tmp_path, RUN)
        assert audited.returncode == 0, audited.stdout + audited.stderr
        summary = {
            "train_to_wait_s": round(marks["wait"] - t_start, 1),
            "train_to_env_node_alive_s": round(marks["up"] - t_start, 1),
            "wait_to_env_node_alive_s": round(marks["up"] - marks["wait"], 1),
            "train_to_first_trajectory_s": round(marks["first"] - t_start, 1),
            "run_s": round(t_end - t_start, 1),
            "nodes_at_end": peak,
            "sessions_gone_to_scale_down_s": round(t_down - t_gone, 1),
            "run_end_to_scale_down_s": round(t_down - t_end, 1),
            "trajectories": _sql(tmp_path, "SELECT COUNT(*) FROM rollout_run WHERE run_id = :r"),
            "audit": audited.stdout.strip().splitlines()[:3],
        }
        report(summary, "DART_RAY_AUTOSCALING_SUMMARY")
    finally:
        stop(proc)
