"""Adversarial model responses through our desktop server: only the intended calls run.

A real `OSWorldEnv.step` posts the generated program to the real request handler of
`dart_ray.envs.desktop.server` and the real `Desktop.execute`, which starts the real
`python -c <code>` subprocess. The only stand-in is a `pyautogui` module on that subprocess's
path that records every call, with an audit hook that records anything else the program does
(processes, files, sockets, imports, exec, compile). No X display is needed: screenshots are
a blank PNG. The argv that reaches the subprocess is also parsed with `ast`.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

pytest.importorskip("Xlib", reason="needs the desktop extra")

from dart_ray.config import DesktopOptions, EnvConfig
from dart_ray.envs.desktop.protocol import Desktop
from dart_ray.envs.desktop.requests import json_reply
from dart_ray.envs.desktop.server import make_handler
from dart_ray.envs.osworld.env import OSWorldEnv
from dart_ray.envs.pyautogui_code import UnsafeAction, to_code
from dart_ray.records import Action, ActionKind
from dart_ray.uitars.actions import parse_response
from tests.envs.test_action_recorder import (
    COORDS,
    expected_calls,
    literal_calls,
    model_responses,
    typed,
)

FAKE_PYAUTOGUI = '''
"""Records every pyautogui call and every audited action of this process, written at exit."""
import atexit, json, os, sys

_calls, _events, _done = [], [], []
_QUIET = ("sys._getframe", "object.__getattr__", "sys._getframemodulename")


def _hook(event, args):
    if _done or event in _QUIET:
        return
    _events.append([event, repr(args[:1])[:80]])


sys.addaudithook(_hook)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def call(*args, **kwargs):
        _calls.append([name, list(args), kwargs])

    return call


@atexit.register
def _write():
    _done.append(1)
    with open(os.environ["RECORD_TO"], "w") as f:
        json.dump({"calls": _calls, "events": _events, "failsafe": FAILSAFE}, f)


FAILSAFE = True
'''


@dataclass
class FakeMachine:
    """What Desktop.run needs of a Machine: the subprocess environment, a home folder,
    somewhere to hand the process group of what a command leaves running (nothing here), and
    whether its display lives (`/health`, which the client reads after every step)."""

    home: Path
    record_to: Path
    lib: Path
    apps: tuple[()] = ()

    def env(self) -> dict[str, str]:
        return {
            "PYTHONPATH": str(self.lib),
            "RECORD_TO": str(self.record_to),
            "PATH": "/usr/bin:/bin",
        }

    def track(self, pgid: int) -> None:
        pass

    def display_alive(self) -> bool:
        return True  # no X here, and nothing that could die


class RecordingDesktop(Desktop):
    """The real protocol operations (execute -> run -> `python -c`), minus X: a blank screen."""

    def __init__(self, machine: FakeMachine) -> None:  # no X display: skip Desktop.__init__
        self.m = machine  # type: ignore[assignment]
        self.argvs: list[list[str]] = []

    def run(self, command: Any, shell: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        self.argvs.append(list(self._argv(command, shell)))
        return super().run(command, shell, timeout)

    def screenshot(self) -> tuple[int, bytes, str]:
        return 200, _PNG, "image/png"

    def accessibility(self) -> tuple[int, bytes, str]:
        return json_reply({"AT": "<desktop/>"})


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    return buf.getvalue()


_PNG = _png()


@pytest.fixture(scope="module")
def desktop(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[OSWorldEnv, RecordingDesktop]]:
    root = tmp_path_factory.mktemp("recording-desktop")
    (root / "lib").mkdir()
    (root / "lib" / "pyautogui.py").write_text(FAKE_PYAUTOGUI)
    (root / "home").mkdir()
    desk = RecordingDesktop(FakeMachine(root / "home", root / "record.json", root / "lib"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(desk, "t0ken-for-the-test"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    options = DesktopOptions(server_url=url, token_env="DART_TEST_DESKTOP_TOKEN", settle_s=0)
    mp = pytest.MonkeyPatch()
    mp.setenv("DART_TEST_DESKTOP_TOKEN", "t0ken-for-the-test")
    env = OSWorldEnv(EnvConfig(kind="osworld", desktop=options, wait_s=0))
    yield env, desk
    mp.undo()
    server.shutdown()
    server.server_close()


def _step_on_desktop(env: OSWorldEnv, desk: RecordingDesktop, action: Action) -> None:
    record = desk.m.record_to
    record.unlink(missing_ok=True)
    desk.argvs.clear()
    env._done = False
    result = env.step(action)
    if result.info.get("event") != "executed":  # invalid, WAIT, DONE, FAIL: nothing ran
        assert desk.argvs == [] and not record.exists()
        if result.info.get("event") == "invalid":
            assert not result.done and result.info["error"].startswith("invalid action: ")
            with pytest.raises(UnsafeAction):
                to_code(action)
        return
    want = expected_calls(action)
    # what reached the server: `python` (the server's interpreter) -c one program
    [argv] = desk.argvs
    assert argv[0] == sys.executable and argv[1] == "-c" and len(argv) == 3
    assert literal_calls(argv[2]) == want
    # what that program did: exactly the intended calls, and nothing else at all
    ran = json.loads(record.read_text())
    assert result.info["returncode"] == 0, result.info
    assert [tuple(c) for c in ran["calls"]] == [tuple(json.loads(json.dumps(c))) for c in want]
    assert ran["failsafe"] is False
    others = [e for e in ran["events"] if not (e[0] == "import" and "'time'" in e[1])]
    assert others == [], others
    if action.kind is ActionKind.TYPE:
        assert typed([tuple(c) for c in ran["calls"]]) == action.text  # type: ignore[misc]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=model_responses())
def test_adversarial_responses_through_the_desktop_server(
    desktop: tuple[OSWorldEnv, RecordingDesktop], text: str
) -> None:
    env, desk = desktop
    _step_on_desktop(env, desk, parse_response(text, COORDS).action)


@pytest.mark.parametrize(
    "action",
    [
        Action(ActionKind.TYPE, text="'); import os; os.system('touch pwned'); ('\n$(id)`id`\\"),
        Action(ActionKind.TYPE, text='"""\x00\u2028é中😀\r\t{0}%s'),
        Action(ActionKind.CLICK, point=(0.0, 719.0)),
        Action(ActionKind.HOTKEY, text="ctrl+shift+t"),
        Action(ActionKind.HOTKEY, text="ctrl'); import os; ('"),
        Action(ActionKind.SCROLL, point=(5.0, 5.0), direction="left"),
        Action(ActionKind.SCROLL, direction="down"),
        Action(ActionKind.FINISHED, text="'); import os; ('"),
    ],
)
def test_hand_picked_actions_through_the_desktop_server(
    desktop: tuple[OSWorldEnv, RecordingDesktop], action: Action
) -> None:
    env, desk = desktop
    _step_on_desktop(env, desk, action)
    assert not (desk.m.home / "pwned").exists()


def test_what_the_desktop_cannot_carry_out_is_a_failed_step_that_says_why(
    desktop: tuple[OSWorldEnv, RecordingDesktop],
) -> None:
    env, desk = desktop
    env._done = False
    for action, why in [
        (Action(ActionKind.HOTKEY, text="ctrl hyper"), "unknown key 'hyper'"),
        (Action(ActionKind.CLICK), "click needs a point"),
        # typed at 5 ms a character, 1,001 would take longer than a step may
        (
            Action(ActionKind.TYPE, text="x" * 1001),
            "type content has 1001 characters, more than 1000",
        ),
    ]:
        desk.argvs.clear()
        r = env.step(action)
        assert (r.done, r.info) == (False, {"event": "invalid", "error": f"invalid action: {why}"})
        assert desk.argvs == []  # nothing ran
    r = env.step(Action(ActionKind.TYPE, text="x" * 1000))
    assert r.info["event"] == "executed" and r.info["returncode"] == 0


def test_wait_pauses_for_env_wait_s(desktop: tuple[OSWorldEnv, RecordingDesktop]) -> None:
    """UI-TARS's wait() means 'pause 5 s and look again': the env sleeps env.wait_s (it was a
    fixed 1 s), runs nothing, and returns a fresh screenshot."""
    import time

    fixture_env, desk = desktop
    url = fixture_env._need_client().base
    options = DesktopOptions(server_url=url, token_env="DART_TEST_DESKTOP_TOKEN", settle_s=0)
    env = OSWorldEnv(EnvConfig(kind="osworld", desktop=options, wait_s=0.4))
    desk.argvs.clear()
    t0 = time.monotonic()
    r = env.step(Action(ActionKind.WAIT))
    assert time.monotonic() - t0 >= 0.4
    assert (r.done, r.info["event"], desk.argvs) == (False, "WAIT", [])


def test_the_recorder_would_see_a_smuggled_command(
    desktop: tuple[OSWorldEnv, RecordingDesktop],
) -> None:
    """A negative control: a program that does more than call pyautogui is caught."""
    env, desk = desktop
    desk.m.record_to.unlink(missing_ok=True)
    code = "import pyautogui, time; pyautogui.FAILSAFE = False; import os; os.system('true')"
    assert env._need_client().execute(["python", "-c", code])["returncode"] == 0
    ran = json.loads(desk.m.record_to.read_text())
    assert ran["calls"] == []
    assert [e[0] for e in ran["events"] if e[0] != "import"] == ["os.system"]


def test_the_server_wants_the_token_and_names_bad_fields(
    desktop: tuple[OSWorldEnv, RecordingDesktop],
) -> None:
    """The handler that runs code, started for real: 401 without the right token (and nothing
    runs), 400 naming the problem for a malformed body."""
    import requests

    env, desk = desktop
    url = env._need_client().base
    body = {"command": ["python", "-c", "import pyautogui; pyautogui.click(1, 1)"]}
    desk.argvs.clear()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "t0ken-for-the-test"}):
        r = requests.post(url + "/execute", json=body, headers=headers, timeout=10)
        assert r.status_code == 401 and "bearer token" in r.json()["error"]
        assert requests.get(url + "/screenshot", headers=headers, timeout=10).status_code == 401
    assert desk.argvs == []  # nothing ran
    ok = {"Authorization": "Bearer t0ken-for-the-test"}
    for raw, message in [
        (b"{not json", "Expecting property name"),
        (b"[1, 2]", "the body must be a JSON object"),
        (b"{}", "'command' is required"),
        (b'{"command": []}', "'command' must be a string or a non-empty list of strings"),
        (b'{"command": ["python", 3]}', "'command' must be a string or a non-empty list"),
    ]:
        r = requests.post(url + "/execute", data=raw, headers=ok, timeout=10)
        assert r.status_code == 400 and message in r.json()["error"], (raw, r.text)
    assert desk.argvs == []
