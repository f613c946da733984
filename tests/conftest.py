"""Shared fixtures: a fresh durable log on SQLite and on real MariaDB/MySQL (marker `mysql`).

The MySQL server comes from DART_RAY_TEST_MYSQL_DSN (a server URL without a database), else
from the DSN file scripts/start-mariadb.sh writes when it creates a test account, else the
local MariaDB on 127.0.0.1:3306 as root over loopback. Each test gets its own database, dropped afterwards. If the server does not
answer, the mysql tests fail rather than skip: deselect them with `-m "not mysql"`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.store.db import create_engine, init_schema
from dart_ray.store.log import DurableLog


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the session's local Ray get the `ray` marker: scripts/test-tiers.sh runs
    them one at a time (one Ray, one Serve HTTP port per host), the rest in parallel."""
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


def _mysql_server() -> str:
    if dsn := os.environ.get("DART_RAY_TEST_MYSQL_DSN"):
        return dsn
    # written by scripts/start-mariadb.sh when it had to create a test account
    f = (
        Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
        / "dart-ray"
        / "test-mysql-dsn"
    )
    if f.is_file():
        return f.read_text().strip()
    return "mysql+pymysql://root@127.0.0.1:3306"


MYSQL_SERVER = _mysql_server()


def mysql_database_url() -> Iterator[str]:
    """Create a uniquely named database, yield its URL, drop it afterwards."""
    name = f"dart_test_{uuid.uuid4().hex[:12]}"
    server = create_engine(MYSQL_SERVER)
    with server.begin() as c:
        c.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield f"{MYSQL_SERVER.rstrip('/')}/{name}"
    finally:
        with server.begin() as c:
            c.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        server.dispose()


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'log.sqlite'}"
    else:
        yield from mysql_database_url()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = create_engine(db_url, pool_size=10)
    init_schema(e)
    yield e
    e.dispose()


@pytest.fixture
def log(engine: Engine) -> DurableLog:
    return DurableLog(engine, success_threshold=1.0)


# --------------------------------------------------------------------------- policy (issue 4)

TINY_TEST_PIXELS = (4 * 28 * 28, 64 * 28 * 28)
"""min/max pixels of the test model: a 112x112 screenshot becomes 16 image tokens."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2.5-VL, built once per session (random weights, seed 0)."""
    from dart_ray.models.tiny import TinySpec, save_tiny_model

    spec = TinySpec(min_pixels=TINY_TEST_PIXELS[0], max_pixels=TINY_TEST_PIXELS[1])
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"), spec)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """One real local Ray for the whole test session (2 CPUs: actors and replicas take
    fractions; an `env` resource for environment sessions)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local",  # never a Ray already running here (a `ray start --head`)
            num_cpus=2,
            resources={"env": 8},
            include_dashboard=False,
            namespace="dart-ray-tests",
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
    yield
    if started:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
