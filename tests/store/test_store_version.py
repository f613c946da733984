"""A database written by another dart-ray version (a table missing columns this version
reads) is named in one line with the fix, before anything runs against it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.store.db import (
    StoreError,
    check_schema,
    create_engine,
    init_schema,
    metadata,
    rollout_run,
)

REPO = Path(__file__).resolve().parents[2]


def create_older_schema(engine: Engine) -> None:
    """Every table as this version has it, except `rollout_run` without two of its columns
    (what an earlier version's log looks like to this one)."""
    old = sa.MetaData()
    for t in metadata.sorted_tables:
        keep = [c for c in t.columns if t is not rollout_run or c.name not in ("state", "trace_id")]
        cols = (sa.Column(c.name, c.type, primary_key=c.primary_key) for c in keep)
        sa.Table(t.name, old, *cols)
    old.create_all(engine)


def test_a_log_from_another_version_is_named(db_url: str) -> None:
    engine = create_engine(db_url)
    create_older_schema(engine)
    with pytest.raises(StoreError) as e:
        init_schema(engine)  # creates what is missing, then checks what was there
    msg = str(e.value)
    assert "another dart-ray version" in msg and "rollout_run" in msg
    assert "state" in msg and "trace_id" in msg and "\n" not in msg


def test_the_current_schema_passes(engine: Engine) -> None:
    check_schema(engine)  # the fixture ran init_schema
    init_schema(engine)


def test_a_run_folder_from_another_version_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    create_older_schema(sa.create_engine(f"sqlite:///{root / 'dart-ray.sqlite'}"))
    p = subprocess.run(
        [sys.executable, "-m", "dart_ray.cli", "status", f"run.root_dir={root}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "another dart-ray version" in p.stderr and "run.root_dir" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
