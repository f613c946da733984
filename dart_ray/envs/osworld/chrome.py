"""OSWorld's Chrome setup steps for our own client, over Chrome's DevTools HTTP endpoints.

OSWorld's SetupController drives Chrome with Playwright (`connect_over_cdp`) for three steps;
our client (`dart_ray.envs.osworld.setup`) runs them without Playwright, through the HTTP
endpoints every Chromium serves on its remote-debugging port (`GET /json/version`,
`/json/list`, `PUT /json/new?<url>`, `GET /json/close/<id>`). OSWorld's tasks start Chrome with
`--remote-debugging-port=1337` and forward port 9222 to it with `socat`; the port here is
`env.desktop.chromium_port` (OSWorld's `chromium_port`, default 9222) on the desktop's host.

Kept from OSWorld (`desktop_env/controllers/setup.py`):

- connecting: 15 tries, 5 s apart, then the step fails;
- `chrome_open_tabs`: one new tab per URL, in order; after the first, the tab Chrome started
  with is closed. Ours does not wait for each page's load event (Playwright's `goto` waits up
  to 60 s and only warns when it runs out);
- `chrome_close_tabs`: waits 5 s first (for Chrome to finish starting), then for each URL closes
  the first tab whose URL matches by `same_url`, OSWorld's `compare_urls`;
- `update_browse_history`: the task's rows (`url`, `title`, `visit_time_from_now_in_seconds`)
  go into a copy of an empty History database, one `urls` row and one `visits` row each (visit
  count 1, transition 805306368, times in microseconds since 1601 from the local clock, as
  OSWorld computes them), and the copy replaces `~/.config/google-chrome/Default/History`.
"""

from __future__ import annotations

import functools
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import ParseResult, quote, urlparse, urlunparse

import requests

from dart_ray.envs.base import EnvInputError

CONNECT_TRIES = 15
CONNECT_PAUSE_S = 5.0
CLOSE_WAIT_S = 5.0  # OSWorld's `_chrome_close_tabs_setup` sleeps this long before connecting
TYPED_LINK = 805306368  # the `transition` OSWorld gives every visit it adds
CHROME_EPOCH = datetime(1601, 1, 1)
# labels that, before a two-letter country code, are part of the public suffix (co.uk, com.sg):
# enough of the public suffix list for comparing task URLs without downloading it


class DevTools:
    """Chrome's DevTools HTTP endpoints at http://host:port."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.base = f"http://{host}:{port}"
        self.timeout_s = timeout_s

    def connect(self, tries: int = CONNECT_TRIES, pause_s: float = CONNECT_PAUSE_S) -> None:
        """Wait for Chrome to answer; EnvInputError after `tries` failed tries."""
        for attempt in range(tries):
            try:
                requests.get(self.base + "/json/version", timeout=self.timeout_s).raise_for_status()
                return
            except requests.RequestException as e:
                if attempt == tries - 1:
                    raise EnvInputError(
                        f"no Chrome answers at {self.base} after {tries} tries "
                        f"(launch it with --remote-debugging-port): {e}"
                    ) from e
                time.sleep(pause_s)

    def pages(self) -> list[dict[str, Any]]:
        """The open tabs (targets of type `page`), as Chrome lists them."""
        r = requests.get(self.base + "/json/list", timeout=self.timeout_s)
        r.raise_for_status()
        return [t for t in r.json() if t.get("type") == "page"]

    def open(self, url: str) -> dict[str, Any]:
        """A new tab at `url` (Chromium since 111 wants PUT; older ones GET)."""
        target = self.base + "/json/new?" + quote(url, safe=":/?&=#%@+,;~")
        r = requests.put(target, timeout=self.timeout_s)
        if r.status_code == 405:
            r = requests.get(target, timeout=self.timeout_s)
        r.raise_for_status()
        page: dict[str, Any] = r.json()
        return page

    def close(self, target_id: str) -> None:
        requests.get(
            f"{self.base}/json/close/{target_id}", timeout=self.timeout_s
        ).raise_for_status()


def open_tabs(chrome: DevTools, urls: list[str]) -> None:
    """OSWorld's `chrome_open_tabs`: open each URL in a new tab, then drop the start tab."""
    chrome.connect()
    before = chrome.pages()
    for i, url in enumerate(urls):
        chrome.open(url)
        if i == 0 and before:
            chrome.close(before[-1]["id"])  # /json/list lists the oldest tab last


def close_tabs(chrome: DevTools, urls: list[str], wait_s: float = CLOSE_WAIT_S) -> None:
    """OSWorld's `chrome_close_tabs`: for each URL, close the first tab that matches it."""
    time.sleep(wait_s)
    chrome.connect()
    for url in urls:
        for page in chrome.pages():
            if same_url(page.get("url", ""), url):
                chrome.close(page["id"])
                break


def same_url(a: str, b: str) -> bool:
    """OSWorld's `compare_urls`: equal after dropping the port, a lone `www`, the public
    suffix (`airbnb.com` equals `airbnb.com.sg`) and a path of only `/`."""
    return _normal(a) == _normal(b)


@functools.cache
def _suffixes() -> Any:
    """tldextract over the public suffix list it ships (no download: the list is never
    fetched at run time), as OSWorld's `compare_urls` splits a host."""
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def _normal(url: str) -> str:
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://", url):
        url = "http://" + url  # no scheme: a host and a path, not a path alone
    p = urlparse(url)
    parts = _suffixes()((p.hostname or "").lower())
    sub = "" if parts.subdomain == "www" else parts.subdomain
    netloc = f"{sub}.{parts.domain}" if sub else parts.domain
    path = "" if p.path == "/" else p.path
    return urlunparse(ParseResult(p.scheme.lower(), netloc, path, p.params, p.query, p.fragment))


def history_database(template: Path, history: list[dict[str, Any]]) -> bytes:
    """OSWorld's `update_browse_history` rows added to a copy of an empty History database."""
    with tempfile.TemporaryDirectory(prefix="dart-history-") as tmp:
        db = Path(tmp) / "History"
        shutil.copyfile(template, db)
        conn = sqlite3.connect(db)
        try:
            for item in history:
                seen = datetime.now() - timedelta(seconds=item["visit_time_from_now_in_seconds"])
                stamp = int((seen - CHROME_EPOCH).total_seconds() * 1_000_000)
                cur = conn.execute(
                    "INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, "
                    "hidden) VALUES (?, ?, 1, 0, ?, 0)",
                    (item["url"], item["title"], stamp),
                )
                conn.execute(
                    "INSERT INTO visits (url, visit_time, from_visit, transition, segment_id, "
                    "visit_duration) VALUES (?, ?, 0, ?, 0, 0)",
                    (cur.lastrowid, stamp, TYPED_LINK),
                )
            conn.commit()
        finally:
            conn.close()
        return db.read_bytes()


def history_template(cache: Path, make: Callable[[Path], Path]) -> Path:
    """The empty History database OSWorld keeps at `<task cache>/history_new.sqlite`: that file
    when it is there, else one `make` writes there (`chrome_history.make_history_template`)."""
    path = cache / "history_new.sqlite"
    return path if path.is_file() else make(path)
