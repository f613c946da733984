"""The load benchmark at its test size (markers `slow`, `mysql`): 64 concurrent clients on the
policy server's HTTP route while weights are published, 8 writers and 4 claimers on a private
MariaDB. The benchmark exits 1 on any failed request or any row lost or doubled; the numbers
themselves are for docs/BENCHMARKS.md, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dart_ray.testing.mariadb import mariadb_available

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.bench,
    pytest.mark.mysql,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not mariadb_available(), reason="needs mariadbd to start a private server"),
]


def test_load_benchmark_loses_nothing_and_fails_no_request(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "load.py"),
            "--minutes",
            "0.5",
            "--rows",
            "4000",
            "--update-every",
            "10",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    result = json.loads(out.read_text())
    policy, log = result["policy"], result["log"]
    assert policy["requests"] > 0 and policy["errors"] == 0
    assert len(policy["versions_answered"]) >= 2  # clients saw the weights change under load
    assert log["ok"] and log["rows_consumed_once"] == log["rows_expected"] == 4000
    assert log["rows_with_several_acks"] == 0
