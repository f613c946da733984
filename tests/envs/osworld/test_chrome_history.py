"""The empty History template for OSWorld's `update_browse_history`
(dart_ray/envs/osworld/chrome_history.py), made from this machine's Chromium (marker `browser`) or from
a stand-in browser. Its use by OSWorld's own SetupController is tested in
test_osworld_controllers.py (tier `osworld`)."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from dart_ray.envs.osworld.chrome_history import CHROMIUMS, main, make_history_template

CHROMIUM = next((c for c in CHROMIUMS if shutil.which(c)), None)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (install-test-deps.sh)")
def test_the_template_is_chromiums_own_schema_with_no_rows(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "task" / "history_new.sqlite"
    main([str(dest)])
    with sqlite3.connect(dest) as db:
        tables = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        counts = {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    # OSWorld inserts into urls (url, title, visit_count, typed_count, last_visit_time, hidden)
    # and visits (url, visit_time, from_visit, transition, segment_id, visit_duration)
    assert {"urls", "visits"} <= set(tables)
    assert {t: n for t, n in counts.items() if n and t != "meta"} == {}
    assert int(meta["version"]) > 0  # what Chromium checks when it opens the file


def test_a_browser_that_makes_no_history_is_an_error(tmp_path: Path) -> None:
    fake = tmp_path / "fake-chromium"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="made no Default/History"):
        make_history_template(tmp_path / "out.sqlite", chromium=str(fake))
    assert not (tmp_path / "out.sqlite").exists()


def test_rows_go_and_the_schema_version_stays(tmp_path: Path) -> None:
    # a stand-in browser whose profile's History already holds a visit
    fake = tmp_path / "browser-with-history"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import sqlite3, sys, pathlib\n"
        "d = next(a for a in sys.argv if a.startswith('--user-data-dir='))\n"
        "p = pathlib.Path(d.split('=', 1)[1]) / 'Default'\n"
        "p.mkdir(parents=True)\n"
        "db = sqlite3.connect(p / 'History')\n"
        "db.execute('CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)')\n"
        "db.execute(\"INSERT INTO meta VALUES ('version', '70')\")\n"
        "db.execute('CREATE TABLE urls(id INTEGER PRIMARY KEY AUTOINCREMENT, url TEXT)')\n"
        "db.execute('CREATE TABLE visits(id INTEGER PRIMARY KEY AUTOINCREMENT, url INTEGER)')\n"
        "db.execute(\"INSERT INTO urls(url) VALUES ('http://seen.test/')\")\n"
        "db.execute('INSERT INTO visits(url) VALUES (1)')\n"
        "db.commit()\n"
    )
    fake.chmod(0o755)
    out = make_history_template(tmp_path / "out.sqlite", chromium=str(fake))
    with sqlite3.connect(out) as db:
        assert db.execute("SELECT count(*) FROM urls").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM visits").fetchone() == (0,)
        assert db.execute("SELECT * FROM meta").fetchall() == [("version", "70")]
