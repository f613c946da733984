"""The desktop behind our OSWorld-protocol server: Xvfb, a window manager, Debian apps, a HOME.

OSWorld resets a desktop by reverting a VM snapshot. Here a reset is cheaper and just as clean
for what our tasks touch: every application is killed, HOME is replaced by a fresh empty
directory, the window manager is restarted if it died, and the configured start-up apps are
launched again. The X server itself lives for the whole session (it holds no user state).

Xvfb runs with `-nolisten tcp` and a private MIT-MAGIC-COOKIE in its own auth file, so only
processes given that file (ours) can connect to the display.

Applications are tracked: the server reports an app that ended by a signal it did not send
(killed, segfault) as *crashed* (`GET /apps`). That is the episode's state, not the machine's
failure: the agent may close or kill an app (`pkill`, a window's close button), and the end
state is scored as OSWorld scores it. What breaks the machine is the server not answering or
the X display dying (`GET /health` says `display: false`); the client turns either into
`EnvCrashed`, so the episode is aborted rather than scored.

A reset ends every process the desktop started, not only the apps: whatever `/setup/execute`,
`/run_bash_script` or `/setup/launch` left running (a `socat` listener, a `nohup ... &`) would
otherwise live on into the next episode, holding ports and files. Each such process runs in
its own process group, which is remembered while it has members; and every process on the
desktop carries a marker in its environment, so one that left its group (`setsid`, a daemon's
double fork) is still found.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

APPS: dict[str, list[str]] = {
    # name -> argv; xterm logs its output so /terminal can return what it shows
    "xterm": ["xterm", "-T", "Terminal", "-geometry", "100x30+40+40", "-l", "-lf", "{log}"],
    "mousepad": ["mousepad"],
}


class DesktopError(RuntimeError):
    """The desktop could not do what was asked (an X server that will not start, say)."""


@dataclass
class App:
    name: str
    proc: subprocess.Popen[bytes]
    stopping: bool = False

    @property
    def crashed(self) -> bool:
        rc = self.proc.poll()
        return rc is not None and rc < 0 and not self.stopping


@dataclass
class Machine:
    """One X display with a window manager and the apps started on it."""

    width: int = 1024
    height: int = 768
    window_manager: str = "openbox"
    startup_apps: list[str] = field(default_factory=list)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dart-desktop-")))
    display: str = ""
    home: Path = Path()
    apps: list[App] = field(default_factory=list)
    _xvfb: subprocess.Popen[bytes] | None = None
    _wm: subprocess.Popen[bytes] | None = None
    _resets: int = 0
    _groups: set[int] = field(default_factory=set)
    marker: str = field(default_factory=lambda: secrets.token_hex(8))
    fixed_home: Path | None = None
    """A HOME at one path (OSWorld's /home/user, `profile.py`) emptied at every reset."""
    skeleton: Path | None = None
    """Files copied into HOME at every reset, when this folder exists (`profile.SKELETON`)."""
    wm_args: list[str] = field(default_factory=list)
    atspi: bool = False
    """Give the desktop a D-Bus session bus and let apps publish their widgets over AT-SPI
    (`/accessibility` then walks them; the OSWorld profile turns it on)."""
    dbus_address: str = ""
    _dbus: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the X server and the desktop on it.

        Call it from the thread that lives as long as the desktop (the server's main thread):
        the X server is asked to be sent SIGTERM when the thread that started it ends, so a
        server that is SIGKILLed (no handler runs, `close` never comes) still takes its X
        server down, and with it every app and the window manager (X clients end with their
        display)."""
        for tool in ("Xvfb", "xauth", self.window_manager):
            if shutil.which(tool) is None:
                raise DesktopError(
                    f"{tool} is not installed (scripts/install-test-deps.sh installs the desktop)"
                )
        auth = self.root / "Xauthority"
        auth.touch(mode=0o600)
        # the server loads every cookie in its -auth file whatever the display number; the
        # real number is only known once Xvfb picks it, so the cookie is added again for it
        cookie = secrets.token_hex(16)
        _xauth(auth, ":65000", cookie)
        r, w = os.pipe()
        self._xvfb = subprocess.Popen(
            [
                "Xvfb",
                "-displayfd",
                str(w),
                "-screen",
                "0",
                f"{self.width}x{self.height}x24",
                "-nolisten",
                "tcp",
                "-auth",
                str(auth),
                "-noreset",
            ],
            pass_fds=(w,),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,  # start() runs before any other thread
        )
        os.close(w)
        number = _read_display(r, self._xvfb)
        self.display = f":{number}"
        _xauth(auth, self.display, cookie)
        if self.atspi:
            self._start_dbus()
        self.reset()

    def _start_dbus(self) -> None:
        """A session bus for this desktop only. It runs without the desktop's marker, so a
        reset keeps it (and the AT-SPI registry it activates), like the X server."""
        if shutil.which("dbus-daemon") is None:
            raise DesktopError("dbus-daemon is not installed (scripts/install-osworld-desktop.sh)")
        env = {k: v for k, v in self.env().items() if k != MARKER}
        self._dbus = subprocess.Popen(
            ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self._dbus.stdout is not None
        address = self._dbus.stdout.readline().decode().strip()
        if not address:
            raise DesktopError(f"dbus-daemon did not start (exit {self._dbus.wait(5)})")
        self.dbus_address = address

    def env(self) -> dict[str, str]:
        """The environment of every process on this desktop."""
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        env = keep | {
            "DISPLAY": self.display,
            "XAUTHORITY": str(self.root / "Xauthority"),
            "HOME": str(self.home),
            "USER": os.environ.get("USER", "user"),
            "LOGNAME": os.environ.get("USER", "user"),
            "SHELL": "/bin/bash",
            "TERM": "xterm",
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
            "GSETTINGS_BACKEND": "memory",  # no dconf/dbus: settings live and die with the app
            "NO_AT_BRIDGE": "1",
            "PS1": r"\w$ ",
            MARKER: self.marker,
        }
        if self.atspi:
            del env["NO_AT_BRIDGE"]  # GTK's bridge stays off while it is set
            env |= self._atspi_env()
        return env

    def _atspi_env(self) -> dict[str, str]:
        """Apps publish their widgets: GTK through its AT-SPI bridge (on unless NO_AT_BRIDGE),
        Chromium and Qt (VLC) when asked, LibreOffice through its GTK3 plugin."""
        return {
            "DBUS_SESSION_BUS_ADDRESS": self.dbus_address,
            "ACCESSIBILITY_ENABLED": "1",
            "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1",
            "SAL_USE_VCLPLUGIN": "gtk3",
        }

    def reset(self, wm_ready: Callable[[], bool] = lambda: True) -> None:
        """Kill every app, fresh HOME, window manager up, start-up apps launched."""
        self.stop_apps()
        self._resets += 1
        if self.fixed_home is not None:
            _empty(self.fixed_home)
            self.home = self.fixed_home
        else:
            if self.home != Path() and self.home.exists():
                shutil.rmtree(self.home, ignore_errors=True)
            self.home = self.root / f"home-{self._resets}"
        _fill(self.home, self.skeleton)
        (self.root / "run").mkdir(mode=0o700, exist_ok=True)
        (self.home / ".bashrc").write_text("PS1='\\w$ '\n")
        self.ensure_wm(wm_ready)
        for name in self.startup_apps:
            self.launch_app(name)

    def ensure_wm(self, wm_ready: Callable[[], bool], timeout_s: float = 15.0) -> bool:
        """Start the window manager if it is not running and wait until it has announced
        itself: an app mapped before that may never be listed in `_NET_CLIENT_LIST`."""
        if self._wm is None or self._wm.poll() is not None:
            self._wm = self._spawn([self.window_manager, "--sm-disable", *self.wm_args])
        deadline = time.monotonic() + timeout_s
        while not wm_ready():
            if time.monotonic() > deadline or self._wm.poll() is not None:
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        self.stop_apps()
        for p in (self._wm, self._dbus, self._xvfb):
            if p is not None:
                _terminate(p)
        self._wm = self._xvfb = self._dbus = None
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ processes
    def _spawn(self, argv: list[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            cwd=cwd or self.home,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def launch(self, argv: list[str], name: str | None = None) -> App:
        """Start a program on the desktop and track it."""
        if not argv:
            raise ValueError("launch needs a command")
        if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
            raise FileNotFoundError(f"no program {argv[0]!r} on this desktop")
        app = App(name or Path(argv[0]).name, self._spawn(argv))
        self.apps.append(app)
        return app

    def launch_shell(self, command: str) -> App:
        """Start a shell command line on the desktop (OSWorld's `launch` with `shell: true`)
        and track it; the shell's process group holds what it starts."""
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=self.home,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        app = App(command.split(maxsplit=1)[0] if command.strip() else "sh", proc)
        self.apps.append(app)
        return app

    def launch_app(self, name: str, *args: str) -> App:
        if name not in APPS:
            return self.launch([name, *args])
        argv = [a.replace("{log}", str(self.root / "terminal.log")) for a in APPS[name]]
        return self.launch([*argv, *args], name)

    def stop_apps(self) -> None:
        """End the apps, then every other process this desktop started (see the module doc);
        the X server and the window manager stay."""
        for app in self.apps:
            app.stopping = True
            _terminate(app.proc)
        self.apps = []
        for pgid in self._groups:
            _killpg(pgid)
        self._groups.clear()
        keep = {p.pid for p in (self._xvfb, self._wm) if p is not None}
        for pid in _marked(MARKER, self.marker):
            if pid not in keep and pid != os.getpid():
                _kill(pid)

    def reap(self) -> None:
        """Collect every ended app: one the agent killed stays a zombie, which `pgrep` lists
        as running, until then. The server calls this every half second (as a VM's init)."""
        for app in list(self.apps):
            app.proc.poll()

    def track(self, pgid: int) -> None:
        """Remember a process group to end on the next reset, if it still has members (a
        command that finished leaves nothing; one that left `cmd &` behind does). Groups that
        have emptied are forgotten here, so a recycled group id is not killed later."""
        self._groups = {g for g in self._groups if _group_alive(g)}
        if _group_alive(pgid):
            self._groups.add(pgid)

    def display_alive(self) -> bool:
        """The X server is running: without it nothing on the desktop can be seen or used."""
        return self._xvfb is not None and self._xvfb.poll() is None

    def crashed_apps(self) -> list[App]:
        return [a for a in self.apps if a.crashed]

    def pids(self) -> list[int]:
        procs = [self._xvfb, self._wm, *(a.proc for a in self.apps)]
        return [p.pid for p in procs if p is not None and p.poll() is None]

    def terminal_text(self) -> str | None:
        """What the xterm printed (its log, without escape sequences), or None."""
        log = self.root / "terminal.log"
        if not any(a.name == "xterm" and a.proc.poll() is None for a in self.apps):
            return None
        raw = log.read_bytes().decode("utf-8", "replace") if log.exists() else ""
        return _strip_ansi(raw)


MARKER = "DART_DESKTOP"  # environment variable naming the desktop a process belongs to


def _fill(home: Path, skeleton: Path | None) -> None:
    """A fresh HOME's folders, and the skeleton's files where there is one."""
    for sub in ("Desktop", "Documents", ".config"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    if skeleton and skeleton.is_dir():
        shutil.copytree(skeleton, home, dirs_exist_ok=True)


def _empty(home: Path) -> None:
    """Remove everything inside `home` (which must exist and be ours), keeping the folder."""
    if not home.is_dir():
        raise DesktopError(
            f"the fixed HOME {home} does not exist (scripts/install-osworld-desktop.sh)"
        )
    for entry in home.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id now names someone else's group: not ours to kill
        return False
    return True


def _killpg(pgid: int, grace: float = 2.0) -> None:
    """SIGTERM a process group, SIGKILL what is left after `grace` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _marked(name: str, value: str) -> list[int]:
    """The processes whose environment has `name=value` (those we may read: our own user's)."""
    want = f"{name}={value}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours
            continue
        if want in env.split(b"\0"):
            out.append(int(entry.name))
    return out


def _terminate_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that forked us ends (Linux)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _xauth(path: Path, display: str, cookie: str) -> None:
    subprocess.run(
        ["xauth", "-f", str(path), "add", display, ".", cookie], check=True, capture_output=True
    )


def _read_display(fd: int, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    deadline = time.monotonic() + timeout
    buf = b""
    os.set_blocking(fd, False)
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 32)
            except BlockingIOError:
                chunk = None
            if chunk:
                buf += chunk
                if buf.endswith(b"\n"):
                    return int(buf)
            if proc.poll() is not None:
                raise DesktopError(f"Xvfb exited with status {proc.returncode}")
            time.sleep(0.02)
    finally:
        os.close(fd)
    proc.kill()
    raise DesktopError(f"Xvfb did not report a display within {timeout:g}s")


def _terminate(p: subprocess.Popen[bytes], grace: float = 2.0) -> None:
    """SIGTERM the process group, SIGKILL it after `grace` seconds, reap it."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(5)
    except ProcessLookupError:
        p.wait(5)


_ANSI = __import__("re").compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\r")


def _strip_ansi(s: str) -> str:
    return _ANSI.sub("", s)
