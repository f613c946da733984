"""Our own server for the OSWorld in-VM HTTP protocol, on a local Xvfb desktop.

Written from the protocol description (shared/REFERENCE.md), not from OSWorld's code. Endpoints:

    GET  /screenshot /accessibility /terminal /platform /cursor_position
    POST /execute /setup/execute /execute_with_verification /setup/execute_with_verification
         /run_python /run_bash_script
    POST /screen_size /window_size /desktop_path /list_directory /file /wallpaper
    POST /setup/launch /setup/upload /setup/download_file /setup/open_file
         /setup/activate_window /setup/close_window /setup/change_wallpaper
    POST /start_recording /end_recording
    ours: POST /reset (fresh HOME, every process ended, apps restarted), GET /apps (which apps
          crashed), GET /health (whether the X display is alive)

Every POST body may be JSON or a form (urlencoded or multipart), read by its Content-Type:
OSWorld's own client posts some fields as forms (`/file`, `/window_size`).

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
import json
import os
import signal
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from dart_ray.envs.desktop.machine import Machine
from dart_ray.envs.desktop.protocol import Desktop
from dart_ray.envs.desktop.requests import BadRequest, Reply, json_reply, parse_body

MAX_BODY = 64 << 20


def make_handler(desk: Desktop, token: str | None) -> type[BaseHTTPRequestHandler]:
    get_routes = {
        "/screenshot": desk.screenshot,
        "/accessibility": desk.accessibility,
        "/terminal": lambda: json_reply({"output": desk.m.terminal_text()}),
        "/platform": lambda: (200, b"Linux", "text/plain"),
        "/cursor_position": lambda: json_reply(list(desk.x.pointer())),
        "/apps": desk.apps,
        "/health": desk.health,
    }
    post_routes = {
        "/execute": desk.execute,
        "/setup/execute": desk.execute,
        "/execute_with_verification": desk.execute_with_verification,
        "/setup/execute_with_verification": desk.execute_with_verification,
        "/run_python": desk.run_python,
        "/run_bash_script": desk.run_bash_script,
        "/setup/launch": desk.launch,
        "/setup/open_file": desk.open_file,
        "/setup/activate_window": lambda b: desk.window_action(b, "-a"),
        "/setup/close_window": lambda b: desk.window_action(b, "-c"),
        "/setup/download_file": desk.download,
        "/setup/upload": desk.upload,
        "/setup/change_wallpaper": desk.change_wallpaper,
        "/wallpaper": desk.get_wallpaper,
        "/start_recording": desk.start_recording,
        "/end_recording": desk.end_recording,
        "/file": desk.file,
        "/list_directory": desk.list_directory,
        "/screen_size": lambda b: json_reply({"width": desk.m.width, "height": desk.m.height}),
        "/window_size": desk.window_size,
        "/desktop_path": lambda b: json_reply({"desktop_path": str(desk.m.home / "Desktop")}),
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
                self.close_connection = True  # its body stays unread: the connection is done
                self._send(json_reply({"error": "missing or wrong bearer token"}, 401))
                return
            path = self.path.split("?", 1)[0]
            try:
                # the body is read whatever the route: one left unread on a kept-alive
                # connection would be taken for the next request (a 404 broke the next call)
                n = int(self.headers.get("Content-Length") or 0)
                if n > MAX_BODY:
                    self.close_connection = True
                    raise BadRequest(f"body of {n} bytes is over the {MAX_BODY} limit")
                raw = self.rfile.read(n) if n > 0 else b""
                if method == "GET" and path in get_routes:
                    self._send(get_routes[path]())
                    return
                if method == "POST" and path in post_routes:
                    body = parse_body(self.headers.get("Content-Type", ""), raw)
                    self._send(post_routes[path](body))
                    return
                self._send(json_reply({"error": f"no {method} {path}"}, HTTPStatus.NOT_FOUND))
            except (BadRequest, json.JSONDecodeError, TypeError, ValueError) as e:
                self._send(json_reply({"status": "error", "error": str(e)}, 400))
            except Exception as e:  # answer every request; the server must outlive a bad one
                self._send(
                    json_reply({"status": "error", "error": f"{type(e).__name__}: {e}"}, 500)
                )

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

    return Handler


def _exit_with(parent: int, server: ThreadingHTTPServer, every_s: float = 0.5) -> None:
    """Shut the server down once `parent` is gone (we are re-parented): SIGKILL gives the
    parent no chance to stop us, and the X server and apps would outlive it."""
    while os.getppid() == parent:
        time.sleep(every_s)
    server.shutdown()


def _use_profile(machine: Machine, ap: argparse.ArgumentParser) -> None:
    from dart_ray.envs.desktop import profile

    if os.geteuid() == 0:
        ap.error(f"--osworld-profile runs the desktop as {profile.USER!r}, not as root")
    machine.fixed_home = profile.HOME
    machine.skeleton = profile.SKELETON
    machine.atspi = True
    if Path(machine.window_manager).name == "openbox":
        machine.wm_args = ["--config-file", str(profile.write_openbox_config(machine.root))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OSWorld-protocol server on a local Xvfb desktop")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000, help="0 picks a free port")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--height", type=int, default=768)
    ap.add_argument("--window-manager", default="openbox")
    ap.add_argument("--apps", default="", help="comma-separated apps started on every reset")
    ap.add_argument("--root", type=Path, help="scratch folder (default: a new temporary one)")
    ap.add_argument("--token-env", help="environment variable holding the bearer token")
    ap.add_argument("--token-file", type=Path, help="file whose first line is the bearer token")
    ap.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="shut down (X server and apps too) when the process that started us dies",
    )
    ap.add_argument(
        "--osworld-profile",
        action="store_true",
        help="HOME /home/user, Ctrl+Alt+T opens a terminal (dart_ray/envs/desktop/profile.py)",
    )
    a = ap.parse_args(argv)
    parent = os.getppid()
    from dart_ray.config import read_secret

    token = read_secret(a.token_env, a.token_file)
    if a.host not in ("127.0.0.1", "localhost", "::1") and not token:
        ap.error(f"refusing to serve code execution on {a.host} without a bearer token")
    apps = [s for s in a.apps.split(",") if s]
    if a.root is not None:
        a.root.mkdir(parents=True, exist_ok=True)
        machine = Machine(a.width, a.height, a.window_manager, apps, root=a.root)
    else:
        machine = Machine(a.width, a.height, a.window_manager, apps)
    if a.osworld_profile:
        _use_profile(machine, ap)
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
    threading.Thread(target=_reaping, args=(machine,), daemon=True).start()
    if a.exit_with_parent:  # a SIGKILLed EnvSession left its Xvfb and openbox running
        threading.Thread(target=_exit_with, args=(parent, server), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        desk.x.close()
        machine.close()


def _reaping(machine: Machine, every_s: float = 0.5) -> None:
    """The apps that ended, collected while the server runs (`Machine.reap`)."""
    while True:
        machine.reap()
        time.sleep(every_s)


if __name__ == "__main__":
    main()
