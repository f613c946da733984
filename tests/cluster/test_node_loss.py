"""A worker node lost mid-run (marker `slow`, the cluster tier): a real three-node Ray cluster
on this machine (a head without the `env` resource, two worker raylets with `env` units each),
`dart-ray train` pointed at it, and the raylet of a worker that holds environment sessions
SIGKILLed while the run trains. The sessions it held must come back on the other worker, the
run must finish on its own, and `dart-ray audit` must find nothing lost and nothing trained
twice. The policy replica, the curator, the rollouter and the trainer stay on the head.

It prints (and writes to $DART_RAY_NODE_LOSS_SUMMARY, if set) what docs/OPERATIONS.md records:
seconds from the kill to the lost sessions being alive on the other node, and to their first
finished episode there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
import sqlalchemy as sa
from ray.util.state import list_actors

from dart_ray.store.db import create_engine
from dart_ray.testing.raycluster import LocalCluster
from dart_ray.testing.runs import audit, report, run_log, start_tiny_run, stop

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "dart-node-loss"
RUN = "node-loss"
SESSIONS = 2
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """Head: logical CPUs for the head's parts (8, so that Ray's hybrid scheduling keeps them
    on the driver's node, below half its CPUs) and no `env`; two workers with one CPU and room
    for every session each, so that either can take the other's sessions."""
    c = LocalCluster(str(BIN / "ray"), {"PATH": f"{BIN}:/usr/bin:/bin", "RAY_ADDRESS": ""})
    try:
        c.start_head(num_cpus=8)
        # one after the other: two raylets starting at once in one session folder race for
        # the same plasma socket name, and one of them aborts
        for n in (2, 3):
            c.add_node(num_cpus=1, resources=json.dumps({"env": SESSIONS}))
            c.wait_nodes(n)
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()


def _train(c: LocalCluster, tmp: Path) -> subprocess.Popen[bytes]:
    return start_tiny_run(c, tmp, RUN, NS, SESSIONS, "run.max_versions=6", "run.max_minutes=6")


def _log(tmp: Path) -> str:
    return run_log(tmp)


def _versions(tmp: Path) -> list[int]:
    engine = create_engine(f"sqlite:///{tmp / 'dart-ray.sqlite'}")
    try:
        with engine.connect() as conn:
            return list(
                conn.scalars(
                    sa.text(
                        "SELECT version_num FROM checkpoint WHERE run_id = :r "
                        "AND status = 'COMPLETED' ORDER BY id"
                    ),
                    {"r": RUN},
                )
            )
    except sa.exc.OperationalError:
        return []  # not created yet
    finally:
        engine.dispose()


def _run_status(tmp: Path) -> str:
    engine = create_engine(f"sqlite:///{tmp / 'dart-ray.sqlite'}")
    try:
        with engine.connect() as conn:
            return str(conn.scalar(sa.text("SELECT status FROM run WHERE run_id = :r"), {"r": RUN}))
    finally:
        engine.dispose()


def _wait(what: str, pred: Any, proc: subprocess.Popen[bytes], tmp: Path, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := pred():
            return got
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}:\n{_log(tmp)}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} in {timeout_s:.0f} s:\n{_log(tmp)}")


def _actors(c: LocalCluster) -> list[Any]:
    return list_actors(
        address=c.dashboard,
        filters=[("state", "=", "ALIVE")],
        limit=10_000,
        raise_on_missing_output=False,
    )


def _sessions_on(c: LocalCluster) -> dict[str, str]:
    """Live session name -> the node it runs on."""
    prefix = f"env-{RUN}-"
    return {a.name: a.node_id for a in _actors(c) if a.name and a.name.startswith(prefix)}


def _raylet_pid(metrics_port: int) -> int:
    """The raylet of the node started with this metrics port (each node has its own)."""
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = p.info["cmdline"] or []
        flags = (f"--metrics-export-port={metrics_port}", f"--metrics_export_port={metrics_port}")
        if p.info["name"] == "raylet" and any(f in cmd for f in flags):
            return int(p.pid)
    raise AssertionError(f"no raylet with metrics port {metrics_port}")


def _finished_episodes(name: str) -> int:
    """Episodes the (restarted) session finished since its process started: 0 while Ray
    still restarts it."""
    try:
        return int(ray.get(ray.get_actor(name, namespace=NS).stats.remote(), timeout=5).evaluations)
    except (ray.exceptions.RayError, ValueError):
        return 0


# with the fault tour (`make test-fault-schedule`): 2 minutes that CI's 40 do not hold
@pytest.mark.schedule
def test_worker_node_killed_mid_run(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # this process joins the cluster too (to ask the sessions how many episodes they ran), as
    # the cluster's processes do: without token authentication, not through $RAY_ADDRESS
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    t_start = time.monotonic()
    proc = _train(cluster, tmp_path)
    try:
        _wait(
            "first version", lambda: max(_versions(tmp_path), default=0) >= 1, proc, tmp_path, 240
        )
        ray.init(address=cluster.address, namespace=NS, log_to_driver=False)
        nodes = {n["MetricsExportPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        head = nodes[cluster.metrics_port]
        workers = {nodes[p]: p for p in cluster.metrics_ports[1:]}
        placed = _wait(
            "sessions alive",
            lambda: s if len(s := _sessions_on(cluster)) == SESSIONS else None,
            proc,
            tmp_path,
            60,
        )
        assert set(placed.values()) <= set(workers), f"a session on the head: {placed}"
        # the head's parts: where the run asked for them
        head_parts = ("Curator", "RunControl", "Rollouter", "RayTrainWorker", "ServeReplica:policy")
        elsewhere = [
            f"{a.class_name} on {a.node_id}"
            for a in _actors(cluster)
            if a.class_name.startswith(head_parts) and a.node_id != head
        ]
        assert not elsewhere, f"not on the head {head}: {elsewhere}"
        # the worker holding the most sessions loses its raylet
        victim = max(workers, key=lambda n: sum(v == n for v in placed.values()))
        survivor = next(n for n in workers if n != victim)
        lost = sorted(name for name, node in placed.items() if node == victim)
        before = max(_versions(tmp_path))
        os.kill(_raylet_pid(workers[victim]), signal.SIGKILL)
        t_kill = time.monotonic()

        def back() -> bool:
            now = _sessions_on(cluster)
            return all(now.get(name) == survivor for name in lost)

        _wait("lost sessions alive on the other node", back, proc, tmp_path, 180)
        t_alive = time.monotonic()
        _wait(
            "an episode from a replacement session",
            lambda: any(_finished_episodes(name) > 0 for name in lost),
            proc,
            tmp_path,
            180,
        )
        t_episode = time.monotonic()
        rc = proc.wait(timeout=300)
        assert rc == 0, _log(tmp_path)
        versions = _versions(tmp_path)
        assert max(versions) == 6 and max(versions) > before, versions
        assert versions == sorted(versions), versions
        assert _run_status(tmp_path) == "FINISHED"
        audited = audit(cluster, tmp_path, RUN)
        assert audited.returncode == 0, audited.stdout + audited.stderr
        summary = {
            "lost_sessions": lost,
            "version_at_kill": before,
            "kill_to_sessions_alive_s": round(t_alive - t_kill, 1),
            "kill_to_first_episode_s": round(t_episode - t_kill, 1),
            "run_s": round(time.monotonic() - t_start, 1),
            "versions": versions,
            "audit": audited.stdout.strip().splitlines()[:3],
        }
        report(summary, "DART_RAY_NODE_LOSS_SUMMARY")
    finally:
        stop(proc)
