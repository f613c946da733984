"""The OSWorld in-VM protocol's operations on one desktop, apart from HTTP.

Each method takes the request's JSON body and returns `(status, body bytes, content type)`;
`server.py` routes HTTP requests to them. Keeping the operations free of HTTP makes them easy
to read against the protocol description and leaves the transport (auth, limits) in one place.
A malformed request raises `BadRequest`, answered with 400 and its message.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

from PIL import ImageDraw, ImageGrab

from dart_ray.envs.desktop.machine import Machine
from dart_ray.envs.desktop.xwindows import XWindows, find

Reply = tuple[int, bytes, str]  # status, body, content type


class BadRequest(ValueError):
    """The request is malformed; answered with 400 and this message."""


def json_reply(obj: Any, status: int = 200) -> Reply:
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

    def wait_for_window(
        self, pred: Any, timeout: float = 10.0, gone: Callable[[], bool] = lambda: False
    ) -> bool:
        """True once a window matches `pred`; False after `timeout` s or once `gone()`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(pred(w) for w in self.x.windows()):
                return True
            if gone():
                return False
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
        return json_reply({"AT": self.x.tree_xml(self.m.width, self.m.height)})

    def apps(self) -> Reply:
        return json_reply(
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
        return json_reply(
            self.run(b["command"], bool(b.get("shell", False)), float(b.get("timeout", 120)))
        )

    def run_python(self, b: dict[str, Any]) -> Reply:
        code = b.get("code")
        if not isinstance(code, str):
            raise BadRequest("'code' must be a string")
        r = self.run([sys.executable, "-c", code], timeout=float(b.get("timeout", 120)))
        return json_reply(r | {"return_code": r["returncode"]})

    def run_bash_script(self, b: dict[str, Any]) -> Reply:
        script = b.get("script")
        if not isinstance(script, str):
            raise BadRequest("'script' must be a string")
        r = self.run(["bash", "-c", script], timeout=float(b.get("timeout", 120)))
        return json_reply(r | {"return_code": r["returncode"]})

    def launch(self, b: dict[str, Any]) -> Reply:
        argv = self._argv(b.get("command"), False)
        assert isinstance(argv, list)
        # answer once the window is up, so the next setup step or action finds it; a loaded
        # machine (CI, many sessions on one host) can take well over 10 s to map an xterm.
        # A program that exits before showing a window (seen: an xterm on a loaded CI host) is
        # started again, up to three tries in all.
        deadline = time.monotonic() + float(b.get("timeout", 30))
        wm = self.m.ensure_wm(self.x.wm_ready)
        for _ in range(3):
            try:
                app = self.m.launch_app(argv[0], *argv[1:])
            except FileNotFoundError as e:
                raise BadRequest(str(e)) from None
            shown = self.wait_for_window(
                lambda w, p=app.proc: w.pid == p.pid,
                deadline - time.monotonic(),
                gone=lambda p=app.proc: p.poll() is not None,
            )
            if shown or app.proc.poll() is None:
                break
            self.m.apps.remove(app)  # died starting: not a crash of a running app
        if not shown:
            code = app.proc.poll()
            why = "is still starting" if code is None else f"exited with status {code}"
            if not wm:
                why += f" (the window manager {self.m.window_manager!r} is not running)"
            return json_reply(
                {"status": "error", "message": f"{app.name} showed no window: it {why}"}, 500
            )
        return json_reply(
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
            return json_reply({"status": "error", "message": f"{path} does not exist"}, 404)
        self.m.launch_app("mousepad", str(path))
        ok = self.wait_for_window(lambda w: path.name in w.name)
        return json_reply(
            {
                "status": "success" if ok else "error",
                "message": f"opened {path}" if ok else f"no window for {path.name}",
            }
        )

    def window_action(self, b: dict[str, Any], flag: str) -> Reply:
        name = b.get("window_name")
        if not isinstance(name, str):
            raise BadRequest("'window_name' must be a string")
        wins = find(self.x.windows(), name, bool(b.get("strict")), bool(b.get("by_class")))
        if not wins:
            return json_reply({"status": "error", "message": f"no window {name!r}"}, 404)
        r = self.run(["wmctrl", "-i", flag, hex(wins[0].id)])
        return json_reply({"status": r["status"], "message": r["error"] or "ok"})

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
        return json_reply({"status": "success", "message": f"wrote {len(data)} bytes to {path}"})

    def download(self, b: dict[str, Any]) -> Reply:
        url, path = b.get("url"), self._path(b.get("path"))
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "file://")):
            raise BadRequest("'url' must be an http(s):// or file:// URL")
        with urllib.request.urlopen(url, timeout=60) as r:
            data = r.read()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return json_reply({"status": "success", "message": f"downloaded {len(data)} bytes"})

    def file(self, b: dict[str, Any]) -> Reply:
        path = self._path(b.get("file_path"), "file_path")
        if not path.is_file():
            return json_reply({"error": f"{path} not found"}, 404)
        return 200, path.read_bytes(), "application/octet-stream"

    def list_directory(self, b: dict[str, Any]) -> Reply:
        root = self._path(b.get("path"))
        if not root.is_dir():
            return json_reply({"error": f"{root} is not a directory"}, 404)

        def tree(p: Path) -> dict[str, Any]:
            if p.is_dir():
                return {
                    "name": p.name,
                    "type": "directory",
                    "children": [tree(c) for c in sorted(p.iterdir())],
                }
            return {"name": p.name, "type": "file"}

        return json_reply({"directory_tree": tree(root)})

    def window_size(self, b: dict[str, Any]) -> Reply:
        wins = find(self.x.windows(), str(b.get("app_class_name", "")), by_class=True)
        if not wins:
            return json_reply({"error": "no such window"}, 404)
        return json_reply({"width": wins[0].width, "height": wins[0].height})

    def reset(self, b: dict[str, Any]) -> Reply:
        apps = b.get("apps")
        if apps is not None:
            self.m.startup_apps = [str(a) for a in apps]
        self.m.reset(wm_ready=self.x.wm_ready)
        # the start-up apps' windows, with the patience of /setup/launch: a loaded machine
        # (CI) can take well over 10 s to map an xterm
        deadline = time.monotonic() + 30.0
        ok = all(
            self.wait_for_window(
                lambda w, p=a.proc.pid: w.pid == p,
                deadline - time.monotonic(),
                gone=lambda p=a.proc: p.poll() is not None,
            )
            for a in self.m.apps
        )
        return json_reply(
            {
                "status": "success" if ok else "error",
                "home": str(self.m.home),
                "display": self.m.display,
            }
        )
