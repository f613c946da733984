"""A local run starts a Ray of its own, even beside a `ray start --head` on the same machine.

Ray's `ray.init()` without an address joins "the latest cluster started here" (the address
`ray start` writes to `<ray temp dir>/ray_current_cluster`) or `$RAY_ADDRESS`, and a join that
also sets `num_cpus` fails ("When connecting to an existing cluster, num_cpus and num_gpus must
not be provided"). Seen in the test harness, which keeps a head running: every local
`dart-ray train` and every test on a local Ray failed. Here a real head (the venv's `ray`,
its own temp folder through RAY_TMPDIR, so nothing of this machine's own Ray is touched) is
left where Ray finds it, and `start_ray` runs in a subprocess that could find it both ways.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dart_ray.testing.raycluster import LocalCluster

pytestmark = pytest.mark.ray  # starts Ray: run it under the lock, never beside another Ray

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, ray
from dart_ray.run import preflight
from dart_ray.config import load_config
preflight.start_ray(load_config(None, sys.argv[1:]))
res = ray.cluster_resources()
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "nodes": len(ray.nodes()),
                  "cpu": res.get("CPU"), "env": res.get("env")}))
ray.shutdown()
"""


def _start_ray(env: dict[str, str], *overrides: str) -> dict[str, object]:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *overrides],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_local_run_never_joins_a_head_it_was_not_pointed_at(tmp_path: Path) -> None:
    head = LocalCluster(str(BIN / "ray"), {"PATH": f"{BIN}:/usr/bin:/bin", "RAY_ADDRESS": ""})
    try:
        head.start_head(num_cpus=1)
        # Ray looks for `ray_current_cluster` in $RAY_TMPDIR/ray: the head writes it there
        # (a moment after its dashboard answers)
        current = head.tmp / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 60
        while not current.is_file() and time.monotonic() < deadline:
            time.sleep(0.5)
        head_port = f":{head.gcs_port}"  # Ray writes the host as it resolved it
        assert current.read_text().endswith(head_port)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RAY_TMPDIR": str(head.tmp),
            "RAY_ADDRESS": "",
            "RAY_AUTH_MODE": "disabled",
        }
        # found through `ray_current_cluster` (the harness's case), then through $RAY_ADDRESS
        for found in ({}, {"RAY_ADDRESS": head.address}):
            local = _start_ray(
                {**env, **found},
                "cluster.num_cpus=1",
                "cluster.dashboard_host=127.0.0.1",
                f"run.root_dir={tmp_path}",
            )
            # its own one-node Ray: another GCS, the `env` resource the head does not offer
            assert not str(local["gcs"]).endswith(head_port), found
            assert (local["nodes"], local["cpu"], local["env"]) == (1, 1.0, 10_000.0), found
        # pointed at the head, a run joins it; the local runs left it as it was (one node,
        # one CPU, no `env`)
        joined = _start_ray(env, "cluster.address=auto", f"run.root_dir={tmp_path}")
        assert str(joined["gcs"]).endswith(head_port)
        assert (joined["nodes"], joined["cpu"], joined["env"]) == (1, 1.0, None)
    finally:
        head.stop()
