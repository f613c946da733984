"""`[store]`: the durable log's database (its URL, never a password), the trajectory blobs,
the connection pool and retries."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from dart_ray.config.base import Section


class StoreConfig(Section):
    dsn: str | None = None
    """SQLAlchemy URL of the durable log, without a password (e.g.
    `mysql+pymysql://dart@db:3306/dart`). Unset: SQLite at `<run.root_dir>/dart-ray.sqlite`."""
    dsn_env: str | None = None
    """Environment variable holding the whole DSN (may include a password); wins over `dsn`."""
    password_env: str | None = "DART_RAY_DB_PASSWORD"
    """Environment variable with the database password (read only if set)."""
    password_file: Path | None = None
    """File whose first line is the database password (wins over `password_env`)."""
    blob_uri: str | None = None
    """Where trajectory Parquet files go: a folder or any pyarrow.fs URI (`s3://bucket/p`).
    Unset: `<run.root_dir>/blobs`."""
    pool_size: int = Field(default=5, ge=1)
    """Connections kept in the pool per process."""
    retries: int = Field(default=8, ge=0)
    """Retries of a statement on a transient error (server restart, deadlock, lock)."""
    retry_backoff_s: float = Field(default=0.25, gt=0)
    """First retry delay; doubles each retry, capped at 5 s."""
    reconnect_wait_s: float = Field(default=120.0, ge=0)
    """How long a part that Ray restarts (curator, rollouter, train worker) waits at start for
    a database that is down before it gives up (a restart of both at once must not kill the
    part for good). Commands (`dart-ray status`, ...) fail at once."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Seconds to wait for a connection to the server."""

    @field_validator("dsn")
    @classmethod
    def _no_password_in_dsn(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            url = make_url(v)
        except ArgumentError as e:
            raise ValueError(f"not a database URL ({e})") from None
        if url.password:
            raise ValueError(
                "contains a password; put it in the environment variable named by "
                "store.password_env or in store.password_file"
            )
        return v
