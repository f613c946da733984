"""Storage: the durable log (SQL), the checkpoint registry, and trajectory blobs.

`open_store(config)` is the one way the rest of dart-ray reaches storage: it resolves the DSN
and its password (from the environment or a file, never from the config itself), builds a
pooled engine with retries, and checks that the server answers, raising a one-line
`StoreError` when it does not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError

from dart_ray.config import Config, ConfigError, read_secret
from dart_ray.config.masking import remember
from dart_ray.store.blobs import BlobStore
from dart_ray.store.checkpoints import CheckpointRegistry
from dart_ray.store.db import (
    RetryPolicy,
    StoreError,
    check_connection,
    check_schema,
    create_engine,
    describe_error,
    init_schema,
    parse_url,
)
from dart_ray.store.episodes import EpisodeLedger, EpisodeStart
from dart_ray.store.log import Claim, DurableLog, LeaseLostError
from dart_ray.store.log_rows import LogRow
from dart_ray.store.log_stats import TaskStats

__all__ = [
    "BlobStore",
    "CheckpointRegistry",
    "Claim",
    "DurableLog",
    "EpisodeLedger",
    "EpisodeStart",
    "LeaseLostError",
    "LogRow",
    "Store",
    "StoreError",
    "TaskStats",
    "open_store",
    "resolve_url",
]


def resolve_url(config: Config) -> URL:
    """The database URL the config points at, password included (never print it)."""
    sc = config.store
    if sc.dsn_env:
        dsn = os.environ.get(sc.dsn_env)
        if not dsn:
            raise ConfigError(f"store.dsn_env names ${sc.dsn_env}, which is not set")
        url = parse_url(dsn)
        remember(url.password)  # type: ignore[arg-type]  # never logged by this process
        return url
    if sc.dsn is None:
        return parse_url(f"sqlite:///{(config.run.root_dir / 'dart-ray.sqlite').resolve()}")
    password = read_secret(sc.password_env, sc.password_file)
    url = parse_url(sc.dsn)
    if url.get_backend_name() == "sqlite":
        return url
    return url.set(password=password) if password else url


@dataclass
class Store:
    engine: Engine
    log: DurableLog
    checkpoints: CheckpointRegistry
    blobs: BlobStore
    episodes: EpisodeLedger

    def dispose(self) -> None:
        self.engine.dispose()


def _create_database(url: URL) -> None:
    """CREATE DATABASE for a MySQL/MariaDB URL whose database does not exist yet."""
    server = create_engine(url.set(database=""))
    try:
        with server.begin() as c:
            c.execute(
                sa.text(
                    f"CREATE DATABASE IF NOT EXISTS `{url.database}` "
                    "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
                )
            )
    except DBAPIError as e:
        raise StoreError(describe_error(e, url)) from None
    finally:
        server.dispose()


def open_store(
    config: Config, *, init: bool = False, wait: bool = False, existing: bool = False
) -> Store:
    """Connect to the log and blob storage the config names; `init` creates what is missing.
    `wait`: wait up to `store.reconnect_wait_s` for a database that is down (the parts Ray
    restarts: their constructor must outlast a database restart); else fail at once.
    `existing` (the commands that read a log: status, audit, report): a log that is not
    there is a one-line StoreError naming where it looked, and nothing is created."""
    sc = config.store
    url = resolve_url(config)
    if existing and url.get_backend_name() == "sqlite" and not Path(url.database or "").is_file():
        raise StoreError(
            f"no durable log at {url.database}: no run has written under run.root_dir = "
            f"{config.run.root_dir} (a typo, or the log is on another machine?)"
        )
    retry = RetryPolicy(retries=sc.retries, backoff_s=sc.retry_backoff_s)
    engine = create_engine(url, pool_size=sc.pool_size, connect_timeout_s=sc.connect_timeout_s)
    try:
        check_connection(
            engine, backoff_s=sc.retry_backoff_s, wait_s=sc.reconnect_wait_s if wait else 0.0
        )
    except StoreError as e:
        if init and url.get_backend_name() == "mysql" and "does not exist" in str(e):
            engine.dispose()
            _create_database(url)
            engine = create_engine(
                url, pool_size=sc.pool_size, connect_timeout_s=sc.connect_timeout_s
            )
            check_connection(engine)
        else:
            engine.dispose()
            raise
    if init:
        init_schema(engine)
    else:
        check_schema(engine)
    if existing and not sa.inspect(engine).has_table("run"):
        where = engine.url.render_as_string(hide_password=True)
        engine.dispose()
        raise StoreError(f"the database at {where} holds no dart-ray log (no table `run`)")
    blob_uri = sc.blob_uri or str(config.run.root_dir / "blobs")
    return Store(
        engine=engine,
        log=DurableLog(engine, retry=retry, success_threshold=config.rollout.success_threshold),
        checkpoints=CheckpointRegistry(engine, retry),
        blobs=BlobStore(blob_uri),
        episodes=EpisodeLedger(engine, retry),
    )
