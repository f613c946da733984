"""A task's `config` setup steps (and an evaluator's `postconfig`) run on a desktop, as
OSWorld's SetupController runs them, by our own client.

Most steps are one request to the desktop's server (`launch`, `execute`, `open`, ...). The rest
happen on this side, as in OSWorld:

- `download`: OSWorld's SetupController first looks for `<task cache>/<uuid5(NAMESPACE_URL,
  url)>_<basename(path)>` and uploads that file; only when it is missing does it download.
  Ours does the same with `env.desktop.osworld_cache_dir/<task id>/` (the folder OSWorld's
  `DesktopEnv` gives the task, so one cache serves both); without the file the desktop's server
  downloads the URL itself (`/setup/download_file`), which needs the internet.
- `chrome_open_tabs`, `chrome_close_tabs`, `update_browse_history`: through Chrome's DevTools
  HTTP endpoints on the desktop's host (`dart_ray.envs.osworld.chrome`).
- `googledrive`, `login`, `proxy` need the internet and accounts: refused, saying so; `act`,
  `replay`, `tidy_desktop` are not implemented by OSWorld either.

`execute` (and `command`) follow OSWorld's `_execute_setup`: `{CLIENT_PASSWORD}`,
`{SCREEN_WIDTH}`, `{SCREEN_HEIGHT}`, `{SCREEN_WIDTH_HALF}`, `{SCREEN_HEIGHT_HALF}` are filled
in; `until` (`returncode`, or text in `stdout` / `stderr`) runs the command again every 0.3 s
until it holds (OSWorld waits without end; here `UNTIL_LIMIT_S`, then the step fails);
`stdout` / `stderr` name files in the task's cache folder that get the last run's output;
a non-zero exit is logged, not a failure, as in OSWorld. `launch` given one string without
`shell` is split on spaces, as OSWorld does.

Every refusal and failure is an EnvInputError naming the task, the step's index and its type.
With `env.desktop.evaluator = "osworld"` a task's steps go to OSWorld's own SetupController
instead (`OSWorldEvaluator.setup`); this runner serves our own desktop tasks.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dart_ray.config import DesktopOptions
from dart_ray.envs.base import EnvInputError
from dart_ray.envs.osworld import chrome as chrome_setup
from dart_ray.envs.osworld.client import OSWorldClient

log = logging.getLogger(__name__)

UNTIL_LIMIT_S = 120.0
"""How long an `execute` step's `until` may take to hold before the step fails."""
SERVER_STEPS = {
    "open": "open_file",
    "activate_window": "activate_window",
    "close_window": "close_window",
    "change_wallpaper": "change_wallpaper",
    "execute_with_verification": "execute_with_verification",
}
ONLINE = {
    "googledrive": "it reads and writes Google Drive through Google's API with OAuth settings",
    "login": "it signs in to a website in Chrome with a real account",
    "proxy": "it installs tinyproxy and chains it to a commercial proxy pool",
}
NOT_IN_OSWORLD = {"act", "replay", "tidy_desktop"}  # OSWorld raises NotImplementedError
HISTORY_PATH = (
    "import os; print(os.path.join(os.getenv('HOME'), '.config', 'google-chrome', 'Default', "
    "'History'))"
)


def cache_name(url: str, path: str) -> str:
    """The file name OSWorld's SetupController caches a `download` step's file under."""
    return f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{os.path.basename(path)}"


def cached_download(cache: Path | None, task_id: str, url: str, path: str) -> Path | None:
    """The cached copy of a `download` step's file, or None when there is none."""
    if cache is None:
        return None
    file = cache / task_id / cache_name(url, path)
    return file if file.is_file() else None


@dataclass(frozen=True, slots=True)
class Screen:
    """What OSWorld's placeholders stand for."""

    width: int = 1920
    height: int = 1080
    password: str = ""

    def fill(self, command: str | list[str]) -> str | list[str]:
        """`command` with OSWorld's placeholders filled in (the halves before the wholes)."""
        subs = {
            "{CLIENT_PASSWORD}": self.password,
            "{SCREEN_WIDTH_HALF}": str(self.width // 2),
            "{SCREEN_HEIGHT_HALF}": str(self.height // 2),
            "{SCREEN_WIDTH}": str(self.width),
            "{SCREEN_HEIGHT}": str(self.height),
        }

        def one(text: str) -> str:
            for key, value in subs.items():
                text = text.replace(key, value)
            return text

        return one(command) if isinstance(command, str) else [one(str(a)) for a in command]


def run_step(
    c: OSWorldClient,
    options: DesktopOptions,
    task_id: str,
    i: int,
    step: Any,
    screen: Screen | None = None,
) -> None:
    """Run setup step `i` of task `task_id`; EnvInputError naming both if it cannot run."""
    if not isinstance(step, dict) or "type" not in step:
        raise EnvInputError(f"task {task_id}: setup step {i}: needs a 'type'")
    kind, p = step["type"], step.get("parameters", {})
    where = f"task {task_id}: setup step {i} ({kind})"
    if kind == "sleep":
        time.sleep(float(p.get("seconds", 1)))
    elif kind in ("execute", "command"):
        _execute(c, options, task_id, p, screen or Screen(), where)
    elif kind == "launch":
        command, shell = p["command"], bool(p.get("shell", False))
        if isinstance(command, str) and not shell and len(command.split()) > 1:
            command = command.split()
        c.setup("launch", {"command": command, "shell": shell})
    elif kind in SERVER_STEPS:
        c.setup(SERVER_STEPS[kind], p)
        time.sleep(float(p.get("wait", 0.0)))
    elif kind == "upload_file":
        for f in p.get("files", []):
            data = f["content"].encode() if "content" in f else Path(f["local_path"]).read_bytes()
            c.upload(f["path"], data)
    elif kind == "download":
        for f in p.get("files", []):
            hit = cached_download(options.osworld_cache_dir, task_id, f["url"], f["path"])
            if hit is not None:
                c.upload(f["path"], hit.read_bytes())
            else:
                c.setup("download_file", {"url": f["url"], "path": f["path"]})
    elif kind in ("chrome_open_tabs", "chrome_close_tabs", "update_browse_history"):
        _chrome_step(c, options, task_id, kind, p, where)
    elif kind in ONLINE:
        raise EnvInputError(f"{where}: needs the internet and credentials: {ONLINE[kind]}")
    elif kind in NOT_IN_OSWORLD:
        raise EnvInputError(f"{where}: OSWorld does not implement this step either")
    else:
        raise EnvInputError(f"{where}: unknown type {kind!r}")


def _execute(
    c: OSWorldClient, options: DesktopOptions, task_id: str, p: Any, screen: Screen, where: str
) -> None:
    command = screen.fill(p["command"])
    until: dict[str, Any] = p.get("until") or {}
    deadline = time.monotonic() + UNTIL_LIMIT_S
    while True:
        r = c.setup("execute", {"command": command, "shell": bool(p.get("shell", False))})
        out, err = str(r.get("output") or ""), str(r.get("error") or "")
        cache = options.osworld_cache_dir
        for key, text in (("stdout", out), ("stderr", err)):
            if p.get(key) and cache is not None:  # where OSWorld's getters read them
                name = str(p[key])
                if Path(name).name != name or name in (".", ".."):
                    raise EnvInputError(f"{where}: {key} {name!r} must be a file name")
                (cache / task_id).mkdir(parents=True, exist_ok=True)
                (cache / task_id / name).write_text(text)
        if r.get("returncode") not in (0, None):  # OSWorld logs it and goes on
            log.warning("%s: exit %s: %s", where, r.get("returncode"), err[-300:])
        held = (
            ("returncode" in until and r.get("returncode") == until["returncode"])
            or ("stdout" in until and str(until["stdout"]) in out)
            or ("stderr" in until and str(until["stderr"]) in err)
        )
        if not until or held:
            return
        if time.monotonic() > deadline:
            raise EnvInputError(f"{where}: 'until' {until} did not hold in {UNTIL_LIMIT_S:g} s")
        time.sleep(0.3)


def _chrome_step(
    c: OSWorldClient, options: DesktopOptions, task_id: str, kind: str, p: Any, where: str
) -> None:
    chrome = chrome_setup.DevTools(urlparse(c.base).hostname or "127.0.0.1", options.chromium_port)
    try:
        if kind == "chrome_open_tabs":
            chrome_setup.open_tabs(chrome, list(p["urls_to_open"]))
        elif kind == "chrome_close_tabs":
            chrome_setup.close_tabs(chrome, list(p["urls_to_close"]))
        else:
            _update_history(c, options.osworld_cache_dir, task_id, list(p["history"]))
    except EnvInputError as e:
        raise EnvInputError(f"{where}: {e}") from e
    except (KeyError, TypeError) as e:
        raise EnvInputError(f"{where}: parameters: {type(e).__name__}: {e}") from e
    except (OSError, RuntimeError, ValueError) as e:  # requests' errors are OSErrors
        raise EnvInputError(f"{where}: {type(e).__name__}: {e}") from e


def _update_history(
    c: OSWorldClient, cache: Path | None, task_id: str, history: list[dict[str, Any]]
) -> None:
    """The task's rows in an empty History database, uploaded over the desktop's Chrome one."""
    from dart_ray.envs.osworld.chrome_history import make_history_template

    with tempfile.TemporaryDirectory(prefix="dart-history-") as tmp:
        folder = cache / task_id if cache is not None else Path(tmp)
        template = chrome_setup.history_template(folder, make_history_template)
        data = chrome_setup.history_database(template, history)
    r = c.execute(["python", "-c", HISTORY_PATH])
    path = str(r.get("output", "")).strip()
    if r.get("returncode") not in (0, None) or not path.startswith("/"):
        raise EnvInputError(f"the desktop did not say where Chrome's History is: {r}")
    c.upload(path, data)
