"""A real X desktop (Xvfb, openbox, xterm, Mousepad) behind our OSWorld-protocol server, driven
through the client (marker `desktop`). Needs the Debian packages scripts/install-test-deps.sh
installs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests

from dart_ray.config import EnvConfig
from dart_ray.envs.base import EnvInputError
from dart_ray.envs.desktop.suite import TASKS, load_desktop_tasks
from dart_ray.envs.osworld.env import LocalDesktopEnv
from dart_ray.records import Action, ActionKind, Task
from dart_ray.testing.procs import serving
from tests.envs.desktop_demo import demo_actions, solve

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb (install-test-deps.sh)"),
]


@pytest.mark.parametrize("task", load_desktop_tasks(), ids=lambda t: t.task_id)
def test_scripted_demos_solve_every_desktop_task(desk: LocalDesktopEnv, task: Task) -> None:
    assert solve(desk, task) == 1.0


def test_suite_has_terminal_editor_and_infeasible_tasks() -> None:
    ids = [t["id"] for t in TASKS]
    assert len(ids) >= 10 and len(set(ids)) == len(ids)
    assert sum(i.startswith("term-") for i in ids) >= 5
    assert sum(i.startswith("editor-") for i in ids) >= 3


def test_doing_nothing_or_giving_up_scores_zero(desk: LocalDesktopEnv) -> None:
    tasks = {t.task_id: t for t in load_desktop_tasks()}
    desk.reset(tasks["term-create-file"])
    assert desk.step(Action(ActionKind.FINISHED)).done
    assert desk.evaluate() == 0.0
    desk.reset(tasks["term-create-file"])
    desk.step(Action(ActionKind.CALL_USER))  # FAIL on a feasible task
    assert desk.evaluate() == 0.0
    desk.reset(tasks["infeasible-spreadsheet"])
    desk.step(Action(ActionKind.FINISHED))  # DONE on an infeasible task
    assert desk.evaluate() == 0.0


def test_reset_gives_a_fresh_home_and_restarts_apps(desk: LocalDesktopEnv) -> None:
    c = desk.client
    assert c is not None
    task = next(t for t in load_desktop_tasks() if t.task_id == "term-copy")
    desk.reset(task)
    c.execute("echo stale > ~/stale.txt", shell=True)
    pids = {a["pid"] for a in c.request("GET", "/apps").json()}
    desk.reset(task)
    assert c.file("~/stale.txt") is None
    assert c.file("~/report.txt") == b"Q3 numbers\n"  # this task's own setup, again
    new = {a["pid"] for a in c.request("GET", "/apps").json()}
    assert new and not new & pids


HOSTILE = [
    "'); import os; os.system('touch /tmp/dart-pwned-1'); ('",
    '"); __import__("os").system("touch /tmp/dart-pwned-2") #',
    "$(touch /tmp/dart-pwned-3) `touch /tmp/dart-pwned-4` \\' \\\" {x}",
]


def test_model_strings_are_typed_never_executed(desk: LocalDesktopEnv) -> None:
    task = Task(
        "quote",
        "type",
        "desktop",
        {
            "config": [
                {
                    "type": "upload_file",
                    "parameters": {"files": [{"path": "~/q.txt", "content": ""}]},
                },
                {"type": "open", "parameters": {"path": "~/q.txt"}},
            ],
            "evaluator": {"func": "infeasible"},
        },
    )
    for p in Path("/tmp").glob("dart-pwned-*"):
        p.unlink()
    desk.reset(task)
    assert desk.client is not None
    text = "\n".join(HOSTILE)
    actions = [
        *demo_actions([{"focus": "q.txt"}], desk.client.accessibility),
        Action(ActionKind.TYPE, text=text),
        Action(ActionKind.HOTKEY, text="ctrl s"),
    ]
    for a in actions:
        desk.step(a)
    assert desk.client.file("~/q.txt") == text.encode()
    assert not list(Path("/tmp").glob("dart-pwned-*"))
    # a hotkey that is not a key is refused before it becomes code: a failed step
    r = desk.step(Action(ActionKind.HOTKEY, text="ctrl'); import os; os.system('id"))
    assert not r.done and r.info["event"] == "invalid"
    assert r.info["error"].startswith("invalid action: unknown key")


def test_protocol_endpoints(desk: LocalDesktopEnv, tmp_path: Path) -> None:
    c = desk.client
    assert c is not None
    desk.reset(next(t for t in load_desktop_tasks() if t.task_id == "editor-replace"))
    assert c.request("GET", "/platform").text == "Linux"
    assert c.screen_size() == (800, 600)
    x, y = c.request("GET", "/cursor_position").json()
    assert 0 <= x < 800 and 0 <= y < 600
    home = c.request("POST", "/desktop_path", json={}).json()["desktop_path"]
    assert home.endswith("/Desktop")
    assert "style.txt - Mousepad" in c.accessibility()
    size = c.request("POST", "/window_size", json={"app_class_name": "Mousepad"}).json()
    assert size["width"] > 100 and size["height"] > 100
    r = c.request("POST", "/run_python", json={"code": "print(6 * 7)"}).json()
    assert (r["status"], r["output"], r["return_code"]) == ("success", "42\n", 0)
    r = c.request("POST", "/run_bash_script", json={"script": "echo $((6 * 7)) >&2; exit 3"}).json()
    assert (r["error"], r["return_code"]) == ("42\n", 3)
    assert c.file("~/nope.txt") is None
    tree = c.list_directory("~")
    assert tree is not None and {"name": "style.txt", "type": "file"} in tree["children"]
    # download_file from a server on loopback (the network is closed; so is OSWorld's, often)
    (tmp_path / "data.txt").write_text("from the web")
    with serving(tmp_path) as base:
        c.setup("download_file", {"url": f"{base}/data.txt", "path": "~/Documents/data.txt"})
    assert c.file("~/Documents/data.txt") == b"from the web"
    c.setup("close_window", {"window_name": "style.txt"})
    c.setup("launch", {"command": ["xterm"], "timeout": 30})
    c.execute("sleep 0.5", shell=False)
    assert "style.txt" not in c.accessibility()
    c.setup("activate_window", {"window_name": "Terminal", "strict": True})
    assert 'name="Terminal"' in c.accessibility() and 'active="true"' in c.accessibility()
    with pytest.raises(EnvInputError, match="no window"):
        c.setup("activate_window", {"window_name": "No Such Window"})
    # the terminal endpoint returns what the xterm printed
    for a in demo_actions(
        [{"focus": "Terminal"}, {"type": "echo marker-$((40 + 2))\n"}], c.accessibility
    ):
        desk.step(a)
    assert "marker-42" in (c.terminal() or "")


def test_bearer_token_is_required(desk: LocalDesktopEnv) -> None:
    assert desk.client is not None
    r = requests.get(desk.client.base + "/screenshot", timeout=10)
    assert r.status_code == 401
    r = requests.get(
        desk.client.base + "/screenshot", timeout=10, headers={"Authorization": "Bearer wrong"}
    )
    assert r.status_code == 401


def test_server_refuses_other_addresses_without_a_token() -> None:
    from dart_ray.envs.desktop.server import main

    with pytest.raises(SystemExit):
        main(["--host", "0.0.0.0", "--port", "0"])


def test_malformed_requests_get_clear_errors(desk: LocalDesktopEnv) -> None:
    c = desk.client
    assert c is not None
    with pytest.raises(EnvInputError, match="'command' is required"):
        c.request("POST", "/execute", json={})
    with pytest.raises(EnvInputError, match="unknown type 'teleport'"):
        desk.reset(Task("bad", "x", "desktop", {"config": [{"type": "teleport"}]}))
    with pytest.raises(EnvInputError, match="needs at least 640x480"):
        LocalDesktopEnv(EnvConfig(kind="desktop"))
    assert desk.healthy()
