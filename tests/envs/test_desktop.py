"""A real X desktop (Xvfb, openbox, xterm, Mousepad) behind our OSWorld-protocol server, driven
through the client (marker `desktop`). Needs the Debian packages scripts/install-test-deps.sh
installs."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from dart_ray.config import EnvConfig
from dart_ray.envs.base import EnvCrashed, EnvInputError
from dart_ray.envs.desktop.suite import TASKS, demo, load_desktop_tasks
from dart_ray.envs.osworld.env import LocalDesktopEnv
from dart_ray.records import Action, ActionKind, Task
from dart_ray.testing.procs import alive, serving
from tests.envs.desktop_demo import demo_actions
from tests.envs.desktops import CFG, desktop

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb (install-test-deps.sh)"),
]


@pytest.fixture(scope="module")
def desk() -> Iterator[LocalDesktopEnv]:
    yield from desktop()


def _solve(env: LocalDesktopEnv, task: Task) -> float:
    obs = env.reset(task)
    assert (obs.width, obs.height) == (800, 600)
    assert env.client is not None
    for a in demo_actions(demo(task.task_id), env.client.accessibility):
        env.step(a)
    return env.evaluate()


@pytest.mark.parametrize("task", load_desktop_tasks(), ids=lambda t: t.task_id)
def test_scripted_demos_solve_every_desktop_task(desk: LocalDesktopEnv, task: Task) -> None:
    assert _solve(desk, task) == 1.0


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


def test_a_dead_server_is_a_crash_and_leaves_nothing_behind() -> None:

    env = LocalDesktopEnv(CFG)
    env.reset(load_desktop_tasks()[0])  # Xvfb, openbox and an xterm are up
    orphans = [p for p in env.processes() if p != env._proc.pid]
    assert len(orphans) >= 3
    env._proc.kill()  # SIGKILL: the server cannot clean up after itself
    env._proc.wait()
    with pytest.raises(EnvCrashed, match="did not answer"):
        env.reset(load_desktop_tasks()[0])
    assert not env.healthy()
    env.close()
    _gone, left = psutil.wait_procs(alive(orphans), timeout=5)
    assert not left


@pytest.mark.usefixtures("ray_local")
def test_a_killed_app_is_scored_a_dead_display_or_frozen_server_aborted() -> None:
    import os
    import signal

    import ray

    from actors.env_session import start_session
    from dart_ray.envs.base import EnvAborted

    cfg = CFG.model_copy(
        update={
            "step_timeout_s": 20.0,
            "desktop": CFG.desktop.model_copy(update={"request_timeout_s": 4.0}),
        }
    )
    s = start_session(cfg, "desktop-crash")
    tasks = {t.task_id: t for t in load_desktop_tasks()}

    def solve(task: Task) -> float:
        obs = ray.get(s.reset.remote(task))
        latest = {"a11y": obs.accessibility or ""}
        for a in demo_actions(demo(task.task_id), lambda: latest["a11y"]):
            latest["a11y"] = ray.get(s.step.remote(a)).observation.accessibility or ""
        return ray.get(s.evaluate.remote())

    def named(name: str) -> list[int]:
        out = []
        for pid in ray.get(s.processes.remote()):
            try:
                if psutil.Process(pid).name() == name:
                    out.append(pid)
            except psutil.NoSuchProcess:  # a short-lived helper that already finished
                continue
        return out

    try:
        # 1. the editor is killed mid-episode (as an agent's `pkill` would): that is the
        # episode's state, scored (0: nothing saved), not a machine crash (it was aborted)
        ray.get(s.reset.remote(tasks["editor-type-save"]))
        (editor,) = named("mousepad")
        os.kill(editor, signal.SIGKILL)
        ray.get(s.step.remote(Action(ActionKind.TYPE, text="too late")))
        assert ray.get(s.evaluate.remote()) == 0.0
        # 2. the X display dies: the machine is broken, the episode aborted
        ray.get(s.reset.remote(tasks["editor-type-save"]))
        (xvfb,) = named("Xvfb")
        os.kill(xvfb, signal.SIGKILL)
        with pytest.raises(EnvAborted, match="X display died"):
            ray.get(s.step.remote(Action(ActionKind.WAIT)))
        # and a fresh desktop serves the next episode
        assert solve(tasks["editor-type-save"]) == 1.0
        # 3. the server freezes (SIGSTOP): requests time out, the session kills the whole
        # desktop and starts another
        frozen = ray.get(s.processes.remote())
        os.kill(frozen[0], signal.SIGSTOP)
        with pytest.raises(EnvAborted, match="did not answer"):
            ray.get(s.step.remote(Action(ActionKind.WAIT)))
        _, left = psutil.wait_procs(alive(frozen), timeout=10)
        assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE]
        assert solve(tasks["term-create-file"]) == 1.0
        st = ray.get(s.stats.remote())
        assert (st.aborted, st.recreations) == (2, 2)
    finally:
        ray.get(s.close.remote())
        ray.kill(s)


def test_emulator_pool_leases_a_fresh_desktop_per_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    from dart_ray.config import DesktopOptions
    from dart_ray.envs.desktop.pool import Pool, serve
    from dart_ray.envs.osworld.env import OSWorldEnv

    monkeypatch.setenv("DART_TEST_POOL_TOKEN", "pool-secret-for-this-test")
    pool = Pool("pool-secret-for-this-test", max_emulators=1, width=800, height=600)
    server = serve(pool)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    opts = DesktopOptions(pool_url=url, token_env="DART_TEST_POOL_TOKEN")
    env = OSWorldEnv(EnvConfig(kind="osworld", desktop=opts))
    try:
        task = next(t for t in load_desktop_tasks() if t.task_id == "term-create-file")
        assert _solve(env, task) == 1.0  # type: ignore[arg-type]
        first = env.emulator
        env.reset(task)  # the old desktop goes back, a new one comes (max 1 at a time)
        assert env.emulator != first
        assert [e["emulator_id"] for e in pool.listing()[1]["emulators"]] == [env.emulator]
        env.close()
        assert pool.listing()[1]["emulators"] == []
        bad = OSWorldEnv(EnvConfig(kind="osworld", desktop=DesktopOptions(pool_url=url)))
        with pytest.raises(EnvInputError, match="refused the bearer token"):
            bad.reset(task)
    finally:
        env.close()
        pool.close()
        server.shutdown()


def test_configured_apps_start_fresh_on_every_reset() -> None:
    from dart_ray.config import DesktopOptions

    env = LocalDesktopEnv(CFG.model_copy(update={"desktop": DesktopOptions(apps=["xterm"])}))
    try:
        empty = Task("empty", "x", "desktop", {"config": [], "evaluator": {"func": "infeasible"}})
        obs = env.reset(empty)
        assert 'name="Terminal"' in (obs.accessibility or "")
        assert env.client is not None
        first = [a["pid"] for a in env.client.request("GET", "/apps").json()]
        env.reset(empty)
        second = [a["pid"] for a in env.client.request("GET", "/apps").json()]
        assert len(first) == len(second) == 1 and first != second
    finally:
        env.close()


def test_a_dead_window_manager_is_restarted_before_an_app_is_launched(
    desk: LocalDesktopEnv,
) -> None:
    """Windows are found through the list the window manager keeps: an app launched while it
    is dead (or not yet up) never shows, and the launch failed after its whole timeout."""
    c = desk.client
    assert c is not None and desk._proc is not None
    desk.reset(next(t for t in load_desktop_tasks() if t.task_id == "term-copy"))
    server = psutil.Process(desk._proc.pid)
    wms = [p for p in server.children(recursive=True) if p.name() == "openbox"]
    assert wms
    for p in wms:
        p.kill()
    psutil.wait_procs(wms, timeout=10)
    r = c.request("POST", "/setup/launch", json={"command": ["xterm"], "timeout": 10})
    assert r.json()["status"] == "success"


def test_the_desktop_goes_when_the_process_that_started_it_is_killed() -> None:
    """A SIGKILLed EnvSession cannot stop its desktop server: the server notices it was
    re-parented and takes its X server and window manager down with it. (A server that is
    itself SIGKILLed: the next test.)"""
    import subprocess
    import sys

    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from dart_ray.envs.desktop.spawn import spawn_server\n"
            "proc, url = spawn_server(320, 240, 'openbox', 'tok')\n"
            "print(proc.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    server = psutil.Process(int(starter.stdout.readline()))
    desktop = [server, *server.children(recursive=True)]
    assert any(p.name() == "Xvfb" for p in desktop), [p.name() for p in desktop]
    starter.kill()  # SIGKILL: no handler runs
    starter.wait()
    gone, alive = psutil.wait_procs(desktop, timeout=20)
    assert not alive, [p.name() for p in alive]
    assert len(gone) == len(desktop)


def test_the_desktop_goes_when_its_server_is_killed() -> None:
    """A SIGKILLed desktop server runs no handler: before, its Xvfb, window manager and apps
    stayed up (two pairs orphaned after each CI run's fault tests, where Ray kills a dead
    EnvSession's children). The X server now gets SIGTERM when the server's main thread
    ends, and the X clients end with their display."""
    from dart_ray.envs.desktop.spawn import spawn_server

    proc, url = spawn_server(320, 240, "openbox", "tok")
    try:
        r = requests.post(
            f"{url}/setup/launch",
            json={"command": ["xterm"], "timeout": 10},
            headers={"Authorization": "Bearer tok"},
            timeout=30,
        )
        assert r.json()["status"] == "success", r.text
        server = psutil.Process(proc.pid)
        desktop = server.children(recursive=True)
        names = sorted(p.name() for p in desktop)
        assert "Xvfb" in names and "openbox" in names and "xterm" in names, names
        server.kill()  # SIGKILL: no handler, no finally
        _, alive = psutil.wait_procs(desktop, timeout=20)
        assert not alive, [p.name() for p in alive]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(
    __import__("os").geteuid() != 0, reason="confining a desktop needs root (a mount namespace)"
)
def test_a_confined_desktop_forgets_system_changes_and_daemons_at_reset() -> None:
    """Issue 45, point 6: what an episode changes in system folders (here as root, as the
    OSWorld profile's `sudo` would: a file in /etc, a package's files under /usr) and the
    daemons it leaves (`setsid`, out of the server's process group) are gone at the next
    reset, and the machine's own /etc never saw the file. Before, they persisted into the
    next episode on the same desktop."""
    import os
    import time

    marker = f"/etc/dart-confine-{os.getpid()}"
    cfg = EnvConfig.model_validate(
        {"kind": "desktop", "screen_width": 800, "screen_height": 600, "desktop": {"confine": True}}
    )
    env = LocalDesktopEnv(cfg)
    try:
        task = next(t for t in load_desktop_tasks() if t.task_id == "term-copy")
        env.reset(task)
        c = env.client
        assert c is not None
        c.execute(f"echo leaked > {marker} && mkdir -p /usr/local/lib/dart-pkg", shell=True)
        c.execute("setsid sleep 600 >/dev/null 2>&1 < /dev/null &", shell=True)
        time.sleep(0.5)
        inside = c.execute(f"cat {marker}; ls -d /usr/local/lib/dart-pkg", shell=True)
        assert "leaked" in inside["output"] and "dart-pkg" in inside["output"]
        assert not Path(marker).exists()  # the machine's /etc never had it
        daemons = [
            p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "600"]
        ]
        assert daemons
        env.reset(task)
        c = env.client
        assert c is not None
        after = c.execute(f"ls {marker} /usr/local/lib/dart-pkg 2>&1; echo done", shell=True)
        assert "No such file" in after["output"] and after["output"].count("No such file") == 2
        assert not _still_running(daemons)
    finally:
        env.close()
    assert not Path(marker).exists()


def _still_running(procs: list[psutil.Process], within_s: float = 5.0) -> list[psutil.Process]:
    """The processes still alive after up to `within_s` seconds: SIGKILL is delivered
    asynchronously, and a killed daemon that was re-parented stays a zombie (dead, holding
    only its pid) until its new parent reaps it, which this sandbox's init does late, and
    `is_running()` counts a zombie as running."""
    import time

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + within_s
    while any(alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in procs if alive(p)]
