"""OSWorld's own client (`desktop-env`'s PythonController and SetupController, in
.venv-osworld) against our desktop server: every call and setup step they offer that can run
offline works, checked through its effect on the desktop. Markers `desktop` and `osworld`.

The Chrome steps run on Debian's Chromium, without the OSWorld profile, launched through the
`launch` step with its debugging port on the port the SetupController is given
(`chromium_port`, as `DesktopEnv` passes it) and its profile where OSWorld's tasks keep it
(`~/.config/google-chrome`): `chrome_open_tabs` and `chrome_close_tabs` (Playwright's
`connect_over_cdp`: the pip package's driver, no browser download), checked in Chromium's own
tab list (`/json/list`); `update_browse_history`, whose empty History template OSWorld
downloads from Hugging Face unless the cache holds one, with a template made from this
Chromium (`dart_ray.envs.osworld.chrome_history`), checked in the uploaded file and on Chromium's
history page.

Not covered, because they cannot run here: `login` (signs in to Google Drive in Chrome with a
real account), `googledrive` (Google Drive's API with OAuth settings) and `proxy` (installs
tinyproxy with apt and chains it to a commercial proxy pool): all need the internet and
credentials. `tidy_desktop`, `act` and `replay` raise NotImplementedError in OSWorld itself.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from PIL import Image

from dart_ray.envs.desktop.spawn import spawn_server
from dart_ray.envs.osworld.chrome_history import CHROMIUMS, make_history_template
from dart_ray.testing.procs import serving
from tests.envs.desktops import serving_pages, two_visits
from tests.envs.osworld.venv import VENV, has_venv

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.osworld,
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb (install-test-deps.sh)"),
    has_venv,
]
TOKEN = "osworld-controllers-test-token"
CHROMIUM = next((c for c in CHROMIUMS if shutil.which(c)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (install-test-deps)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OSWorldClient:
    """OSWorld's controllers in their venv, called one JSON line at a time."""

    def __init__(self, url: str, cache: Path, chromium_port: int) -> None:
        self.cache, self.chromium_port = cache, chromium_port
        env = os.environ | {
            "OSW_URL": url,
            "OSW_TOKEN": TOKEN,
            "OSW_CACHE": str(cache),
            "OSW_CHROMIUM_PORT": str(chromium_port),
        }
        self.proc = subprocess.Popen(
            [str(VENV / "bin" / "python"), str(Path(__file__).with_name("rpc.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(cache / "rpc.stderr").open("w"),
            text=True,
            env=env,
            cwd=cache,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        stderr = (cache / "rpc.stderr").read_text()[-3000:]
        assert line and json.loads(line) == {"ready": True}, f"rpc.py did not start: {stderr}"

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def call_raw(self, obj: str, method: str, *args: Any, **kwargs: Any) -> Any:
        assert self.proc.stdin is not None
        call = {"obj": obj, "method": method, "args": args, "kwargs": kwargs}
        self.proc.stdin.write(json.dumps(call) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def call(self, obj: str, method: str, *args: Any, **kwargs: Any) -> Any:
        answer = self.call_raw(obj, method, *args, **kwargs)
        assert "raised" not in answer, f"{obj}.{method}: {answer['raised']}"
        return base64.b64decode(answer["bytes"]) if "bytes" in answer else answer["value"]

    def c(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call("controller", method, *args, **kwargs)

    def setup(self, kind: str, **parameters: Any) -> None:
        assert self.call("setup", "setup", [{"type": kind, "parameters": parameters}]) is True


class Desk:
    """Our own view of the same server, to check what OSWorld's calls did."""

    def __init__(self, url: str) -> None:
        self.url, self.s = url, requests.Session()
        self.s.headers["Authorization"] = f"Bearer {TOKEN}"

    def sh(self, command: str) -> str:
        r = self.s.post(self.url + "/execute", json={"command": command, "shell": True}, timeout=60)
        return str(r.json()["output"])

    def windows(self) -> str:
        return str(self.s.get(self.url + "/accessibility", timeout=30).json()["AT"])

    def active(self) -> str:
        """The name of the window that has the focus ("" for none)."""
        root = ET.fromstring(self.windows())
        return next(
            (w.get("name", "") for w in root.iter("window") if w.get("active") == "true"), ""
        )

    def wait_for(self, what: str, timeout_s: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while what not in self.windows():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)
        return True


class Chrome:
    """The desktop's Chromium, seen through its debugging port (where SetupController connects).

    OSWorld's tasks launch `google-chrome --remote-debugging-port=1337` and forward port 9222
    to it with socat (the profile's wrapper and socat); here Debian's Chromium listens on the
    port the SetupController was given, with its profile where OSWorld's is."""

    def __init__(self, osw: OSWorldClient, desk: Desk) -> None:
        assert CHROMIUM is not None
        self.base = f"http://127.0.0.1:{osw.chromium_port}"
        self.profile = desk.sh("echo $HOME").strip() + "/.config/google-chrome"
        root = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root without
        flags = ["--no-first-run", "--no-default-browser-check", *root]
        port = f"--remote-debugging-port={osw.chromium_port}"
        osw.setup("launch", command=[CHROMIUM, port, f"--user-data-dir={self.profile}", *flags])
        deadline = time.monotonic() + 30
        while not self._targets():
            assert time.monotonic() < deadline, "Chromium's debugging port did not answer"
            time.sleep(0.25)

    def _targets(self) -> list[dict[str, Any]]:
        try:
            r = requests.get(self.base + "/json/list", timeout=5)
        except requests.ConnectionError:
            return []
        return [t for t in r.json() if t["type"] == "page"]

    def tabs(self) -> list[str]:
        return sorted(t["url"] for t in self._targets())

    def page_text(self, url: str, expect: str, timeout_s: float = 20.0) -> str:
        """The text of the first tab after it goes to `url`, shadow DOM included (Chromium's
        own pages are web components), once it holds `expect` or the time is up."""
        websocket = pytest.importorskip("websocket")  # websocket-client, selenium's dependency
        ws = websocket.create_connection(
            self._targets()[0]["webSocketDebuggerUrl"], suppress_origin=True, timeout=10
        )
        walk = (
            "(() => { const t = n => { let s = n.shadowRoot ? t(n.shadowRoot) : '';"
            " for (const c of n.childNodes) s += c.nodeType === 3 ? c.textContent + ' ' : t(c);"
            " return s; }; return t(document.body); })()"
        )
        try:
            ws.send(json.dumps({"id": 1, "method": "Page.navigate", "params": {"url": url}}))
            json.loads(ws.recv())
            deadline, text = time.monotonic() + timeout_s, ""
            while expect not in text and time.monotonic() < deadline:
                time.sleep(0.25)
                params = {"expression": walk, "returnByValue": True}
                ws.send(json.dumps({"id": 2, "method": "Runtime.evaluate", "params": params}))
                text = str(json.loads(ws.recv())["result"]["result"].get("value", ""))
            return text
        finally:
            ws.close()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, url = spawn_server(640, 480, "openbox", TOKEN)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture(scope="module")
def osw(server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OSWorldClient]:
    client = OSWorldClient(server, tmp_path_factory.mktemp("osworld-cache"), free_port())
    yield client
    client.proc.kill()
    client.proc.wait()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a web server on this machine with pages a.html and b.html."""
    with serving_pages(tmp_path_factory.mktemp("pages")) as url:
        yield url


@pytest.fixture
def desk(server: str) -> Desk:
    d = Desk(server)
    assert d.s.post(server + "/reset", json={}, timeout=60).status_code == 200
    return d


def test_observations(osw: OSWorldClient, desk: Desk) -> None:
    png = osw.c("get_screenshot")
    assert Image.open(io.BytesIO(png)).size == (640, 480)
    osw.setup("launch", command=["xterm"])
    assert desk.wait_for("XTerm") or desk.wait_for("xterm")
    tree = osw.c("get_accessibility_tree")
    assert tree.startswith("<") and "window" in tree
    assert isinstance(osw.c("get_terminal_output"), str)
    assert osw.c("get_vm_platform") == "Linux"
    assert osw.c("get_vm_screen_size") == {"width": 640, "height": 480}
    assert osw.c("get_vm_window_size", "XTerm")["width"] > 100
    assert osw.c("get_vm_desktop_path").endswith("/Desktop")


def test_files_and_directories(osw: OSWorldClient, desk: Desk) -> None:
    desk.sh("mkdir -p ~/d && printf 'from the desktop' > ~/d/a.txt")
    assert osw.c("get_file", "~/d/a.txt") == b"from the desktop"
    assert osw.c("get_file", "~/d/missing.txt") is None
    tree = osw.c("get_vm_directory_tree", "~/d")
    assert [c["name"] for c in tree["children"]] == ["a.txt"]


def test_code_runs(osw: OSWorldClient, desk: Desk) -> None:
    # execute_python_command: ["python", "-c", "import pyautogui; ...; <code>"]
    assert osw.c("execute_python_command", "print(6 * 7)")["output"].strip() == "42"
    r = osw.c("run_python_script", "import sys\nprint(sys.argv[0] != None)")
    assert (r["status"], r["output"].strip()) == ("success", "True"), r
    r = osw.c("run_bash_script", "echo $((2 + 3)); pwd", timeout=20, working_dir="/tmp")
    assert (r["returncode"], r["output"].split()) == (0, ["5", "/tmp"]), r
    r = osw.c("run_bash_script", "exit 3")
    assert r["returncode"] == 3, r


def test_actions(osw: OSWorldClient, desk: Desk) -> None:
    osw.c("execute_action", {"action_type": "MOVE_TO", "parameters": {"x": 100, "y": 120}})
    assert desk.s.get(desk.url + "/cursor_position", timeout=30).json() == [100, 120]
    osw.setup("launch", command=["xterm"])
    assert desk.wait_for("XTerm") or desk.wait_for("xterm")
    osw.c("execute_action", {"action_type": "CLICK", "parameters": {"x": 320, "y": 240}})
    osw.c(
        "execute_action", {"action_type": "TYPING", "parameters": {"text": "echo typed > ~/t.txt"}}
    )
    osw.c("execute_action", {"action_type": "PRESS", "parameters": {"key": "enter"}})
    deadline = time.monotonic() + 20
    while desk.sh("cat ~/t.txt 2>/dev/null") != "typed\n" and time.monotonic() < deadline:
        time.sleep(0.25)
    assert desk.sh("cat ~/t.txt") == "typed\n"
    for a in ("WAIT", "DONE", "FAIL"):
        assert osw.c("execute_action", a) is None


def test_recording(osw: OSWorldClient, desk: Desk, tmp_path: Path) -> None:
    if shutil.which("ffmpeg") is None:
        pytest.skip("needs ffmpeg (install-test-deps.sh)")
    osw.c("start_recording")
    time.sleep(1.5)
    osw.c("end_recording", str(tmp_path / "rec.mp4"))
    assert (tmp_path / "rec.mp4").stat().st_size > 1000


def test_setup_files(osw: OSWorldClient, desk: Desk, tmp_path: Path) -> None:
    local = tmp_path / "up.txt"
    local.write_bytes(b"uploaded \x00 bytes")
    osw.setup("upload_file", files=[{"local_path": str(local), "path": "~/up.txt"}])
    assert osw.c("get_file", "~/up.txt") == b"uploaded \x00 bytes"
    # download: OSWorld's client fetches the URL itself (here a server on this machine), then
    # uploads it
    (tmp_path / "served.txt").write_text("served here")
    with serving(tmp_path) as base:
        osw.setup(
            "download", files=[{"url": f"{base}/served.txt", "path": "~/Downloads/served.txt"}]
        )
    assert desk.sh("cat ~/Downloads/served.txt") == "served here"


def test_setup_commands(osw: OSWorldClient, desk: Desk) -> None:
    osw.setup("execute", command=["bash", "-c", "echo {SCREEN_WIDTH} > ~/w.txt"], stdout="out.txt")
    assert desk.sh("cat ~/w.txt") == "1920\n"  # SetupController's own default screen width
    osw.setup("command", command="printf cmd > ~/c.txt", shell=True)
    assert desk.sh("cat ~/c.txt") == "cmd"
    # until: repeat the command until its output holds "3"
    osw.setup(
        "execute",
        command="echo x >> ~/n.txt; wc -l < ~/n.txt",
        shell=True,
        until={"stdout": "3"},
    )
    assert desk.sh("wc -l < ~/n.txt").strip() == "3"
    osw.setup("sleep", seconds=0.1)
    # the command returns at once (the app in the background, as OSWorld's tasks write it);
    # the server then waits for the window
    verify = {
        "command": "xterm -T verified >/dev/null 2>&1 &",
        "shell": True,
        "verification": {"window_exists": "verified", "command_success": "true"},
        "max_wait_time": 20,
    }
    osw.setup("execute_with_verification", **verify)
    assert desk.wait_for('name="verified"', 1)
    never = verify | {"command": "true", "verification": {"window_exists": "nope"}}
    never["max_wait_time"] = 1
    step = {"type": "execute_with_verification", "parameters": never}
    answer = osw.call_raw("setup", "setup", [step])
    assert "verification failed" in answer["raised"], answer


def test_setup_windows(osw: OSWorldClient, desk: Desk) -> None:
    desk.sh("printf 'opened' > ~/o.txt")
    osw.setup("open", path="~/o.txt")
    assert desk.wait_for("o.txt - Mousepad")
    osw.setup("launch", command="xterm -T other", shell=True)
    assert desk.wait_for('name="other"')
    # Mousepad titles the window with the file's full path: not strict. (OSWorld's client
    # only logs a window that is not found: the focus is the check.)
    osw.setup("activate_window", window_name="o.txt - Mousepad")
    deadline = time.monotonic() + 20
    while not desk.active().endswith("o.txt - Mousepad") and time.monotonic() < deadline:
        time.sleep(0.25)
    assert desk.active().endswith("/o.txt - Mousepad")
    osw.setup("close_window", window_name="other", strict=True)
    deadline = time.monotonic() + 20
    while 'name="other"' in desk.windows() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert 'name="other"' not in desk.windows()


def test_wallpaper(osw: OSWorldClient, desk: Desk) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "PNG")
    desk.s.post(
        desk.url + "/setup/upload",
        data={"file_path": "~/wall.png"},
        files={"file_data": ("wall.png", buf.getvalue())},
        timeout=60,
    )
    osw.setup("change_wallpaper", path="~/wall.png")
    assert osw.c("get_vm_wallpaper") == buf.getvalue()


@needs_chromium
def test_chrome_tabs(osw: OSWorldClient, desk: Desk, pages: str) -> None:
    chrome = Chrome(osw, desk)
    assert len(chrome.tabs()) == 1  # the tab it starts with (chrome://newtab/ here)
    a, b = pages + "/a.html", pages + "/b.html"
    # Playwright's connect_over_cdp: needs only the pip package's driver, no browser download
    osw.setup("chrome_open_tabs", urls_to_open=[a, b])
    assert chrome.tabs() == [a, b]  # and the tab Chromium opened with is closed
    osw.setup("chrome_close_tabs", urls_to_close=[a])  # (OSWorld waits 5 s first)
    assert chrome.tabs() == [b]


@needs_chromium
def test_update_browse_history(osw: OSWorldClient, desk: Desk, tmp_path: Path) -> None:
    history = two_visits()
    step = {"type": "update_browse_history", "parameters": {"history": history}}
    template = osw.cache / "history_new.sqlite"
    template.unlink(missing_ok=True)
    # without a template in the cache, OSWorld downloads one from Hugging Face: refused here
    assert "outside this machine" in osw.call_raw("setup", "setup", [step])["raised"]
    make_history_template(template)
    assert osw.call("setup", "setup", [step]) is True
    # uploaded where OSWorld puts Chrome's History on Linux: the desktop's
    # $HOME/.config/google-chrome/Default/History
    (tmp_path / "History").write_bytes(osw.c("get_file", "~/.config/google-chrome/Default/History"))
    with sqlite3.connect(tmp_path / "History") as db:
        rows = db.execute(
            "SELECT u.url, u.title, v.visit_time FROM urls u JOIN visits v ON v.url = u.id"
            " ORDER BY v.visit_time"
        ).fetchall()
    assert [r[:2] for r in rows] == [(h["url"], h["title"]) for h in history]
    # Chrome's time is microseconds since 1601: the two visits are 3600 - 60 = 3540 s apart
    assert abs((rows[1][2] - rows[0][2]) / 1e6 - 3540) < 5
    # and Chromium, started on that profile, lists both visits on its history page
    text = Chrome(osw, desk).page_text("chrome://history", "A minute ago")
    assert "A minute ago" in text and "An hour ago" in text
