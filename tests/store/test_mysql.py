"""What only a real MariaDB/MySQL server can show: SKIP LOCKED under a held transaction,
appends streaming through a server restart, and the error lines an operator sees."""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.config import load_config
from dart_ray.store import StoreError, open_store
from dart_ray.store.db import RetryPolicy, create_engine, init_schema, rollout_run
from dart_ray.store.log import DurableLog
from dart_ray.testing.mariadb import TemporaryMariaDB
from tests.conftest import MYSQL_SERVER, mysql_database_url
from tests.factories import make_trajectory
from tests.store.log_support import fill

pytestmark = pytest.mark.mysql


@pytest.fixture
def engine() -> Iterator[Engine]:
    for url in mysql_database_url():
        e = create_engine(url, pool_size=10)
        init_schema(e)
        yield e
        e.dispose()


@pytest.fixture
def mysql_log(engine: Engine) -> DurableLog:
    return DurableLog(engine)


@pytest.mark.parametrize("min_version", [None, 3])
def test_two_claimers_at_the_same_time_get_disjoint_full_batches(
    mysql_log: DurableLog, engine: Engine, min_version: int | None
) -> None:
    """Claimer A holds its transaction open with rows locked; B must still get a full batch.

    With an ORDER BY that does not follow the claim index, InnoDB would lock every scanned
    row and B would get nothing (or wait): this is the trap the index order avoids.
    """
    for v in range(3, 8):
        fill(mysql_log, 40, version=v, run_id=f"r{v}")  # other runs share the table
    fill(mysql_log, 200, version=3)
    with engine.connect() as a:
        tx = a.begin()
        held = a.execute(mysql_log.claim_query("run-a", 64, min_version)).all()
        assert len(held) == 64
        started = time.monotonic()
        b = mysql_log.claim("run-a", 64, consumer="b", lease_s=60, min_version=min_version)
        assert time.monotonic() - started < 5  # did not wait for A's locks
        assert len(b) == 64
        assert {r.id for r in held}.isdisjoint(b.row_ids)
        tx.rollback()


def test_claim_is_a_range_scan_from_min_version(mysql_log: DurableLog, engine: Engine) -> None:
    """At 40k rows over 20 versions MariaDB would pick `ref` on (run_id, state) and step over
    every older row; the claim must seek straight to min_version (`range`, key incl. version)
    and read only the rows it returns, in index order (no filesort)."""
    rows = [
        {
            "run_id": "run-a",
            "trajectory_id": f"t{i}",
            "task_id": f"task-{i % 40}",
            "uri": f"/blobs/run-a/task-{i % 40}/t{i}.parquet",
            "reward": float(i % 2),
            "num_steps": 5,
            "status": "OK",
            "version_num": i * 20 // 40_000,
            "instruction": "open the settings dialog and enable dark mode",
        }
        for i in range(40_000)
    ]
    with engine.begin() as c:
        for k in range(0, len(rows), 10_000):
            c.execute(rollout_run.insert(), rows[k : k + 10_000])
        c.execute(sa.text("ANALYZE TABLE rollout_run"))
    q = mysql_log.claim_query("run-a", 64, min_version=17)
    sql = str(q.compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as c:
        plan = c.execute(sa.text("EXPLAIN " + sql)).mappings().all()
        before = dict(c.execute(sa.text("SHOW SESSION STATUS LIKE 'Handler_%'")).all())
        got = c.execute(sa.text(sql)).all()
        after = dict(c.execute(sa.text("SHOW SESSION STATUS LIKE 'Handler_%'")).all())
    assert len(got) == 64 and min(r.version_num for r in got) == 17
    assert plan[0]["key"] == "ix_rollout_run_claim"
    assert plan[0]["type"] == "range"
    assert "filesort" not in (plan[0]["Extra"] or "")
    read = sum(
        int(after[k]) - int(before.get(k, 0))
        for k in ("Handler_read_next", "Handler_read_key", "Handler_icp_attempts")
        if k in after
    )
    assert read < 64 * 4  # proportional to the batch, not to the 34k older rows


def test_server_restart_during_appends_loses_nothing() -> None:
    with TemporaryMariaDB() as server:
        engine = create_engine(server.url + "/")
        with engine.begin() as c:
            c.execute(sa.text("CREATE DATABASE dart"))
        engine.dispose()
        engine = create_engine(server.url + "/dart", connect_timeout_s=2)
        init_schema(engine)
        log = DurableLog(engine, retry=RetryPolicy(retries=30, backoff_s=0.1, max_backoff_s=1.0))
        done: list[str] = []
        errors: list[BaseException] = []

        def appender() -> None:
            try:
                for i in range(300):
                    t = make_trajectory(f"t{i:04d}", task_id=f"task-{i % 5}", reward=float(i % 2))
                    log.append(t, f"/b/{i}")
                    done.append(t.trajectory_id)
                    time.sleep(0.005)
            except BaseException as e:  # surfaced below
                errors.append(e)

        th = threading.Thread(target=appender)
        th.start()
        while len(done) < 60:
            time.sleep(0.01)
        server.restart(signal.SIGKILL, down_s=1.0)  # a crash, not a clean shutdown
        while th.is_alive() and len(done) < 200:
            time.sleep(0.01)
        server.restart(signal.SIGTERM, down_s=0.5)
        th.join(timeout=240)
        assert not errors, errors
        assert len(done) == 300
        with engine.connect() as c:
            logged = set(c.scalars(sa.select(rollout_run.c.trajectory_id)))
        assert logged == set(done)
        stats = {s.task_id: s for s in log.task_stats("run-a")}
        assert sum(s.attempts for s in stats.values()) == 300  # no append counted twice
        assert sum(s.successes for s in stats.values()) == 150
        engine.dispose()


def _config(dsn: str, **env: str) -> object:
    return load_config(None, [f'store.dsn="{dsn}"', "store.retries=0", "store.connect_timeout_s=2"])


def test_unreachable_server_is_one_clear_line() -> None:
    with pytest.raises(StoreError) as e:
        open_store(_config("mysql+pymysql://root@127.0.0.1:1/dart"))  # type: ignore[arg-type]
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("cannot reach the database server at 127.0.0.1:1")


def test_wrong_password_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = create_engine(MYSQL_SERVER)
    user = f"dart_pw_{secrets.token_hex(4)}"
    good = secrets.token_urlsafe(16)  # made up for this test only, never a default
    with admin.begin() as c:
        c.execute(sa.text(f"CREATE USER '{user}'@'%' IDENTIFIED BY :pw"), {"pw": good})
    try:
        host = sa.engine.make_url(MYSQL_SERVER)
        dsn = f"mysql+pymysql://{user}@{host.host}:{host.port or 3306}/information_schema"
        monkeypatch.setenv("DART_RAY_DB_PASSWORD", good + "-wrong")
        with pytest.raises(StoreError) as e:
            open_store(_config(dsn))  # type: ignore[arg-type]
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("access denied")
        assert good not in msg  # the password never appears in the message
        monkeypatch.setenv("DART_RAY_DB_PASSWORD", good)
        open_store(_config(dsn)).dispose()  # type: ignore[arg-type]
    finally:
        with admin.begin() as c:
            c.execute(sa.text(f"DROP USER '{user}'@'%'"))
        admin.dispose()


def test_missing_database_is_named_and_db_init_creates_it() -> None:
    name = f"dart_new_{secrets.token_hex(4)}"
    dsn = f"{MYSQL_SERVER.rstrip('/')}/{name}"
    with pytest.raises(StoreError, match=f"database '{name}' does not exist"):
        open_store(_config(dsn))  # type: ignore[arg-type]
    store = open_store(_config(dsn), init=True)  # type: ignore[arg-type]
    try:
        assert store.log.append(make_trajectory("t"), "/b/t")
    finally:
        with store.engine.begin() as c:
            c.execute(sa.text(f"DROP DATABASE `{name}`"))
        store.dispose()
