"""Our own client runs OSWorld's set-up steps: the Chrome ones through Chromium's DevTools
port on a real desktop (`LocalDesktopEnv`, Debian's Chromium, no profile), `download` from a
cache folder keyed as OSWorld's SetupController keys it, and the steps that need the internet
refused with a reason that names the task and the step."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from dart_ray.config import DesktopOptions, EnvConfig
from dart_ray.envs.base import EnvInputError
from dart_ray.envs.osworld.chrome import history_database, same_url
from dart_ray.envs.osworld.chrome_history import CHROMIUMS
from dart_ray.envs.osworld.client import OSWorldClient
from dart_ray.envs.osworld.env import LocalDesktopEnv, task_from_json
from dart_ray.envs.osworld.setup import Screen, cache_name, run_step
from tests.envs.desktops import serving_pages, two_visits

CHROMIUM = next((c for c in CHROMIUMS if shutil.which(c)), None)
needs_xvfb = pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (install-test-deps)")
OFFLINE = DesktopOptions()
NOWHERE = OSWorldClient("http://127.0.0.1:9", None, 1.0)  # nothing may be sent to it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cache_name_is_osworlds() -> None:
    # OSWorld's SetupController: "{uuid5(NAMESPACE_URL, url)}_{basename(path)}"
    url = "https://huggingface.co/datasets/x/resolve/main/a.xlsx"
    assert (
        cache_name(url, "/home/user/Desktop/a.xlsx")
        == f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_a.xlsx"
    )


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("googledrive", "Google Drive"),
        ("login", "real account"),
        ("proxy", "proxy pool"),
        ("tidy_desktop", "OSWorld does not implement"),
        ("teleport", "unknown type 'teleport'"),
    ],
)
def test_steps_that_cannot_run_say_why(kind: str, why: str) -> None:
    step = {"type": kind, "parameters": {}}
    with pytest.raises(EnvInputError, match=f"task t-1: setup step 3 \\({kind}\\): .*{why}"):
        run_step(NOWHERE, OFFLINE, "t-1", 3, step)


class Recording(OSWorldClient):
    """A client that records each set-up request; `execute` answers `run N` on its Nth run
    and exits 1, as a command that failed."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", None, 1.0)
        self.sent: list[tuple[str, Any]] = []

    def setup(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        self.sent.append((endpoint, body.get("command", body)))
        runs = sum(w == "execute" for w, _ in self.sent)
        return {"status": "success", "output": f"run {runs}", "error": "no", "returncode": 1}


def test_execute_fills_placeholders_repeats_until_and_only_logs_an_exit_code(
    tmp_path: Path,
) -> None:
    """As OSWorld's `_execute_setup`: ours sent `{SCREEN_WIDTH}` as written, ran once
    whatever `until` said, dropped `stdout`, and failed the task on exit 1."""
    c = Recording()
    options = DesktopOptions(osworld_cache_dir=tmp_path)
    step = {
        "type": "execute",
        "parameters": {
            "command": ["sh", "-c", "echo {CLIENT_PASSWORD} {SCREEN_WIDTH}x{SCREEN_HEIGHT_HALF}"],
            "until": {"stdout": "run 3"},
            "stdout": "out.txt",
        },
    }
    run_step(c, options, "t-2", 0, step, Screen(1280, 720, "pw"))
    assert c.sent == [("execute", ["sh", "-c", "echo pw 1280x360"])] * 3
    assert (tmp_path / "t-2" / "out.txt").read_text() == "run 3"
    # the output file stays in the task's folder
    outside = {"type": "execute", "parameters": {"command": "true", "stdout": "../../x"}}
    with pytest.raises(EnvInputError, match="must be a file name"):
        run_step(c, options, "t-2", 2, outside)
    # a string command without a shell is split, as OSWorld's launch does
    run_step(c, options, "t-2", 1, {"type": "launch", "parameters": {"command": "xterm -e top"}})
    assert c.sent[-1] == ("launch", ["xterm", "-e", "top"])


def test_same_url_as_compare_urls() -> None:
    # the cases OSWorld's compare_urls decides so (tldextract: the suffix, a lone www, "/")
    assert same_url("https://www.airbnb.com/", "https://airbnb.com.sg")
    assert same_url("example.org/a", "http://example.org/a")
    assert same_url("http://127.0.0.1:8000/a.html", "http://127.0.0.1:9000/a.html")  # no port
    assert same_url("https://mail.google.com/x", "https://mail.google.co.uk/x")
    assert not same_url("https://mail.google.com/x", "https://google.com/x")  # a subdomain
    assert not same_url("http://h.test/a?q=1", "http://h.test/a?q=2")  # full: the query counts
    assert not same_url("http://h.test/a", "https://h.test/a")


def test_history_rows(tmp_path: Path) -> None:
    template = tmp_path / "empty.sqlite"
    with sqlite3.connect(template) as db:  # the two tables OSWorld writes, as Chromium has them
        db.execute(
            "CREATE TABLE urls (id INTEGER PRIMARY KEY, url TEXT, title TEXT, visit_count INT,"
            " typed_count INT, last_visit_time INT, hidden INT)"
        )
        db.execute(
            "CREATE TABLE visits (id INTEGER PRIMARY KEY, url INT, visit_time INT,"
            " from_visit INT, transition INT, segment_id INT, visit_duration INT)"
        )
    rows = [
        {"url": "http://a.test/", "title": "A", "visit_time_from_now_in_seconds": 86400},
        {"url": "http://b.test/", "title": "B", "visit_time_from_now_in_seconds": 0},
    ]
    (tmp_path / "out").write_bytes(history_database(template, rows))
    with sqlite3.connect(tmp_path / "out") as db:
        got = db.execute(
            "SELECT u.url, u.visit_count, u.last_visit_time, v.visit_time, v.transition"
            " FROM urls u JOIN visits v ON v.url = u.id ORDER BY u.id"
        ).fetchall()
    assert [(g[0], g[1], g[4]) for g in got] == [
        ("http://a.test/", 1, 805306368),
        ("http://b.test/", 1, 805306368),
    ]
    assert all(g[2] == g[3] for g in got)  # last visit = the visit
    # microseconds since 1601-01-01: now is about 13.4e15 (2026: 425 years of 31.56e12 us)
    assert 13.3e15 < got[1][3] < 13.6e15
    assert abs((got[1][3] - got[0][3]) / 1e6 - 86400) < 5  # a day apart
    assert sqlite3.connect(template).execute("SELECT COUNT(*) FROM urls").fetchone() == (0,)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a web server on this machine with pages a.html and b.html."""
    with serving_pages(tmp_path_factory.mktemp("pages")) as url:
        yield url


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDesktopEnv]:
    cache = tmp_path_factory.mktemp("osworld-cache")
    options = DesktopOptions(chromium_port=free_port(), osworld_cache_dir=cache)
    e = LocalDesktopEnv(
        EnvConfig(kind="desktop", screen_width=800, screen_height=600, desktop=options)
    )
    yield e
    e.close()


def task(task_id: str, steps: list[dict[str, Any]]) -> Any:
    return task_from_json({"id": task_id, "instruction": "-", "config": steps, "evaluator": {}})


def launch_chromium(port: int) -> dict[str, Any]:
    """The step OSWorld's Chrome tasks start with, for Debian's Chromium on `port`."""
    root = " --no-sandbox" if os.geteuid() == 0 else ""  # Chromium refuses root without
    line = (
        f"{CHROMIUM} --remote-debugging-port={port} --no-first-run --no-default-browser-check"
        f' --user-data-dir="$HOME/.config/google-chrome"{root}'
    )
    return {"type": "launch", "parameters": {"command": line, "shell": True}}


def tabs(port: int) -> list[str]:
    r = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=5)
    return sorted(t["url"] for t in r.json() if t["type"] == "page")


@pytest.mark.desktop
@needs_xvfb
@needs_chromium
def test_chrome_tabs_through_our_client(env: LocalDesktopEnv, pages: str) -> None:
    port = env.options.chromium_port
    a, b = pages + "/a.html", pages + "/b.html"
    t0 = time.monotonic()
    env.reset(task("tabs", [launch_chromium(port), _open([a, b])]))
    # connect waits for Chromium; the tab it started with is gone, a and b are open
    assert tabs(port) == [a, b]
    # a new task: close_tabs matches as compare_urls does (here: the port is ignored), after
    # OSWorld's 5 s wait
    other = a.replace(pages.rsplit(":", 1)[1], "1")
    env.reset(task("close", [launch_chromium(port), _open([a, b]), _close([other])]))
    assert tabs(port) == [b]
    assert time.monotonic() - t0 > 5


def _open(urls: list[str]) -> dict[str, Any]:
    return {"type": "chrome_open_tabs", "parameters": {"urls_to_open": urls}}


def _close(urls: list[str]) -> dict[str, Any]:
    return {"type": "chrome_close_tabs", "parameters": {"urls_to_close": urls}}


@pytest.mark.desktop
@needs_xvfb
@needs_chromium
def test_update_browse_history_through_our_client(env: LocalDesktopEnv, tmp_path: Path) -> None:
    history = two_visits()
    step = {"type": "update_browse_history", "parameters": {"history": history}}
    env.reset(task("hist", [step]))
    assert env.options.osworld_cache_dir is not None
    # the template was made from this machine's Chromium and kept where OSWorld looks for it
    assert (env.options.osworld_cache_dir / "hist" / "history_new.sqlite").is_file()
    c = env._need_client()
    data = c.file("~/.config/google-chrome/Default/History")
    assert data is not None
    (tmp_path / "History").write_bytes(data)
    with sqlite3.connect(tmp_path / "History") as db:
        rows = db.execute(
            "SELECT u.url, u.title FROM urls u JOIN visits v ON v.url = u.id ORDER BY v.visit_time"
        ).fetchall()
    assert rows == [(h["url"], h["title"]) for h in history]


@pytest.mark.desktop
@needs_xvfb
def test_download_from_the_cache(env: LocalDesktopEnv) -> None:
    url = "https://files.invalid/report.txt"  # .invalid: never resolves, so only the cache can
    dest = "~/Desktop/report.txt"
    assert env.options.osworld_cache_dir is not None
    folder = env.options.osworld_cache_dir / "dl"
    folder.mkdir()
    (folder / cache_name(url, dest)).write_text("from the cache\n")
    step = {"type": "download", "parameters": {"files": [{"url": url, "path": dest}]}}
    env.reset(task("dl", [step]))
    assert env._need_client().file(dest) == b"from the cache\n"
