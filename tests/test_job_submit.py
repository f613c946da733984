"""The Ray way of running it (marker `slow`): a real two-node Ray cluster on this machine (the
head, and a node that alone carries the `env` resource), `ray job submit --working-dir .` of
`dart-ray train`, followed to SUCCEEDED; our metrics read from the Prometheus endpoint while
the job runs; the run's rows in the log afterwards."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from dart_ray.store.db import create_engine
from dart_ray.testing.raycluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    # Opt-in for now: on the shared 2-core machine `ray job submit` sometimes waited minutes
    # for the job agent of a freshly started cluster ("No available agent"); it passed when it
    # got through (a run of 31 s wall, the job SUCCEEDED, the report printed). See the note of
    # the session that added it; run it with DART_RAY_CLUSTER_TESTS=1.
    pytest.mark.skipif(
        os.environ.get("DART_RAY_CLUSTER_TESTS") != "1",
        reason="two-node cluster test is opt-in: set DART_RAY_CLUSTER_TESTS=1",
    ),
]


def _ray(cluster: LocalCluster, *args: str, tries: int = 1) -> str:
    import subprocess

    for attempt in range(tries):
        p = subprocess.run(
            [str(BIN / "ray"), *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=cluster.env,
            timeout=600,
        )
        if p.returncode == 0:
            return p.stdout + p.stderr  # the CLI logs its verdicts to stderr
        if attempt + 1 < tries and "No available agent" in p.stderr:  # the job agent starts late
            time.sleep(5)
            continue
        break
    raise AssertionError(p.stdout + p.stderr)


def test_job_submit_to_a_two_node_cluster(tmp_path: Path) -> None:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "RAY_ADDRESS": ""}
    cluster = LocalCluster(str(BIN / "ray"), env)
    try:
        cluster.start_head(num_cpus=2)
        cluster.add_node(num_cpus=1, resources='{"env": 8}')
        cluster.wait_nodes(2)
        runtime_env = {
            "excludes": [".venv", ".venv-*", "runs", ".git", "benchmarks/results", "**/__pycache__"]
        }
        out = _ray(
            cluster,
            "job",
            "submit",
            "--no-wait",
            f"--address={cluster.dashboard}",
            "--working-dir",
            ".",
            "--runtime-env-json",
            json.dumps(runtime_env),
            "--submission-id",
            "dart-e2e",
            "--",
            "dart-ray",
            "train",
            f"run.root_dir={tmp_path}",
            "run.run_id=job-run",
            "run.max_versions=1",
            "run.eval_tasks=1",
            "run.max_minutes=8",
            "cluster.address=auto",
            "env.num_sessions=2",
            "rollout.in_flight=2",
            "policy.http_port=8140",
            "curation.drop_no_signal=false",
            tries=24,
        )
        assert "dart-e2e" in out
        seen_metrics = False
        deadline = time.monotonic() + 1500
        status = ""
        while time.monotonic() < deadline:
            status = _ray(cluster, "job", "status", f"--address={cluster.dashboard}", "dart-e2e")
            if not seen_metrics:
                try:
                    body = (
                        urllib.request.urlopen(
                            f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5
                        )
                        .read()
                        .decode()
                    )
                    seen_metrics = (
                        "dart_trajectories_total" in body and "dart_env_utilisation" in body
                    )
                except OSError:
                    pass
            if any(s in status.lower() for s in ("succeeded", "failed", "stopped")):
                break
            time.sleep(3)
        logs = _ray(cluster, "job", "logs", f"--address={cluster.dashboard}", "dart-e2e")
        (tmp_path / "job.log").write_text(logs)
        assert "succeeded" in status.lower(), status + logs[-3000:]
        assert "held-out success before -> after" in logs  # the final report
        assert seen_metrics, "our metrics never appeared on the head's metrics endpoint"
        engine = create_engine(f"sqlite:///{tmp_path / 'dart-ray.sqlite'}")
        with engine.connect() as c:
            n = c.scalar(sa.text("SELECT COUNT(*) FROM rollout_run WHERE run_id = 'job-run'"))
            v = c.scalar(
                sa.text(
                    "SELECT MAX(version_num) FROM checkpoint WHERE run_id = 'job-run' AND status = 'COMPLETED'"
                )
            )
        engine.dispose()
        assert n and n > 0 and v == 1
    finally:
        cluster.stop()
