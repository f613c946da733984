"""A part that Ray restarts while the database itself restarts waits for it (markers
`mysql`, `slow`: a private MariaDB server is stopped and started again). Found by the seeded
fault schedule: the curator, killed while MariaDB was down, failed in its constructor, and
an actor whose constructor fails is never restarted, so the run waited for it forever."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from dart_ray.config import load_config
from dart_ray.store import StoreError, open_store
from dart_ray.testing.mariadb import TemporaryMariaDB, mariadb_available

pytestmark = [
    pytest.mark.mysql,
    pytest.mark.slow,
    pytest.mark.skipif(not mariadb_available(), reason="needs mariadbd to start a private server"),
]


def test_a_restarted_part_waits_for_the_database_commands_do_not() -> None:
    db = TemporaryMariaDB().start()
    try:
        cfg = load_config(None, [f"store.dsn={db.url}/dart", "store.reconnect_wait_s=60"])
        open_store(cfg, init=True).dispose()
        db.kill(signal.SIGKILL)  # down
        with pytest.raises(StoreError, match="cannot reach the database server"):
            open_store(cfg)  # a command: fails at once, with the reason
        threading.Timer(3.0, db.start).start()  # back in 3 s (plus its start-up)
        t0 = time.monotonic()
        store = open_store(cfg, wait=True)  # a restarted actor's constructor
        assert store.log.buffer("run") == {}
        assert 3.0 <= time.monotonic() - t0 < 60
        store.dispose()
    finally:
        db.stop()
