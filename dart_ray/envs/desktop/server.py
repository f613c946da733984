"""Our own server for the OSWorld in-VM HTTP protocol, on a local Xvfb desktop.

Written from the protocol description (shared/REFERENCE.md), not from OSWorld's code. Endpoints:

    GET  /screenshot /accessibility /terminal /platform /cursor_position
    POST /execute /setup/execute /run_python /run_bash_script
    POST /screen_size /window_size /desktop_path /list_directory /file
    POST /setup/launch /setup/upload /setup/download_file /setup/open_file
         /setup/activate_window /setup/close_window
    ours: POST /reset (fresh HOME, apps restarted), GET /apps (which apps crashed), GET /health

An OSWorld client sends actions as pyautogui code, `["python", "-c", "import pyautogui; ..."]`:
`python`/`python3` here mean this server's own interpreter, which has pyautogui. Running code
is the protocol's purpose, so the protection is who may reach it: the server binds 127.0.0.1
by default, refuses any other address without a bearer token, and when a token is configured
(read from a file or an environment variable, never a default) every request must carry
`Authorization: Bearer <token>`.

Run it: `python -m dart_ray.envs.desktop.server --port 5000 [--token-file F]`.
"""

from __future__ import annotations

import argparse
import hmac
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from email.parser import BytesParser
from email.policy import HTTP
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from PIL import ImageDraw, ImageGrab

from dart_ray.envs.desktop.machine import Machine
from dart_ray.envs.desktop.xwindows import XWindows, find

MAX_BODY = 64 << 20
Reply = tuple[int, bytes, str]  # status, body, content type


class BadRequest(ValueError):
    """The request is malformed; answered with 400 and this message."""


def _json(obj: Any, status: int = 200) -> Reply:
    return status, json.dumps(obj).encode(), "application/json"


class Desktop:
    """The protocol's operations on one Machine."""

    def __init__(self, machine: Machine) -> None:
        self.m = machine
        os.environ["XAUTHORITY"] = str(machine.root / "Xauthority")  # for Pillow and Xlib
        self.x = XWindows(machine.display)

    # ------------------------------------------------------------------ helpers
    def _path(self, p: Any, what: str = "path") -> Path:
        if not isinstance(p, str) or not p:
            raise BadRequest(f"'{what}' must be a non-empty string")
        if p == "~" or p.startswith("~/"):  # the desktop user's home, not the server's
            p = str(self.m.home) + p[1:]
        path = Path(p)
        return path if path.is_absolute() else self.m.home / path

    def _argv(self, command: Any, shell: bool) -> list[str] | str:
        if shell:
            if not isinstance(command, str):
                command = shlex.join(command)
            return command
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise BadRequest("'command' must be a string or a non-empty list of strings")
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        return argv

    def run(self, command: Any, shell: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        argv = self._argv(command, shell)
        try:
            r = subprocess.run(
                argv,
                shell=shell,
                env=self.m.env(),
                cwd=self.m.home,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {
                "status": "error",
                "output": "",
                "error": f"timed out after {timeout:g}s",
                "returncode": -1,
            }
        except OSError as e:
            return {"status": "error", "output": "", "error": str(e), "returncode": -1}
        return {
            "status": "success",
            "output": r.stdout,
            "error": r.stderr,
            "returncode": r.returncode,
        }

    def wait_for_window(self, pred: Any, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(pred(w) for w in self.x.windows()):
                return True
            time.sleep(0.05)
        return False

    # ------------------------------------------------------------------ GET
    def screenshot(self) -> Reply:
        img = ImageGrab.grab(xdisplay=self.m.display).convert("RGB")
        x, y = self.x.pointer()
        ImageDraw.Draw(img).polygon(
            [(x, y), (x, y + 16), (x + 4, y + 12), (x + 11, y + 11)],
            fill=(255, 255, 255),
            outline=(0, 0, 0),
        )
        buf = io.BytesIO()
        img.save(buf, format="PNG", compress_level=1)
        return 200, buf.getvalue(), "image/png"

    def accessibility(self) -> Reply:
        return _json({"AT": self.x.tree_xml(self.m.width, self.m.height)})

    def apps(self) -> Reply:
        return _json(
            [
                {
                    "name": a.name,
                    "pid": a.proc.pid,
                    "returncode": a.proc.poll(),
                    "crashed": a.crashed,
                }
                for a in self.m.apps
            ]
        )

    # ------------------------------------------------------------------ POST
    def execute(self, b: dict[str, Any]) -> Reply:
        if "command" not in b:
            raise BadRequest("'command' is required")
        return _json(
            self.run(b["command"], bool(b.get("shell", False)), float(b.get("timeout", 120)))
        )

    def run_python(self, b: dict[str, Any]) -> Reply:
        code = b.get("code")
        if not isinstance(code, str):
            raise BadRequest("'code' must be a string")
        r = self.run([sys.executable, "-c", code], timeout=float(b.get("timeout", 120)))
        return _json(r | {"return_code": r["returncode"]})

    def run_bash_script(self, b: dict[str, Any]) -> Reply:
        script = b.get("script")
        if not isinstance(script, str):
            raise BadRequest("'script' must be a string")
        r = self.run(["bash", "-c", script], timeout=float(b.get("timeout", 120)))
        return _json(r | {"return_code": r["returncode"]})

    def launch(self, b: dict[str, Any]) -> Reply:
        argv = self._argv(b.get("command"), False)
        assert isinstance(argv, list)
        try:
            app = self.m.launch_app(argv[0], *argv[1:])
        except FileNotFoundError as e:
            raise BadRequest(str(e)) from None
        # answer once the window is up, so the next setup step or action finds it
        shown = self.wait_for_window(lambda w: w.pid == app.proc.pid, float(b.get("timeout", 10)))
        return _json(
            {
                "status": "success",
                "message": f"launched {app.name}",
                "pid": app.proc.pid,
                "window": shown,
            }
        )

    def open_file(self, b: dict[str, Any]) -> Reply:
        path = self._path(b.get("path"))
        if not path.exists():
            return _json({"status": "error", "message": f"{path} does not exist"}, 404)
        self.m.launch_app("mousepad", str(path))
        ok = self.wait_for_window(lambda w: path.name in w.name)
        return _json(
            {
                "status": "success" if ok else "error",
                "message": f"opened {path}" if ok else f"no window for {path.name}",
            }
        )

    def _window_action(self, b: dict[str, Any], flag: str) -> Reply:
        name = b.get("window_name")
        if not isinstance(name, str):
            raise BadRequest("'window_name' must be a string")
        wins = find(self.x.windows(), name, bool(b.get("strict")), bool(b.get("by_class")))
        if not wins:
            return _json({"status": "error", "message": f"no window {name!r}"}, 404)
        r = self.run(["wmctrl", "-i", flag, hex(wins[0].id)])
        return _json({"status": r["status"], "message": r["error"] or "ok"})

    def upload(self, headers: Any, body: bytes) -> Reply:
        msg = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {headers.get('Content-Type', '')}\r\n\r\n".encode() + body
        )
        parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
        if "file_path" not in parts or "file_data" not in parts:
            raise BadRequest("multipart form needs 'file_path' and 'file_data'")
        path = self._path(parts["file_path"].get_content().strip(), "file_path")
        data = parts["file_data"].get_payload(decode=True) or b""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return _json({"status": "success", "message": f"wrote {len(data)} bytes to {path}"})

    def download(self, b: dict[str, Any]) -> Reply:
        url, path = b.get("url"), self._path(b.get("path"))
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "file://")):
            raise BadRequest("'url' must be an http(s):// or file:// URL")
        with urllib.request.urlopen(url, timeout=60) as r:
            data = r.read()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return _json({"status": "success", "message": f"downloaded {len(data)} bytes"})

    def file(self, b: dict[str, Any]) -> Reply:
        path = self._path(b.get("file_path"), "file_path")
        if not path.is_file():
            return _json({"error": f"{path} not found"}, 404)
        return 200, path.read_bytes(), "application/octet-stream"

    def list_directory(self, b: dict[str, Any]) -> Reply:
        root = self._path(b.get("path"))
        if not root.is_dir():
            return _json({"error": f"{root} is not a directory"}, 404)

        def tree(p: Path) -> dict[str, Any]:
            if p.is_dir():
                return {
                    "name": p.name,
                    "type": "directory",
                    "children": [tree(c) for c in sorted(p.iterdir())],
                }
            return {"name": p.name, "type": "file"}

        return _json({"directory_tree": tree(root)})

    def window_size(self, b: dict[str, Any]) -> Reply:
        wins = find(self.x.windows(), str(b.get("app_class_name", "")), by_class=True)
        if not wins:
            return _json({"error": "no such window"}, 404)
        return _json({"width": wins[0].width, "height": wins[0].height})

    def reset(self, b: dict[str, Any]) -> Reply:
        apps = b.get("apps")
        if apps is not None:
            self.m.startup_apps = [str(a) for a in apps]
        self.m.reset()
        pids = {a.proc.pid for a in self.m.apps}
        ok = all(self.wait_for_window(lambda w, p=p: w.pid == p) for p in pids)
        return _json(
            {
                "status": "success" if ok else "error",
                "home": str(self.m.home),
                "display": self.m.display,
            }
        )


def make_handler(desk: Desktop, token: str | None) -> type[BaseHTTPRequestHandler]:
    get_routes = {
        "/screenshot": desk.screenshot,
        "/accessibility": desk.accessibility,
        "/terminal": lambda: _json({"output": desk.m.terminal_text()}),
        "/platform": lambda: (200, b"Linux", "text/plain"),
        "/cursor_position": lambda: _json(list(desk.x.pointer())),
        "/apps": desk.apps,
        "/health": lambda: _json({"status": "ok"}),
    }
    post_routes = {
        "/execute": desk.execute,
        "/setup/execute": desk.execute,
        "/run_python": desk.run_python,
        "/run_bash_script": desk.run_bash_script,
        "/setup/launch": desk.launch,
        "/setup/open_file": desk.open_file,
        "/setup/activate_window": lambda b: desk._window_action(b, "-a"),
        "/setup/close_window": lambda b: desk._window_action(b, "-c"),
        "/setup/download_file": desk.download,
        "/file": desk.file,
        "/list_directory": desk.list_directory,
        "/screen_size": lambda b: _json({"width": desk.m.width, "height": desk.m.height}),
        "/window_size": desk.window_size,
        "/desktop_path": lambda b: _json({"desktop_path": str(desk.m.home / "Desktop")}),
        "/reset": desk.reset,
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            pass

        def _authorised(self) -> bool:
            if token is None:
                return True
            got = self.headers.get("Authorization", "")
            return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

        def _send(self, reply: Reply) -> None:
            status, body, ctype = reply
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self, method: str) -> None:
            if not self._authorised():
                self._send(_json({"error": "missing or wrong bearer token"}, 401))
                return
            path = self.path.split("?", 1)[0]
            try:
                if method == "GET" and path in get_routes:
                    self._send(get_routes[path]())
                    return
                if method == "POST" and (path in post_routes or path == "/setup/upload"):
                    n = int(self.headers.get("Content-Length") or 0)
                    if n > MAX_BODY:
                        raise BadRequest(f"body of {n} bytes is over the {MAX_BODY} limit")
                    raw = self.rfile.read(n)
                    if path == "/setup/upload":
                        self._send(desk.upload(self.headers, raw))
                        return
                    body = json.loads(raw or b"{}")
                    if not isinstance(body, dict):
                        raise BadRequest("the body must be a JSON object")
                    self._send(post_routes[path](body))
                    return
                self._send(_json({"error": f"no {method} {path}"}, HTTPStatus.NOT_FOUND))
            except (BadRequest, json.JSONDecodeError, TypeError, ValueError) as e:
                self._send(_json({"status": "error", "error": str(e)}, 400))
            except Exception as e:  # answer every request; the server must outlive a bad one
                self._send(_json({"status": "error", "error": f"{type(e).__name__}: {e}"}, 500))

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OSWorld-protocol server on a local Xvfb desktop")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000, help="0 picks a free port")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--window-manager", default="openbox")
    ap.add_argument("--apps", default="", help="comma-separated apps started on every reset")
    ap.add_argument("--token-env", help="environment variable holding the bearer token")
    ap.add_argument("--token-file", type=Path, help="file whose first line is the bearer token")
    a = ap.parse_args(argv)
    from dart_ray.config import read_secret

    token = read_secret(a.token_env, a.token_file)
    if a.host not in ("127.0.0.1", "localhost", "::1") and not token:
        ap.error(f"refusing to serve code execution on {a.host} without a bearer token")
    machine = Machine(a.width, a.height, a.window_manager, [s for s in a.apps.split(",") if s])
    machine.start()
    desk = Desktop(machine)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(desk, token))
    server.daemon_threads = True
    print(
        f"listening on http://{a.host}:{server.server_address[1]} display {machine.display}",
        flush=True,
    )
    # SIGTERM (how LocalDesktopEnv stops us) must still tear the X server and apps down
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        desk.x.close()
        machine.close()


if __name__ == "__main__":
    main()
