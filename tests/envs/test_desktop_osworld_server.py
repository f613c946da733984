"""Our desktop server as OSWorld's own client (`desktop-env`'s PythonController and
SetupController) calls it (issue 28): form bodies where that client posts forms, the
endpoints it calls that we lacked, `~` in argument lists, `launch` answering at once, and a
reset that ends every process the desktop started. Requests are made the way that client
makes them (requests' `data=` for forms, `json=` elsewhere). Marker `desktop`."""

from __future__ import annotations

import io
import shutil
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import requests
from PIL import Image

from dart_ray.envs.desktop.spawn import spawn_server

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb (install-test-deps.sh)"),
]
TOKEN = "osworld-server-test-token"


class Server:
    def __init__(self, url: str) -> None:
        self.url = url
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"Bearer {TOKEN}"

    def post(self, path: str, timeout: float = 60, **kw: Any) -> requests.Response:
        return self.s.post(self.url + path, timeout=timeout, **kw)

    def get(self, path: str) -> requests.Response:
        return self.s.get(self.url + path, timeout=30)

    def sh(self, command: str) -> str:
        r = self.post("/setup/execute", json={"command": command, "shell": True})
        assert r.status_code == 200, r.text
        return str(r.json()["output"])

    def home(self) -> str:
        return self.sh("printf %s $HOME")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    proc, url = spawn_server(640, 480, "openbox", TOKEN)
    try:
        yield Server(url)
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture
def srv(server: Server) -> Server:
    r = server.post("/reset", json={})
    assert r.status_code == 200, r.text
    return server


def test_form_bodies_are_read_like_json(srv: Server) -> None:
    srv.sh("printf 'from the desktop' > ~/note.txt")
    # PythonController.get_file: requests.post(url + "/file", data={"file_path": path})
    r = srv.post("/file", data={"file_path": "~/note.txt"})
    assert (r.status_code, r.content) == (200, b"from the desktop")
    assert srv.post("/file", json={"file_path": "~/note.txt"}).content == b"from the desktop"
    srv.post("/setup/launch", json={"command": ["xterm"], "timeout": 30})
    # PythonController.get_vm_window_size: data={"app_class_name": ...}
    r = srv.post("/window_size", data={"app_class_name": "XTerm"})
    assert r.status_code == 200 and r.json()["width"] > 100, r.text
    for path, field in (("/file", "file_path"), ("/window_size", "app_class_name")):
        r = srv.post(path, data={"other": "x"})
        assert r.status_code == 400 and f"'{field}'" in r.json()["error"], r.text
    r = srv.post("/file", data=b"\xff", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]


def _png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), color).save(buf, format="PNG")
    return buf.getvalue()


def test_change_wallpaper_paints_the_desktop_and_wallpaper_returns_it(srv: Server) -> None:
    red = _png((220, 10, 10))
    r = srv.post("/setup/upload", data={"file_path": "~/red.png"}, files={"file_data": red})
    assert r.status_code == 200, r.text
    # SetupController._change_wallpaper_setup posts JSON {"path": ...}
    r = srv.post("/setup/change_wallpaper", json={"path": "~/red.png"})
    assert r.status_code == 200, r.text
    shot = Image.open(io.BytesIO(srv.get("/screenshot").content)).convert("RGB")
    assert shot.getpixel((630, 470)) == (220, 10, 10)  # a corner no window covers
    r = srv.post("/wallpaper")  # PythonController.get_vm_wallpaper
    assert (r.status_code, r.content) == (200, red)
    r = srv.post("/setup/change_wallpaper", json={})
    assert r.status_code == 400 and "'path'" in r.json()["error"]
    assert srv.post("/setup/change_wallpaper", json={"path": "~/nope.png"}).status_code == 404


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg (install-test-deps.sh)")
def test_recording_returns_an_mp4_of_the_display(srv: Server) -> None:
    r = srv.post("/start_recording")
    assert r.status_code == 200, r.text
    assert srv.post("/start_recording").status_code == 400  # one at a time, as OSWorld's
    time.sleep(1.5)
    r = srv.post("/end_recording")
    assert r.status_code == 200, r.text
    assert r.content[4:8] == b"ftyp" and len(r.content) > 1000
    assert srv.post("/end_recording").status_code == 400


def test_recording_without_ffmpeg_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from dart_ray.envs.desktop import protocol

    desk = object.__new__(protocol.Desktop)
    desk._recording = None
    monkeypatch.setattr(protocol.shutil, "which", lambda name: None)
    status, body, _ = desk.start_recording({})
    assert status == 501 and b"ffmpeg" in body


def test_execute_with_verification_polls_until_the_condition_holds(srv: Server) -> None:
    r = srv.post(
        "/setup/execute_with_verification",
        json={
            "command": "(sleep 1; touch ~/ready) >/dev/null 2>&1 &",
            "shell": True,
            "verification": {"command_success": "test -f ~/ready"},
            "max_wait_time": 10,
            "check_interval": 0.2,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["verification"] == "passed" and 0.5 < r.json()["wait_time"] < 9
    r = srv.post(
        "/setup/execute_with_verification",
        json={
            "command": "xterm -T 'Verified Terminal' >/dev/null 2>&1 &",
            "shell": True,
            "verification": {"window_exists": "verified terminal"},
            "max_wait_time": 30,
            "check_interval": 0.1,
        },
    )
    assert r.status_code == 200 and r.json()["verification"] == "passed", r.text
    r = srv.post(
        "/execute_with_verification",
        json={
            "command": ["true"],
            "verification": {"window_exists": "No Such Window"},
            "max_wait_time": 0.5,
            "check_interval": 0.1,
        },
    )
    assert r.status_code == 500 and r.json()["status"] == "verification_failed"
    r = srv.post("/setup/execute_with_verification", json={"command": ["true"]})
    assert r.status_code == 200 and r.json()["returncode"] == 0
    r = srv.post(
        "/setup/execute_with_verification",
        json={"command": ["true"], "verification": {"file_exists": "x"}},
    )
    assert r.status_code == 400 and "file_exists" in r.json()["error"]


def test_execute_with_verification_answers_when_its_wait_runs_out(srv: Server) -> None:
    """A foreground command held the answer for its own 120 s limit: OSWorld's client gave
    up after max_wait_time + 10 s with no answer."""
    t0 = time.monotonic()
    r = srv.post(
        "/setup/execute_with_verification",
        json={
            "command": ["sleep", "60"],
            "verification": {"window_exists": "nope"},
            "max_wait_time": 2,
        },
    )
    assert r.status_code == 500 and r.json()["status"] == "verification_failed", r.text
    assert time.monotonic() - t0 < 10


def test_open_file_uses_the_desktops_default_application(srv: Server) -> None:
    """`/setup/open_file` always opened Mousepad; OSWorld's server opens the desktop's default
    application for the type (an .xlsx in Calc). Here the user's own association sends CSV
    to a terminal titled with the file, as a profile's mimeapps.list would send it to Calc."""
    srv.sh(
        "mkdir -p ~/.local/share/applications ~/.config && "
        "printf '[Desktop Entry]\\nType=Application\\nName=T\\nExec=xterm -T %%f\\n' "
        "> ~/.local/share/applications/term-open.desktop && "
        "printf '[Default Applications]\\ntext/csv=term-open.desktop\\n' > ~/.config/mimeapps.list && "
        "printf 'a,b\\n' > ~/numbers.csv && printf '\\0\\1' > ~/blob.unknownext"
    )
    r = srv.post("/setup/open_file", json={"path": "~/numbers.csv"})
    assert r.status_code == 200 and r.json()["status"] == "success", r.text
    titles = srv.post("/setup/execute", json={"command": "wmctrl -l", "shell": True}).json()
    assert f"{srv.home()}/numbers.csv" in titles["output"]  # the terminal, not Mousepad
    r = srv.post("/setup/open_file", json={"path": "~/blob.unknownext"})
    assert r.status_code == 500 and "no application is the default" in r.json()["message"]


def test_run_bash_script_honours_working_dir(srv: Server) -> None:
    srv.sh("mkdir -p ~/work/dir")
    r = srv.post("/run_bash_script", json={"script": "pwd", "working_dir": "~/work/dir"})
    assert r.status_code == 200 and r.json()["output"] == f"{srv.home()}/work/dir\n", r.text
    r = srv.post("/run_bash_script", json={"script": "pwd", "working_dir": "~/missing"})
    assert r.status_code == 400 and "working_dir" in r.json()["error"]
    r = srv.post("/run_bash_script", json={"working_dir": "~"})
    assert r.status_code == 400 and "'script'" in r.json()["error"]


def test_tilde_is_the_desktop_home_in_argument_lists(srv: Server) -> None:
    home = srv.home()
    code = "import sys; print(sys.argv[1:])"
    r = srv.post("/execute", json={"command": ["python", "-c", code, "~/a.txt", "~", "a~/b"]})
    assert r.json()["output"] == f"{[f'{home}/a.txt', home, 'a~/b']}\n"
    r = srv.post("/setup/launch", json={"command": ["cp", "/etc/hostname", "~/copied"]})
    assert r.status_code == 200
    time.sleep(0.5)
    assert srv.post("/file", data={"file_path": "~/copied"}).status_code == 200


def test_launch_answers_at_once_and_runs_the_program_once(srv: Server) -> None:
    t0 = time.monotonic()
    r = srv.post("/setup/launch", json={"command": ["sleep", "300"]}, timeout=10)  # no window
    assert r.status_code == 200 and time.monotonic() - t0 < 5, r.text
    assert psutil.Process(r.json()["pid"]).is_running()
    # a program that exits at once: launched once (not retried), not an error
    r = srv.post("/setup/launch", json={"command": ["sh", "-c", "echo x >> ~/count"]})
    assert r.status_code == 200, r.text
    time.sleep(0.5)
    assert srv.post("/file", data={"file_path": "~/count"}).content == b"x\n"
    # shell: true runs the line through a shell (variables, redirection)
    r = srv.post("/setup/launch", json={"command": "echo $HOME > ~/via-shell", "shell": True})
    assert r.status_code == 200, r.text
    time.sleep(0.5)
    home = srv.home()
    assert srv.post("/file", data={"file_path": "~/via-shell"}).content == f"{home}\n".encode()
    # our extension: wait for the window, told whether it showed
    r = srv.post(
        "/setup/launch", json={"command": "xterm -T Shelled", "shell": True, "timeout": 30}
    )
    assert r.json()["window"] is True, r.text
    r = srv.post("/setup/launch", json={"command": ["no-such-program-here"]})
    assert r.status_code == 400 and "no-such-program-here" in r.text


def test_an_app_the_agent_ends_leaves_no_zombie(srv: Server) -> None:
    """`pkill chrome` in a terminal, then waiting until `pgrep` says it is gone (how a task's
    solution makes a browser write its settings first): the launched app stayed a zombie of
    the server, which pgrep lists, so the wait never ended."""
    pid = srv.post("/setup/launch", json={"command": ["sleep", "302"]}).json()["pid"]
    srv.sh(f"kill {pid}")
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not psutil.pid_exists(pid)  # reaped, not a zombie
    assert srv.sh("pgrep -f '[s]leep 302' || echo none").strip() == "none"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_reset_ends_every_process_the_desktop_started(srv: Server) -> None:
    pids = [srv.post("/setup/launch", json={"command": ["sleep", "301"]}).json()["pid"]]
    pids.append(int(srv.sh("sleep 302 >/dev/null 2>&1 & echo $!")))
    r = srv.post("/run_bash_script", json={"script": "sleep 303 >/dev/null 2>&1 & echo $!"})
    pids.append(int(r.json()["output"]))
    # one that leaves its process group: found by the desktop's mark in its environment
    out = srv.sh("setsid sleep 304 >/dev/null 2>&1 & sleep 0.3; pgrep -xf 'sleep 304'")
    pids.append(int(out.split()[0]))
    r = srv.post("/setup/launch", json={"command": "sleep 305 & sleep 306", "shell": True})
    time.sleep(0.3)
    pids += [p.pid for p in psutil.Process(r.json()["pid"]).children(recursive=True)]
    assert len(pids) >= 5 and not any(_gone(p) for p in pids)
    assert srv.post("/reset", json={}).status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    assert [p for p in pids if not _gone(p)] == []


def test_an_unknown_endpoint_leaves_the_connection_usable(server: Server) -> None:
    """The body of a request to an unknown endpoint was left unread on the kept-alive
    connection, and the client's next request on it failed as 'bad request syntax'."""
    r = server.post("/no/such/endpoint", json={"path": "x" * 200})
    assert r.status_code == 404
    assert server.get("/health").json() == {"status": "ok", "display": True}


def test_our_client_runs_the_new_setup_steps() -> None:
    """OSWorld task configs use `execute_with_verification` and `change_wallpaper` steps,
    which our client once refused as unknown types."""
    from dart_ray.config import EnvConfig
    from dart_ray.envs.osworld.env import LocalDesktopEnv
    from dart_ray.records import Task

    env = LocalDesktopEnv(EnvConfig(kind="desktop", screen_width=640, screen_height=480))
    draw = "from PIL import Image; Image.new('RGB', (4, 4), (10, 10, 200)).save('blue.png')"
    config = [
        {
            "type": "execute_with_verification",
            "parameters": {
                "command": ["python", "-c", draw],
                "verification": {"command_success": "test -f ~/blue.png"},
            },
        },
        {"type": "change_wallpaper", "parameters": {"path": "~/blue.png"}},
    ]
    try:
        obs = env.reset(Task("wp", "x", "desktop", {"config": config, "evaluator": {}}))
        img = Image.open(io.BytesIO(obs.screenshot)).convert("RGB")
        assert img.getpixel((630, 470)) == (10, 10, 200)
    finally:
        env.close()
