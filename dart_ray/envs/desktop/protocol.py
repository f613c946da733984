"""The OSWorld in-VM protocol's operations on one desktop, apart from HTTP: observation
(screenshot, accessibility, files, windows), execution, recording and reset here; the set-up
steps (`/setup/*`: launch, open a file, windows, upload, download, wallpaper) in
`setup_steps`; request parsing and replies in `requests`.

Each method takes the request's body (JSON, or a form: see `parse_body`) and returns `(status, body bytes, content type)`;
`server.py` routes HTTP requests to them. Keeping the operations free of HTTP makes them easy
to read against the protocol description and leaves the transport (auth, limits) in one place.
A malformed request raises `BadRequest`, answered with 400 and its message.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import ImageDraw, ImageGrab

from dart_ray.envs.desktop import atspi_tree
from dart_ray.envs.desktop.machine import Machine
from dart_ray.envs.desktop.requests import BadRequest, Reply, json_reply, required
from dart_ray.envs.desktop.setup_steps import SetupSteps
from dart_ray.envs.desktop.xwindows import XWindows, find


class Desktop(SetupSteps):
    """The protocol's operations on one Machine."""

    def __init__(self, machine: Machine) -> None:
        self.m = machine
        os.environ["XAUTHORITY"] = str(machine.root / "Xauthority")  # for Pillow and Xlib
        self.x = XWindows(machine.display)
        self.wallpaper: Path | None = None
        self._recording: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ helpers
    def _home(self, p: str) -> str:
        if p == "~" or p.startswith("~/"):  # the desktop user's home, not the server's
            return str(self.m.home) + p[1:]
        return p

    def _path(self, p: Any, what: str = "path") -> Path:
        if p is None:
            raise BadRequest(f"'{what}' is required")
        if not isinstance(p, str) or not p:
            raise BadRequest(f"'{what}' must be a non-empty string")
        path = Path(self._home(p))
        return path if path.is_absolute() else self.m.home / path

    def _argv(self, command: Any, shell: bool) -> list[str] | str:
        if shell:
            if not isinstance(command, str):
                command = shlex.join(command)
            return command
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise BadRequest("'command' must be a string or a non-empty list of strings")
        # OSWorld's server expands `~/` in each argument (no shell does it for an argv);
        # here `~` is the desktop user's home, not the server's
        argv = [self._home(a) for a in argv]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        return argv

    def run(
        self,
        command: Any,
        shell: bool = False,
        timeout: float = 120.0,
        cwd: Path | None = None,
        merge_stderr: bool = False,
    ) -> dict[str, Any]:
        """Run a command to its end in its own process group. What it leaves running in the
        background (`cmd &`) is tracked, so the next reset ends it."""
        argv = self._argv(command, shell)
        try:
            proc = subprocess.Popen(
                argv,
                shell=shell,
                env=self.m.env(),
                cwd=cwd or self.m.home,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        except OSError as e:
            return {"status": "error", "output": "", "error": str(e), "returncode": -1}
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {
                "status": "error",
                "output": "",
                "error": f"timed out after {timeout:g}s",
                "returncode": -1,
            }
        finally:
            self.m.track(proc.pid)
        return {
            "status": "success",
            "output": out,
            "error": err or "",
            "returncode": proc.returncode,
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
        """The AT-SPI widget tree where the desktop has one (`atspi_tree.py`), else the window
        list the window manager publishes."""
        tree = atspi_tree.collect(self.m.env()) if self.m.atspi else None
        return json_reply({"AT": tree or self.x.tree_xml(self.m.width, self.m.height)})

    def health(self) -> Reply:
        """`{"status": "ok" | "down", "display": bool}`: down once the X server has died."""
        alive = self.m.display_alive()
        return json_reply({"status": "ok" if alive else "down", "display": alive})

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

    def execute_with_verification(self, b: dict[str, Any]) -> Reply:
        """OSWorld's `/setup/execute_with_verification`: run the command, then check the
        `verification` conditions every `check_interval` s for up to `max_wait_time` s:
        `window_exists` (a window title contains it, any case) and `command_success` (a shell
        command exits 0). 200 with `verification: passed` once all hold, 500 with
        `status: verification_failed` if they never do; no verification answers at once."""
        if "command" not in b:
            raise BadRequest("'command' is required")
        verification = b.get("verification") or {}
        if not isinstance(verification, dict):
            raise BadRequest("'verification' must be an object")
        unknown = set(verification) - {"window_exists", "command_success"}
        if unknown:
            raise BadRequest(
                f"unknown verification {sorted(unknown)}: known are window_exists, command_success"
            )
        try:
            max_wait = float(b.get("max_wait_time", 10))
            interval = max(float(b.get("check_interval", 1)), 0.05)
        except (TypeError, ValueError):
            raise BadRequest("'max_wait_time' and 'check_interval' must be numbers") from None
        # the answer comes within max_wait_time (OSWorld's client waits max_wait_time + 10 s):
        # the command gets that long, a foreground one still running then is ended (OSWorld's
        # tasks start their apps in the background, `app &`), and the checks get the rest
        start = time.monotonic()
        r = self.run(b["command"], bool(b.get("shell", False)), timeout=max(max_wait, 0.1))
        if not verification:
            return json_reply(r)

        def holds() -> bool:
            if "window_exists" in verification:
                want = str(verification["window_exists"]).lower()
                if not any(want in w.name.lower() for w in self.x.windows()):
                    return False
            if "command_success" in verification:
                check = self.run(verification["command_success"], shell=True, timeout=5)
                if check["returncode"] != 0:
                    return False
            return True

        while True:
            if holds():
                waited = time.monotonic() - start
                return json_reply(r | {"verification": "passed", "wait_time": waited})
            left = max_wait - (time.monotonic() - start)
            if left <= 0:
                break
            time.sleep(min(interval, left))
        failed = {"status": "verification_failed", "verification": "failed"}
        return json_reply(r | failed | {"wait_time": max_wait}, 500)

    def run_python(self, b: dict[str, Any]) -> Reply:
        code = b.get("code")
        if not isinstance(code, str):
            raise BadRequest("'code' must be a string")
        r = self.run([sys.executable, "-c", code], timeout=float(b.get("timeout", 120)))
        return json_reply(r | {"return_code": r["returncode"]})

    def run_bash_script(self, b: dict[str, Any]) -> Reply:
        """Run a bash script in `working_dir` (`~` is the desktop's home; default: home).
        A working_dir that does not exist is a 400, as in OSWorld's server."""
        script = required(b, "script")
        cwd = None
        if b.get("working_dir"):
            cwd = self._path(b["working_dir"], "working_dir")
            if not cwd.is_dir():
                raise BadRequest(f"working_dir {cwd} does not exist or is not a directory")
        r = self.run(["bash", "-c", script], timeout=float(b.get("timeout", 120)), cwd=cwd)
        return json_reply(r | {"return_code": r["returncode"]})

    def file(self, b: dict[str, Any]) -> Reply:
        path = self._path(b.get("file_path"), "file_path")  # a form field from OSWorld's client
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
        wins = find(self.x.windows(), required(b, "app_class_name"), by_class=True)
        if not wins:
            return json_reply({"error": "no such window"}, 404)
        return json_reply({"width": wins[0].width, "height": wins[0].height})

    def get_wallpaper(self, b: dict[str, Any]) -> Reply:
        """OSWorld's `POST /wallpaper`: the wallpaper's image file, 404 when none was set."""
        if self.wallpaper is None or not self.wallpaper.is_file():
            return json_reply({"error": "no wallpaper has been set on this desktop"}, 404)
        return 200, self.wallpaper.read_bytes(), "image/png"

    def start_recording(self, b: dict[str, Any]) -> Reply:
        """OSWorld's `/start_recording`: ffmpeg grabs the display (x11grab) into an mp4 until
        `/end_recording`, which answers with the file."""
        if self._recording is not None and self._recording.poll() is None:
            return json_reply({"status": "error", "message": "a recording is in progress"}, 400)
        if shutil.which("ffmpeg") is None:
            return json_reply(
                {
                    "status": "error",
                    "message": "recording needs ffmpeg, which is not installed on the desktop "
                    "host (scripts/install-test-deps.sh installs it)",
                },
                501,
            )
        out = self.m.root / "recording.mp4"
        out.unlink(missing_ok=True)
        fps = str(int(b.get("fps", 10)))  # low: the desktop shares its cores with the apps
        argv = [
            *("ffmpeg", "-nostdin", "-y", "-loglevel", "error", "-f", "x11grab"),
            *("-draw_mouse", "1", "-video_size", f"{self.m.width}x{self.m.height}"),
            *("-framerate", fps, "-i", self.m.display, "-c:v", "libx264"),
            *("-preset", "ultrafast", "-pix_fmt", "yuv420p", str(out)),
        ]
        self._recording = subprocess.Popen(
            argv,
            env=self.m.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:  # ffmpeg that cannot open the display or the encoder ends within a second
            self._recording.wait(1.0)
        except subprocess.TimeoutExpired:
            return json_reply({"status": "success", "message": "started recording"})
        err = (
            self._recording.stderr.read().decode(errors="replace") if self._recording.stderr else ""
        )
        self._recording = None
        return json_reply({"status": "error", "message": f"ffmpeg ended at once: {err}"}, 500)

    def end_recording(self, b: dict[str, Any]) -> Reply:
        rec, self._recording = self._recording, None
        if rec is None or rec.poll() is not None:
            return json_reply({"status": "error", "message": "no recording in progress"}, 400)
        rec.send_signal(signal.SIGINT)  # ffmpeg finishes the file on SIGINT
        try:
            _, err = rec.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            rec.kill()
            rec.communicate()
            return json_reply({"status": "error", "message": "ffmpeg did not stop; killed"}, 500)
        out = self.m.root / "recording.mp4"
        if not out.is_file() or out.stat().st_size == 0:
            why = err.decode(errors="replace") if err else ""
            return json_reply({"status": "error", "message": f"no recording written: {why}"}, 500)
        return 200, out.read_bytes(), "video/mp4"

    def stop_recording(self) -> None:
        rec, self._recording = self._recording, None
        if rec is not None and rec.poll() is None:
            rec.kill()
            rec.communicate()

    def reset(self, b: dict[str, Any]) -> Reply:
        self.stop_recording()
        self.wallpaper = None
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
