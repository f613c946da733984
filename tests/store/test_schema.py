"""sql/schema.sql loads on MariaDB (twice: it is idempotent) and equals the SQLAlchemy metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from dart_ray.store.db import create_engine, init_schema, metadata
from tests.conftest import mysql_database_url

SCHEMA = Path(__file__).resolve().parents[2] / "sql" / "schema.sql"

pytestmark = pytest.mark.mysql


def load_sql_file(url: str, path: Path) -> None:
    u = make_url(url)
    conn = pymysql.connect(
        host=u.host,
        port=u.port or 3306,
        user=u.username,
        password=u.password or "",
        database=u.database,
    )
    try:
        with conn.cursor() as cur:
            text = "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("--"))
            for stmt in filter(str.strip, text.split(";")):
                cur.execute(stmt)
        conn.commit()
    finally:
        conn.close()


def describe(engine: Engine) -> dict[str, Any]:
    """Everything that matters about each table, as the server reports it."""
    out: dict[str, Any] = {}
    with engine.connect() as c:
        for table in sorted(metadata.tables):
            cols = c.execute(
                sa.text(
                    "SELECT column_name, column_type, is_nullable, column_default, collation_name, extra "
                    "FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = :t "
                    "ORDER BY ordinal_position"
                ),
                {"t": table},
            ).all()
            idx = c.execute(
                sa.text(
                    "SELECT index_name, non_unique, seq_in_index, column_name "
                    "FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = :t "
                    "ORDER BY index_name, seq_in_index"
                ),
                {"t": table},
            ).all()
            opts = c.execute(
                sa.text(
                    "SELECT engine, table_collation FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() AND table_name = :t"
                ),
                {"t": table},
            ).one()
            out[table] = {
                "columns": [tuple(r) for r in cols],
                "indexes": [tuple(r) for r in idx],
                "options": tuple(opts),
            }
    return out


def test_schema_sql_matches_metadata() -> None:
    from_file = mysql_database_url()
    from_meta = mysql_database_url()
    url_file, url_meta = next(from_file), next(from_meta)
    try:
        load_sql_file(url_file, SCHEMA)
        load_sql_file(url_file, SCHEMA)  # idempotent
        e_file, e_meta = create_engine(url_file), create_engine(url_meta)
        init_schema(e_meta)
        a, b = describe(e_file), describe(e_meta)
        assert set(a) == set(metadata.tables)
        for table in a:
            assert a[table] == b[table], table
        assert a["rollout_run"]["options"] == ("InnoDB", "utf8mb4_unicode_ci")
        claim_index = [r[3] for r in a["rollout_run"]["indexes"] if r[0] == "ix_rollout_run_claim"]
        assert claim_index == ["run_id", "state", "version_num", "id"]
        e_file.dispose()
        e_meta.dispose()
    finally:
        for gen in (from_file, from_meta):
            for _ in gen:
                pass
