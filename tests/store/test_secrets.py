"""No secret reaches the durable log's rows or the logs, on SQLite and on a real MariaDB.

A run holds three kinds of secret: the database password (from `store.password_env`), bearer
tokens (the policy route's from a file, the desktop's from the environment) and credentials
someone wrote into a URL. The test reads them the way the run does, then takes the code paths
that write rows (the `run` row as `runtime.start` writes it, checkpoint rows as the train
worker writes them, a failed checkpoint whose reason quotes a DSN and a header) with every
logger at DEBUG and SQLAlchemy echoing its statements, and searches every row of every table
and every log line for the secrets.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from dart_ray.config import load_config, read_secret
from dart_ray.store import open_store, resolve_url
from dart_ray.store.db import create_engine, metadata
from dart_ray.store.runs import get_run, register_run
from tests.conftest import MYSQL_SERVER, mysql_database_url


@contextmanager
def _mysql_user(password: str) -> Iterator[str]:
    """A fresh database and a user who needs `password` for it; yields a DSN without it."""
    gen = mysql_database_url()
    url = sa.engine.make_url(next(gen))
    user = f"dart_sec_{secrets.token_hex(4)}"
    admin = create_engine(MYSQL_SERVER)
    with admin.begin() as c:
        c.execute(sa.text(f"CREATE USER '{user}'@'%' IDENTIFIED BY :pw"), {"pw": password})
        c.execute(sa.text(f"GRANT ALL ON `{url.database}`.* TO '{user}'@'%'"))
    try:
        yield url.set(username=user, password=None).render_as_string(hide_password=False)
    finally:
        with admin.begin() as c:
            c.execute(sa.text(f"DROP USER '{user}'@'%'"))
        admin.dispose()
        for _ in gen:
            pass


def _every_row(engine: sa.Engine) -> str:
    with engine.connect() as c:
        return "\n".join(
            repr(tuple(r)) for t in metadata.sorted_tables for r in c.execute(sa.select(t))
        )


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def test_no_secret_in_rows_or_logs(
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db_password = "Db-" + secrets.token_urlsafe(12)
    policy_token = "Tk-" + secrets.token_urlsafe(12)
    desktop_token = "Dk-" + secrets.token_urlsafe(12)
    url_password = "Url-" + secrets.token_urlsafe(8)
    all_secrets = (db_password, policy_token, desktop_token, url_password)
    token_file = tmp_path / "policy-token"
    token_file.write_text(policy_token + "\n")
    monkeypatch.setenv("DART_TEST_DB_PASSWORD", db_password)
    monkeypatch.setenv("DART_TEST_DESKTOP_TOKEN", desktop_token)
    with _mysql_user(db_password) if backend == "mysql" else _no_user() as dsn:
        # from here on, as a run would log (the test's own CREATE USER is not the run's)
        caplog.set_level(logging.DEBUG)
        caplog.set_level(logging.INFO, logger="sqlalchemy.engine")  # statements and parameters
        overrides = [
            f"run.root_dir={tmp_path}",
            "store.password_env=DART_TEST_DB_PASSWORD",
            f"policy.auth_token_file={token_file}",
            "env.desktop.token_env=DART_TEST_DESKTOP_TOKEN",
            f'env.desktop.pool_url="http://pool:{url_password}@10.0.0.9:5100"',
            *([f'store.dsn="{dsn}"'] if dsn else []),
        ]
        cfg = load_config(None, overrides)
        store = open_store(cfg, init=True)  # the password is used: MariaDB refuses us without it
        try:
            # the replica and the desktop env read their tokens where they run
            assert read_secret(cfg.policy.auth_token_env, cfg.policy.auth_token_file) == (
                policy_token
            )
            assert read_secret(cfg.env.desktop.token_env, None) == desktop_token
            register_run(store.engine, "run-sec", cfg.run.name, cfg.model_dump(mode="json"))
            cps = store.checkpoints
            ok = cps.create("run-sec", 1, source="train", config_yaml=cfg.redacted_yaml())
            cps.start(ok)
            cps.complete(ok, str(tmp_path / "v1"))
            bad = cps.create("run-sec", 2, source="train", config_yaml=cfg.redacted_yaml())
            cps.start(bad)
            full_dsn = resolve_url(cfg).render_as_string(hide_password=False)
            cps.fail(
                bad,
                f"RuntimeError: {full_dsn} and {cfg.env.desktop.pool_url} said no to "
                f"Authorization: Bearer {policy_token}",
            )
            logging.getLogger("dart_ray.test").warning(
                "connected to %s with %s and %s", full_dsn, desktop_token, cfg.env.desktop.pool_url
            )
            rows = _every_row(store.engine)
            run = get_run(store.engine, "run-sec")
            [ckpt] = [c for c in cps.list("run-sec") if c.version_num == 2]
            with store.engine.connect() as c:
                stored_yaml = c.scalar(
                    sa.text("SELECT config_yaml FROM checkpoint WHERE id = :i"), {"i": ok}
                )
        finally:
            store.dispose()

    for s in all_secrets:
        assert s not in rows, s
        assert s not in caplog.text, s
    # what is stored is still the configuration, with the places secrets come from
    assert run is not None
    assert run.config["store"]["password_env"] == "DART_TEST_DB_PASSWORD"
    assert run.config["policy"]["auth_token_file"] == str(token_file)
    assert run.config["env"]["desktop"]["pool_url"] == "http://pool:***@10.0.0.9:5100"
    assert yaml.safe_load(stored_yaml) == run.config
    assert ckpt.error is not None and "Bearer ***" in ckpt.error and ":***@" in ckpt.error
    if backend == "mysql":
        assert full_dsn.count(db_password) == 1  # the run did connect with it


@contextmanager
def _no_user() -> Iterator[None]:
    yield None
