"""Tables of the durable log (SQLAlchemy Core), the engine, and retries on transient errors.

One schema serves MySQL 8, MariaDB 10.11 and SQLite. `sql/schema.sql` is the same schema as
DDL for database administrators; a test keeps the two identical.

MySQL/MariaDB run at READ COMMITTED so that a claim's `FOR UPDATE SKIP LOCKED` locks only the
rows it returns. SQLite runs in WAL mode with `BEGIN IMMEDIATE` for every transaction: one
writer at a time, which is how the embedded default serialises claims.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from dart_ray.config.masking import mask_text

log = logging.getLogger(__name__)

metadata = sa.MetaData()

# Identifiers compare byte-wise on MySQL/MariaDB (task "A" is not task "a"); free text uses a
# collation both servers have (utf8mb4_0900_ai_ci is MySQL-only).
_BIN = "utf8mb4_bin"


def _ident(length: int = 191) -> sa.String:
    return sa.String(length).with_variant(sa.String(length, collation=_BIN), "mysql", "mariadb")


_MYSQL_TABLE = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_unicode_ci",
}


class _now6(FunctionElement[sa.DateTime]):
    """CURRENT_TIMESTAMP with microseconds where the column has them (MySQL needs them equal)."""

    type = sa.DateTime()
    inherit_cache = True


@compiles(_now6)
def _now6_default(element, compiler, **kw) -> str:  # type: ignore[no-untyped-def]
    return "CURRENT_TIMESTAMP"


@compiles(_now6, "mysql")
@compiles(_now6, "mariadb")
def _now6_mysql(element, compiler, **kw) -> str:  # type: ignore[no-untyped-def]
    return "CURRENT_TIMESTAMP(6)"


_NOW = _now6()
_TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrement needs INTEGER


class RowState:
    """`rollout_run.state`: where a row is in its life. Integers, so the claim index is small."""

    AVAILABLE = 0
    CLAIMED = 1
    CONSUMED = 2
    DROPPED = 3
    QUARANTINED = 4
    """Bad data: a row whose blob cannot be read, or whose group's curation raised. Settled
    with its reason (in `drop_reason`), never trained, counted apart from planned drops."""
    NAMES: ClassVar[dict[int, str]] = {
        0: "available",
        1: "claimed",
        2: "consumed",
        3: "dropped",
        4: "quarantined",
    }


rollout_run = sa.Table(
    "rollout_run",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("run_id", _ident(), nullable=False),
    sa.Column("trajectory_id", _ident(), nullable=False),
    sa.Column("task_id", _ident(), nullable=False),
    sa.Column("trace_id", _ident(), nullable=False, server_default=""),
    sa.Column("group_id", _ident(), nullable=False, server_default=""),
    sa.Column("group_size", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("uri", sa.String(1024), nullable=False),
    sa.Column("reward", sa.Double(), nullable=False),
    sa.Column("num_steps", sa.Integer(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("state", sa.SmallInteger(), nullable=False, server_default="0"),
    sa.Column("used", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("model_version", sa.String(512), nullable=False, server_default=""),
    sa.Column("version_num", sa.BigInteger(), nullable=False),
    sa.Column("instruction", sa.Text(), nullable=False),
    sa.Column("claim_id", _ident(64), nullable=True),
    sa.Column("claimed_by", _ident(), nullable=True),
    sa.Column("claimed_at", _TS, nullable=True),
    sa.Column("lease_expires_at", _TS, nullable=True),
    sa.Column("drop_reason", sa.String(64), nullable=True),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.UniqueConstraint("trajectory_id", "run_id", name="uq_rollout_run_trajectory_run"),
    # Serves the claim: equality on (run_id, state), then the scan follows (version_num, id),
    # which is also the claim's ORDER BY, so InnoDB stops after n rows and locks only those.
    sa.Index("ix_rollout_run_claim", "run_id", "state", "version_num", "id"),
    sa.Index("ix_rollout_run_lease", "state", "lease_expires_at"),
    sa.Index("ix_rollout_run_task", "run_id", "task_id", "id"),
    sa.Index("ix_rollout_run_claim_id", "claim_id"),
    **_MYSQL_TABLE,
)

checkpoint = sa.Table(
    "checkpoint",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(50), nullable=False),
    sa.Column("version", sa.String(50), nullable=False),
    sa.Column("version_num", sa.BigInteger(), nullable=False),
    sa.Column("run_id", _ident(), nullable=False),
    sa.Column("status", sa.String(20), nullable=False, server_default="PENDING"),
    sa.Column("path", sa.String(1024), nullable=True),
    sa.Column("source", sa.String(50), nullable=False, server_default="train"),
    sa.Column("operator", sa.String(50), nullable=False, server_default=""),
    sa.Column("remark", sa.String(1024), nullable=False, server_default=""),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("config_yaml", sa.Text(), nullable=True),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("updated_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("deleted_at", _TS, nullable=True),
    sa.Column("started_at", _TS, nullable=True),
    sa.Column("finished_at", _TS, nullable=True),
    sa.UniqueConstraint("run_id", "version_num", name="uq_checkpoint_run_version"),
    sa.Index("ix_checkpoint_status", "status"),
    sa.Index("ix_checkpoint_created_at", "created_at"),
    sa.Index("ix_checkpoint_updated_at", "updated_at"),
    **_MYSQL_TABLE,
)

dataset_usage_events = sa.Table(
    "dataset_usage_events",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("run_id", _ident(), nullable=False),
    sa.Column("trajectory_id", _ident(), nullable=False),
    sa.Column("row_id", sa.BigInteger(), nullable=False),
    sa.Column("model_version", sa.String(512), nullable=False, server_default=""),
    sa.Column("used_delta", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("event_type", sa.String(16), nullable=False),
    sa.Column("claim_id", _ident(64), nullable=True),
    sa.Column("consumer", _ident(), nullable=True),
    sa.Column("reason", sa.String(64), nullable=True),
    sa.Column("created_at", _TS, nullable=False, server_default=_NOW),
    sa.Index("ix_usage_run_row", "run_id", "row_id"),
    sa.Index("ix_usage_claim", "claim_id"),
    **_MYSQL_TABLE,
)

task_stats = sa.Table(
    "task_stats",
    metadata,
    sa.Column("run_id", _ident(), primary_key=True),
    sa.Column("task_id", _ident(), primary_key=True),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("successes", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("failures_env", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("success_steps_total", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("success_steps_max", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("last_success_uri", sa.String(1024), nullable=True),
    sa.Column("last_success_trajectory_id", _ident(), nullable=True),
    sa.Column("last_success_version", sa.BigInteger(), nullable=True),
    sa.Column("updated_at", _TS, nullable=False, server_default=_NOW),
    **_MYSQL_TABLE,
)

episode_start = sa.Table(
    "episode_start",
    metadata,
    # One row per episode attempt, written before its reset: the audit accounts for every
    # episode started (a finished one has its rollout_run row under the same trajectory_id).
    sa.Column("run_id", _ident(), primary_key=True),
    sa.Column("trajectory_id", _ident(), primary_key=True),
    sa.Column("task_id", _ident(), nullable=False),
    sa.Column("group_id", _ident(), nullable=False, server_default=""),
    sa.Column("group_size", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("trace_id", _ident(), nullable=False, server_default=""),
    sa.Column("rollouter", _ident(), nullable=False, server_default=""),
    sa.Column("version_num", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("started_at", _TS, nullable=False, server_default=_NOW),
    sa.Index("ix_episode_start_rollouter", "run_id", "rollouter"),
    **_MYSQL_TABLE,
)

run = sa.Table(
    "run",
    metadata,
    sa.Column("run_id", _ident(), primary_key=True),
    sa.Column("name", sa.String(191), nullable=False),
    sa.Column("status", sa.String(16), nullable=False, server_default="RUNNING"),
    sa.Column("config_json", sa.Text(), nullable=False),
    sa.Column("started_at", _TS, nullable=False, server_default=_NOW),
    sa.Column("finished_at", _TS, nullable=True),
    **_MYSQL_TABLE,
)


# --------------------------------------------------------------------------- engine


class StoreError(RuntimeError):
    """A durable-log problem phrased for the operator, one line."""


# MySQL/MariaDB error codes worth retrying: server gone/lost/unreachable, deadlock,
# lock wait timeout, connection killed, server shutting down, read-only during failover.
_TRANSIENT_MYSQL = {1040, 1053, 1205, 1213, 1290, 1927, 2002, 2003, 2006, 2013, 2055, 4031}


def is_transient(err: BaseException) -> bool:
    """True for errors a retry can cure (the statement never took effect, or is idempotent)."""
    if not isinstance(err, DBAPIError):
        return False
    if err.connection_invalidated:
        return True
    orig = err.orig
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0] in _TRANSIENT_MYSQL
    text = str(orig).lower()
    return "database is locked" in text or "database is busy" in text


def describe_error(err: BaseException, url: URL) -> str:
    """One clear line for a connection or statement failure."""
    where = url.render_as_string(hide_password=True)
    orig = getattr(err, "orig", None)
    args = getattr(orig, "args", ())
    code = args[0] if args and isinstance(args[0], int) else None
    if code in (1045, 1698):
        return (
            f"access denied to {where}: wrong user or password "
            "(the password comes from store.password_env or store.password_file)"
        )
    if code == 1044:
        return f"user {url.username!r} may not use database {url.database!r} ({where})"
    if code == 1049:
        return f"database {url.database!r} does not exist on {url.host}:{url.port or 3306}"
    if code in (2002, 2003):
        return f"cannot reach the database server at {url.host}:{url.port or 3306} ({where})"
    first = str(orig or err).strip().splitlines()[0] if str(orig or err).strip() else repr(err)
    return f"database error on {where}: {first}"


T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 8
    backoff_s: float = 0.25
    max_backoff_s: float = 5.0

    def run(self, fn: Callable[[], T], what: str) -> T:
        """Run `fn`, retrying transient errors with capped exponential backoff and jitter."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except DBAPIError as e:
                if not is_transient(e) or attempt == self.retries:
                    raise
                log.warning(
                    "%s: transient database error (%s); retry %d", what, e.orig, attempt + 1
                )
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_backoff_s)
        raise AssertionError("unreachable")


def parse_url(dsn: str | URL, password: str | None = None) -> URL:
    try:
        url = make_url(dsn)
    except ArgumentError:
        raise StoreError(
            f"store.dsn {mask_text(str(dsn))!r} is not a database URL "
            "(expected e.g. mysql+pymysql://user@host:3306/db or sqlite:///path.db)"
        ) from None
    if password is not None:
        url = url.set(password=password)
    if url.get_backend_name() == "mysql" and url.get_driver_name() in ("mysqldb", ""):
        url = url.set(drivername="mysql+pymysql")
    return url


def create_engine(
    dsn: str | URL,
    *,
    password: str | None = None,
    pool_size: int = 5,
    connect_timeout_s: float = 5.0,
) -> Engine:
    """An engine with pre-ping, the right isolation and, for SQLite, WAL + BEGIN IMMEDIATE."""
    url = parse_url(dsn, password)
    backend = url.get_backend_name()
    try:
        if backend == "sqlite":
            if url.database and url.database != ":memory:":
                from pathlib import Path

                Path(url.database).parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(
                url,
                pool_pre_ping=True,
                connect_args={"timeout": 60, "check_same_thread": False},
            )
            _sqlite_setup(engine)
        elif backend in ("mysql", "mariadb"):
            engine = sa.create_engine(
                url,
                pool_pre_ping=True,
                pool_recycle=3600,
                pool_size=pool_size,
                max_overflow=pool_size,
                isolation_level="READ COMMITTED",
                connect_args={
                    "connect_timeout": int(max(1, connect_timeout_s)),
                    "charset": "utf8mb4",
                },
            )
        else:
            raise StoreError(
                f"store.dsn: unsupported database {backend!r}; use mysql+pymysql:// or sqlite://"
            )
    except (NoSuchModuleError, ArgumentError) as e:
        raise StoreError(f"store.dsn {url.render_as_string(hide_password=True)}: {e}") from None
    return engine


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")


@contextlib.contextmanager
def snapshot(engine: Engine) -> Iterator[sa.Connection]:
    """A connection whose reads all see one state of the database. MySQL/MariaDB run at READ
    COMMITTED, where each statement sees its own moment: a reader that joins several queries
    over a live run (the audit) would see a row acknowledged in one and still claimed in
    another. Here the transaction runs at REPEATABLE READ, one snapshot from the first read.
    SQLite needs nothing: its transaction (BEGIN IMMEDIATE) already excludes writers."""
    with engine.connect() as c:
        if engine.dialect.name in ("mysql", "mariadb"):
            c = c.execution_options(isolation_level="REPEATABLE READ")
        yield c


def check_connection(
    engine: Engine, attempts: int = 2, backoff_s: float = 0.25, wait_s: float = 0.0
) -> None:
    """Open a connection (a second try after a short pause covers a server that is just
    starting) or raise a one-line StoreError. Quiet: the caller reports the outcome.
    `wait_s`: keep trying transient errors that long (a part restarted by Ray while the
    database itself restarts must wait for it, not die in its constructor for good)."""
    deadline = time.monotonic() + wait_s
    attempt = 0
    while True:
        try:
            with engine.connect() as c:
                c.execute(sa.text("SELECT 1"))
            return
        except DBAPIError as e:
            attempt += 1
            if not is_transient(e) or (attempt >= attempts and time.monotonic() >= deadline):
                raise StoreError(describe_error(e, engine.url)) from None
            time.sleep(backoff_s * min(8, attempt))


def init_schema(engine: Engine) -> None:
    """Create every table and index that does not exist yet (idempotent), then check that
    the tables that were already there are this version's (`check_schema`)."""
    try:
        metadata.create_all(engine)
    except DBAPIError as e:
        raise StoreError(describe_error(e, engine.url)) from None
    check_schema(engine)


def check_schema(engine: Engine) -> None:
    """Raise a one-line StoreError if a table this version uses lacks columns it reads: a
    log written by another dart-ray version fails here, naming the fix, instead of deep in a
    part with "no such column". Tables that do not exist yet are `init_schema`'s to create."""
    try:
        insp = sa.inspect(engine)
        present = set(insp.get_table_names())
        missing = {
            t.name: sorted(set(t.columns.keys()) - {c["name"] for c in insp.get_columns(t.name)})
            for t in metadata.sorted_tables
            if t.name in present
        }
    except DBAPIError as e:
        raise StoreError(describe_error(e, engine.url)) from None
    missing = {t: cols for t, cols in missing.items() if cols}
    if missing:
        what = "; ".join(f"table {t} lacks {', '.join(cols)}" for t, cols in missing.items())
        where = engine.url.render_as_string(hide_password=True)
        raise StoreError(
            f"the database at {where} was written by another dart-ray version ({what}): "
            "start this run in a fresh place (another run.root_dir, or a store.dsn naming a "
            "new database), or keep using the version that wrote it"
        )
