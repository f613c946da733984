"""A tiny run on a `LocalCluster` as an operator starts it, and what the cluster tests read of
it: `dart-ray train` as a subprocess (the small pipeline config, parts that only the head can
hold, its output in `<root>/train.log`), the end of that log, a query of its SQLite log, and
`dart-ray audit`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dart_ray.store.db import create_engine
from dart_ray.testing.raycluster import LocalCluster, free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def start_tiny_run(
    c: LocalCluster, root: Path, run_id: str, namespace: str, sessions: int, *extra: str
) -> subprocess.Popen[bytes]:
    """`dart-ray train` of configs/tiny-cpu.toml on the cluster: every group trains (the
    pipeline is under test), a durable checkpoint each version, and the policy replica and
    trainer asking for 2 CPUs each, which only the head has (as GPUs keep them off env nodes
    on a real cluster). `extra` overrides go last."""
    cmd = [
        str(BIN / "dart-ray"), "train", "-c", str(REPO / "configs" / "tiny-cpu.toml"),
        f"run.root_dir={root}", f"run.run_id={run_id}", "run.eval_tasks=0",
        f"cluster.address={c.address}", f"cluster.namespace={namespace}",
        f"env.num_sessions={sessions}", f"rollout.in_flight={sessions}",
        "rollout.max_steps=2", "policy.max_new_tokens=24", "curation.groups_per_step=1",
        "curation.drop_no_signal=false", "train.save_every=1",
        "policy.num_cpus=2", "train.cpus_per_worker=2", f"policy.http_port={free_port()}",
        *extra,
    ]  # fmt: skip
    log = open(root / "train.log", "ab")  # noqa: SIM115 (the process owns it)
    env = {**c.env, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_log(root: Path) -> str:
    """The end of the run's output (empty before it wrote any)."""
    f = root / "train.log"
    return f.read_text(errors="replace")[-5000:] if f.exists() else ""


def sql(root: Path, query: str, **params: Any) -> Any:
    """The first column of the first row of `query` on the run's SQLite log (None while the
    log is not there yet)."""
    engine = create_engine(f"sqlite:///{root / 'dart-ray.sqlite'}")
    try:
        with engine.connect() as conn:
            return conn.scalar(sa.text(query), params)
    except sa.exc.OperationalError:
        return None
    finally:
        engine.dispose()


def audit(c: LocalCluster, root: Path, run_id: str) -> subprocess.CompletedProcess[str]:
    """`dart-ray audit RUN` on the run's log."""
    return subprocess.run(
        [str(BIN / "dart-ray"), "audit", run_id, f"run.root_dir={root}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**c.env, "PYTHONPATH": str(REPO)},
        timeout=120,
    )


def report(summary: dict[str, Any], env_var: str) -> None:
    """Print a test's measurements as JSON, and write them to the file `$env_var` names (the
    docs quote those files)."""
    text = json.dumps(summary, indent=1)
    print(text)
    if out := os.environ.get(env_var):
        Path(out).write_text(text)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the run's process if it is still running (a test's `finally`)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
