"""The desktop's life and death (marker `desktop`): a dead server, a killed app, a dead window
manager, the owner or server killed, a confined desktop reset; nothing is left behind. Needs
the Debian packages scripts/install-test-deps.sh installs."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import psutil
import pytest
import requests

from dart_ray.config import EnvConfig
from dart_ray.envs.base import EnvCrashed, EnvInputError
from dart_ray.envs.desktop.suite import demo, load_desktop_tasks
from dart_ray.envs.osworld.env import LocalDesktopEnv
from dart_ray.records import Action, ActionKind, Task
from dart_ray.testing.procs import alive
from tests.envs.desktop_demo import demo_actions, solve
from tests.envs.desktops import CFG

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="needs Xvfb (install-test-deps.sh)"),
]


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
        assert solve(env, task) == 1.0  # type: ignore[arg-type]
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
