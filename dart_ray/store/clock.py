"""The two clocks of the store: this process's (`utcnow`, for timestamps that only record when
something happened) and the database server's (`db_now`, for leases, which every claimer must
read alike whatever its own clock says)."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection


def utcnow() -> datetime:
    """Naive UTC, the form every timestamp column holds (this process's clock)."""
    return datetime.now(UTC).replace(tzinfo=None)


def db_now(c: Connection) -> datetime:
    """The database server's current time, naive UTC, read inside transaction `c`."""
    if c.dialect.name in ("mysql", "mariadb"):
        value = c.execute(sa.text("SELECT UTC_TIMESTAMP(6)")).scalar_one()
    else:
        value = c.execute(sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
