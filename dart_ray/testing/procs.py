"""Processes and loopback servers the environment tests look at: the browsers and apps an env
started (did they outlive it?) and a web server on this machine (the network is closed)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil


def alive(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes among `pids` that still exist (for `psutil.wait_procs`)."""
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return out


@contextlib.contextmanager
def serving(root: Path) -> Iterator[str]:
    """Base URL of a web server on 127.0.0.1 serving the files under `root`; shut on exit."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
