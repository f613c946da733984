"""OSWorld's set-up steps (`/setup/*`) on one desktop: launch a program, open a file, act on
a window, upload and download files, set the wallpaper. `Desktop` (`protocol.py`) inherits
them; they use its machine (`m`), its window tree (`x`), its path rules (`_path`, `_argv`),
its command runner (`run`) and its wait for a window (`wait_for_window`)."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from dart_ray.envs.desktop import mime
from dart_ray.envs.desktop.machine import Machine
from dart_ray.envs.desktop.requests import BadRequest, Reply, json_reply
from dart_ray.envs.desktop.xwindows import XWindows, find


class SetupSteps:
    m: Machine
    x: XWindows
    wallpaper: Path | None

    def _path(self, p: Any, what: str = "path") -> Path:
        raise NotImplementedError

    def _argv(self, command: Any, shell: bool) -> list[str] | str:
        raise NotImplementedError

    def run(
        self,
        command: Any,
        shell: bool = False,
        timeout: float = 120.0,
        cwd: Path | None = None,
        merge_stderr: bool = False,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def wait_for_window(
        self, pred: Any, timeout: float = 10.0, gone: Callable[[], bool] = lambda: False
    ) -> bool:
        raise NotImplementedError

    def launch(self, b: dict[str, Any]) -> Reply:
        """Start a program and answer, as OSWorld's server does, without waiting for it: a
        program with no window (`socat ...`) or one that exits at once is launched once and
        is not an error. `shell: true` runs the command line through a shell.

        Ours: `timeout` (seconds) waits up to that long for a window of the launched process
        group, so the next setup step finds it; the answer says whether one showed
        (`window`) and, for a program that already ended, its `returncode`."""
        shell = bool(b.get("shell", False))
        command = b.get("command")
        if command is None or command == "" or command == []:
            raise BadRequest("'command' is required")
        wm = self.m.ensure_wm(self.x.wm_ready)
        if shell:
            cmdline = self._argv(command, True)
            assert isinstance(cmdline, str)
            app = self.m.launch_shell(cmdline)
        else:
            argv = self._argv(command, False)
            assert isinstance(argv, list)
            try:
                app = self.m.launch_app(argv[0], *argv[1:])
            except FileNotFoundError as e:
                raise BadRequest(str(e)) from None
        proc = app.proc
        shown = False
        wait = b.get("timeout")
        if wait is not None:

            def ours(w: Any) -> bool:
                try:
                    return w.pid == proc.pid or os.getpgid(w.pid) == proc.pid
                except (ProcessLookupError, PermissionError, OSError):
                    return False

            shown = self.wait_for_window(ours, float(wait), gone=lambda: proc.poll() is not None)
        code = proc.poll()
        reply: dict[str, Any] = {
            "status": "success",
            "message": f"{app.name} launched successfully",
            "pid": proc.pid,
            "window": shown,
        }
        if code is not None:
            reply["returncode"] = code
            reply["message"] += f" (it has already exited with status {code})"
        elif wait is not None and not shown:
            reply["message"] += f" (no window within {float(wait):g}s"
            reply["message"] += (
                ")" if wm else f"; the window manager {self.m.window_manager!r} is not running)"
            )
        return json_reply(reply)

    def open_file(self, b: dict[str, Any]) -> Reply:
        """Open the file with the desktop's default application for its type, as OSWorld's
        server does (`mime.default_command`: an .xlsx in Calc where LibreOffice is the
        default), then wait for a window that names it. Text with no default opens in
        Mousepad, this desktop's editor; another type with none is an error saying so."""
        path = self._path(b.get("path"))
        if not path.exists():
            return json_reply({"status": "error", "message": f"{path} does not exist"}, 404)
        argv = mime.default_command(path, self.m.env(), self.m.home)
        if argv is None and mime.mime_type(path).startswith("text/"):
            argv = ["mousepad", str(path)]
        if argv is None:
            why = f"no application is the default for {mime.mime_type(path)} ({path.name})"
            return json_reply({"status": "error", "message": why}, 500)
        try:
            self.m.launch(argv)  # as the entry says (launch_app would add our xterm flags)
        except FileNotFoundError as e:
            return json_reply({"status": "error", "message": str(e)}, 500)
        ok = self.wait_for_window(lambda w: path.stem.lower() in w.name.lower())
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

    def upload(self, b: dict[str, Any]) -> Reply:
        data = b.get("file_data")
        if "file_path" not in b or data is None:
            raise BadRequest("multipart form needs 'file_path' and 'file_data'")
        path = self._path(str(b["file_path"]).strip(), "file_path")
        if isinstance(data, str):
            data = data.encode()
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

    def change_wallpaper(self, b: dict[str, Any]) -> Reply:
        """OSWorld's `/setup/change_wallpaper`: the image at `path`, scaled to the screen, on
        the root window (there is no GNOME here). `/wallpaper` then returns that file."""
        path = self._path(b.get("path"))
        if not path.is_file():
            return json_reply({"status": "error", "message": f"{path} does not exist"}, 404)
        try:
            with Image.open(path) as img:
                scaled = img.convert("RGB").resize((self.m.width, self.m.height))
        except OSError as e:
            raise BadRequest(f"{path} is not an image Pillow can read: {e}") from None
        self.x.set_background(scaled)
        self.wallpaper = path
        return json_reply({"status": "success", "message": f"wallpaper set to {path}"})
