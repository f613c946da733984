"""A desktop server that answers garbage: a clear, typed error, and an aborted (not lost) episode.

A fake OSWorld-protocol server answers each endpoint with whatever a test sets: not JSON, the
wrong JSON type, a field missing or mistyped, a screenshot that is not a PNG. The client must
raise `EnvProtocolError` naming the endpoint and field; through `EnvSession` that becomes
`EnvAborted` (the rollouter records ABORTED, retries, and after its retries ENV_ERROR), and the
session works again on the next reset once the server behaves.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from PIL import Image

from actors.env_session import EnvSession
from dart_ray.config import DesktopOptions, EnvConfig
from dart_ray.envs.base import EnvAborted
from dart_ray.envs.osworld.env import EnvProtocolError, OSWorldEnv
from dart_ray.records import Action, ActionKind, Task

Reply = tuple[int, bytes, str]


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6)).save(buf, format="PNG")
    return buf.getvalue()


def _json(obj: Any) -> Reply:
    return 200, json.dumps(obj).encode(), "application/json"


GOOD: dict[str, Reply] = {
    "/reset": _json({"status": "success"}),
    "/screenshot": (200, _png(), "image/png"),
    "/accessibility": _json({"AT": "<desktop/>"}),
    "/health": _json({"status": "ok", "display": True}),
    "/execute": _json({"status": "success", "output": "", "error": "", "returncode": 0}),
    "/platform": (200, b"Linux", "text/plain"),
}


class FakeServer:
    def __init__(self) -> None:
        self.replies = dict(GOOD)
        replies = self.replies

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                status, body, ctype = replies.get(self.path, (404, b"{}", "application/json"))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"


@pytest.fixture(scope="module")
def _server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.http.shutdown()
    s.http.server_close()


@pytest.fixture
def server(_server: FakeServer) -> FakeServer:
    _server.replies.clear()
    _server.replies.update(GOOD)
    return _server


def _config(url: str) -> EnvConfig:
    return EnvConfig(
        kind="osworld",
        desktop=DesktopOptions(server_url=url, settle_s=0),
        reset_timeout_s=20,
        step_timeout_s=20,
    )


TASK = Task("desk/t", "do it", "osworld", {"config": []})
CLICK = Action(ActionKind.CLICK, point=(1.0, 2.0))

RESET_GARBAGE = [
    ("/screenshot", (200, b"<html>502 Bad Gateway</html>", "text/html"), "not a PNG"),
    ("/screenshot", (200, b"\x89PNG\r\n\x1a\n", "image/png"), "not a PNG (8 bytes"),
    (
        "/accessibility",
        (200, b"<xml/>", "text/xml"),
        "answered /accessibility with a body that is not JSON",
    ),
    ("/accessibility", _json(["AT"]), "answered /accessibility with JSON list, not an object"),
    ("/accessibility", _json({"AT": 5}), "answered /accessibility without a valid 'AT' (got 5)"),
    ("/accessibility", _json({"tree": "<x/>"}), "answered /accessibility without 'AT'"),
]
STEP_GARBAGE = [
    ("/execute", (200, b"", "application/json"), "answered /execute with a body that is not JSON"),
    ("/execute", _json([0]), "answered /execute with JSON list, not an object"),
    ("/health", _json(["ok"]), "answered /health with JSON list, not an object"),
    ("/health", _json({"display": "yes"}), "without a valid 'display' (got \"yes\")"),
]


@pytest.mark.parametrize("path, reply, message", RESET_GARBAGE)
def test_garbage_on_reset_is_a_protocol_error_naming_the_field(
    server: FakeServer, path: str, reply: Reply, message: str
) -> None:
    env = OSWorldEnv(_config(server.url))
    server.replies[path] = reply
    with pytest.raises(EnvProtocolError) as e:
        env.reset(TASK)
    assert message in str(e.value)


@pytest.mark.parametrize("path, reply, message", STEP_GARBAGE)
def test_garbage_on_step_is_a_protocol_error_naming_the_field(
    server: FakeServer, path: str, reply: Reply, message: str
) -> None:
    env = OSWorldEnv(_config(server.url))
    env.reset(TASK)
    server.replies[path] = reply
    with pytest.raises(EnvProtocolError) as e:
        env.step(CLICK)
    assert message in str(e.value)


def test_the_session_aborts_the_episode_and_recovers(server: FakeServer) -> None:
    session = EnvSession(_config(server.url), name="garbage")
    try:
        session.reset(TASK)
        server.replies["/execute"] = (200, b"Internal error: <pre>", "text/plain")
        with pytest.raises(EnvAborted) as e:
            session.step(CLICK)
        assert "EnvProtocolError" in str(e.value) and "/execute" in str(e.value)
        server.replies["/accessibility"] = _json({"AT": {"not": "text"}})
        with pytest.raises(EnvAborted, match="'AT'"):
            session.reset(TASK)
        # the server behaves again: a fresh environment, a normal episode
        server.replies.update(GOOD)
        obs = session.reset(TASK)
        assert (obs.width, obs.height) == (8, 6)
        assert session.step(CLICK).info["returncode"] == 0
        stats = session.stats()
        assert stats.aborted == 2 and stats.recreations >= 1
    finally:
        session.close()
