"""OSWorld's own evaluator, run inside `.venv-osworld` (scripts/setup-osworld-venv.sh).

This file imports only the standard library, `requests` and `desktop_env` (never dart_ray):
it runs under that venv's interpreter as a child of `dart_ray.envs.osworld.official`, which
writes one JSON request a line on stdin and reads one JSON answer a line from stdout:

    -> {"task_id": "t1", "evaluator": {...}, "server_url": "http://127.0.0.1:PORT",
        "token": "..." | null, "last_action": "DONE" | "FAIL" | "code" | null,
        "cache_dir": "/tmp/..."}
    <- {"score": 1.0}  |  {"error": "task t1: ...", "kind": "offline" | "unavailable" |
                                                      "evaluator" | "input"}
    -> {"op": "setup", "task_id": "t1", "config": [{"type": ..., "parameters": ...}],
        "server_url": ..., "token": ..., "cache_dir": ..., "client_password": "..."}
    <- {"ok": true}  |  {"error": "task t1: setup: ...", "kind": "setup" | "offline" | "input"}

The score is `DesktopEnv.evaluate` itself, called on a stand-in object that carries what
OSWorld's getters read (`controller`: OSWorld's PythonController on the server,
`setup_controller`: its SetupController, `vm_ip`, `server_port`, `chromium_port`, `vlc_port`,
`cache_dir`, `action_history`, `vm_platform`), after `DesktopEnv._set_evaluator_info` has
resolved the task's metrics and getters: postconfig runs first, then OSWorld's rules for
infeasible tasks, FAIL, `conj`, `options` and getters raising.

Three things OSWorld's client does not do, added here around it rather than in it:
- Authentication: OSWorld's controllers call `requests` with no credentials; every request to
  the server's own origin gets `Authorization: Bearer <token>`, and no other request does.
- Offline: a request to any machine but the server's (and loopback) is refused. Getters catch
  errors widely and would turn that into a silent 0, so the refusal is remembered and the
  answer becomes an `offline` error naming the task, the getter and the URL.
- stdout: metrics `print()`; the protocol has its own copy of stdout and fd 1 goes to stderr.
A metric whose package the venv leaves out is refused up front, naming the task, the metric
and the package: those metrics catch every error and would score a silent 0.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import traceback
import types
from typing import Any
from urllib.parse import urlsplit

# Run as a script from dart_ray/envs/osworld/, whose folder Python puts first on sys.path: it
# holds modules named like common ones (setup, tasks, coverage, client), which must never
# shadow what OSWorld's code imports.
if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
    sys.path.pop(0)

# Packages the setup script leaves out, and the metrics that need them (the script says why).
LEFT_OUT = {"easyocr": ["compare_image_text"], "librosa": ["compare_audios"]}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# Getters that fetch from the internet through a browser (Playwright) or Google's client,
# where the request guard below cannot see them: refused before anything runs.
BROWSER_ONLINE = {
    "active_tab_info",
    "googledrive_file",
    "gotoRecreationPage_and_get_html_content",
    "info_from_website",
    "number_of_search_results",
    "page_info",
    "pdf_from_url",
}


class Offline(Exception):
    """A getter tried to reach the internet."""


def _stand_in(name: str, metrics: list[str]) -> types.ModuleType:
    """A module that imports but raises on first use, naming what needs the real one."""
    mod = types.ModuleType(name)

    def missing(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(
            f"{name} is not installed in the OSWorld venv (it pulls torch or numba); "
            f"metric(s) {', '.join(metrics)} cannot run here"
        )

    mod.__getattr__ = missing  # type: ignore[method-assign]
    return mod


def import_desktop_env() -> tuple[Any, list[str]]:
    """OSWorld's DesktopEnv class and the metrics that cannot run in this venv."""
    unavailable = []
    for name, metrics in LEFT_OUT.items():
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = _stand_in(name, metrics)
            unavailable += metrics
    # importing SetupController reads a proxy file relative to the working folder and a .env
    # file: neither exists here, and it tolerates both
    from desktop_env.desktop_env import DesktopEnv

    importlib.import_module("desktop_env.evaluators.getters")
    importlib.import_module("desktop_env.evaluators.metrics")
    return DesktopEnv, unavailable


class Network:
    """Adds the bearer token to requests for the server, refuses those that leave the host."""

    def __init__(self) -> None:
        self.origin = ""
        self.token: str | None = None
        self.refused: list[str] = []

    def allowed(self, host: str | None) -> bool:
        """Loopback, or the server's machine (its VLC and Chrome ports are OSWorld's too)."""
        return host in LOOPBACK or host == urlsplit(self.origin).hostname

    def install(self) -> None:
        import requests

        original = requests.sessions.Session.request
        net = self

        def request(session: Any, method: str, url: str, *a: Any, **kw: Any) -> Any:
            parts = urlsplit(str(url))
            if f"{parts.scheme}://{parts.netloc}" == net.origin:
                if net.token:
                    headers = dict(kw.pop("headers", None) or {})
                    headers["Authorization"] = f"Bearer {net.token}"
                    kw["headers"] = headers
            elif not net.allowed(parts.hostname):
                net.refused.append(str(url))
                raise Offline(f"{url} is outside this machine")
            return original(session, method, url, *a, **kw)

        requests.sessions.Session.request = request  # type: ignore[method-assign]
        # OSWorld's URL metrics (compare_urls, via tldextract) would first fetch the public
        # suffix list from publicsuffix.org; the snapshot tldextract ships serves offline
        import tldextract

        tldextract.extract = tldextract.TLDExtract(suffix_list_urls=())


class Desktop:
    """What OSWorld's getters read from a DesktopEnv."""

    def __init__(self, req: dict[str, Any], server: Any, setup: Any) -> None:
        url = urlsplit(req["server_url"])
        self.vm_ip = url.hostname
        self.server_port = url.port or 80
        self.chromium_port = int(req.get("chromium_port", 9222))
        self.vlc_port = int(req.get("vlc_port", 8080))
        self.vnc_port = 0
        self.cache_dir = req["cache_dir"]
        self.cache_dir_base = req["cache_dir"]
        self.task_id = req["task_id"]
        self.controller = server(vm_ip=self.vm_ip, server_port=self.server_port)
        self.setup_controller = setup(
            vm_ip=self.vm_ip,
            server_port=self.server_port,
            chromium_port=self.chromium_port,
            vlc_port=self.vlc_port,
            cache_dir=self.cache_dir,
            client_password="",
            screen_width=int(req.get("screen_width", 1920)),
            screen_height=int(req.get("screen_height", 1080)),
        )
        last = req.get("last_action")
        self.action_history = [] if last is None else [last]
        self.enable_proxy = False
        self.current_use_proxy = False
        self.is_environment_used = False

    @property
    def vm_platform(self) -> Any:
        return self.controller.get_vm_platform()


def _getter_names(evaluator: dict[str, Any]) -> list[str]:
    names = []
    for key in ("result", "expected"):
        part = evaluator.get(key)
        for g in part if isinstance(part, list) else [part]:
            if isinstance(g, dict) and "type" in g:
                names.append(str(g["type"]))
    return names


def _watch(env: Any, current: list[str]) -> None:
    """Wrap the resolved getters and metrics so that an error names the one that raised it
    (`current` holds the label of the last one called)."""

    def watch(fn: Any, label: str) -> Any:
        if fn is None:
            return None

        def call(*a: Any, **kw: Any) -> Any:
            current[:] = [label]
            return fn(*a, **kw)

        return call

    def label(kind: str, spec: Any) -> str:
        if kind == "getter":
            spec = spec.get("type", "?") if isinstance(spec, dict) else "?"
        return f"{kind} {str(spec)!r}"

    ev = env.evaluator
    funcs = ev["func"] if isinstance(ev["func"], list) else [ev["func"]]
    parts = [("metric", funcs, "metric")]
    parts += [(f"{k}_getter", ev.get(k), "getter") for k in ("result", "expected")]
    for attr, spec, kind in parts:
        got = getattr(env, attr, None)
        if isinstance(got, list) and isinstance(spec, list):  # one per metric
            labels = [label(kind, s) for s in spec]
            setattr(env, attr, [watch(g, lb) for g, lb in zip(got, labels, strict=True)])
        elif got is not None and not isinstance(got, list):  # a single metric
            one = spec[0] if isinstance(spec, list) else spec
            setattr(env, attr, watch(got, label(kind, one)))


def evaluate(
    req: dict[str, Any], desktop_env: Any, net: Network, unavailable: list[str]
) -> dict[str, Any]:
    """One answer: the score, or an error that names the task."""
    from desktop_env.controllers.python import PythonController
    from desktop_env.controllers.setup import SetupController

    task = req.get("task_id", "?")
    evaluator = req.get("evaluator")
    if not isinstance(evaluator, dict) or "func" not in evaluator:
        return {"error": f"task {task}: evaluator must be an object with 'func'", "kind": "input"}
    funcs = evaluator["func"] if isinstance(evaluator["func"], list) else [evaluator["func"]]
    missing = [f for f in funcs if f in unavailable]
    if missing:
        package = next(p for p, ms in LEFT_OUT.items() if missing[0] in ms)
        return {
            "error": f"task {task}: metric {missing[0]!r} needs {package}, which the OSWorld "
            "venv leaves out (it pulls torch or numba)",
            "kind": "unavailable",
        }
    online = sorted(set(_getter_names(evaluator)) & BROWSER_ONLINE)
    if online:
        return {
            "error": f"task {task}: getter {online[0]!r} needs the internet (through a browser); "
            "it cannot be scored offline",
            "kind": "offline",
        }
    url = urlsplit(str(req.get("server_url", "")))
    net.origin, net.token, net.refused = f"{url.scheme}://{url.netloc}", req.get("token"), []
    current: list[str] = ["postconfig"]
    try:
        os.makedirs(req["cache_dir"], exist_ok=True)
        env = Desktop(req, PythonController, SetupController)
        try:
            desktop_env._set_evaluator_info(env, {"evaluator": evaluator})
        except AttributeError as e:  # an unknown metric or getter name
            return {"error": f"task {task}: unknown to OSWorld: {e}", "kind": "input"}
        _watch(env, current)
        score = float(desktop_env.evaluate(env))
    except Exception as e:  # the answer carries it to the caller, named
        if net.refused:
            return _offline(task, current[0], net)
        tb = traceback.format_exc(limit=-3)
        return {
            "error": f"task {task}: {current[0]}: {type(e).__name__}: {e}\n{tb}",
            "kind": "evaluator",
        }
    if net.refused:  # a getter swallowed the refusal: its score would be a silent 0
        return _offline(task, current[0], net)
    return {"score": score}


def setup(req: dict[str, Any], net: Network) -> dict[str, Any]:
    """A task's `config` steps run by OSWorld's own SetupController on the server: its
    placeholders (`{CLIENT_PASSWORD}`, `{SCREEN_WIDTH}`, ...), `until`, `stdout`/`stderr`
    files in the task's cache folder, and its failures (a step that raises fails the task; a
    command's non-zero exit is only logged)."""
    from desktop_env.controllers.python import PythonController
    from desktop_env.controllers.setup import SetupController

    task = req.get("task_id", "?")
    steps = req.get("config")
    if not isinstance(steps, list) or not all(
        isinstance(s, dict) and "type" in s and isinstance(s.get("parameters", {}), dict)
        for s in steps
    ):
        return {
            "error": f"task {task}: config must be a list of {{type, parameters}}",
            "kind": "input",
        }
    url = urlsplit(str(req.get("server_url", "")))
    net.origin, net.token, net.refused = f"{url.scheme}://{url.netloc}", req.get("token"), []
    try:
        os.makedirs(req["cache_dir"], exist_ok=True)
        env = Desktop(req, PythonController, SetupController)
        password = str(req.get("client_password") or "")
        env.setup_controller.client_password = password
        steps = [{"type": s["type"], "parameters": s.get("parameters", {})} for s in steps]
        ok = env.setup_controller.setup(steps, use_proxy=False)
    except Exception as e:  # SetupController raises Exception("Setup step N failed: ...")
        if net.refused:
            return _offline(task, "setup", net)
        why = f"{type(e).__name__}: {e}"
        if password:  # a failed command may quote itself, the password filled in
            why = why.replace(password, "***")
        return {"error": f"task {task}: setup: {why}", "kind": "setup"}
    if net.refused:  # a step that logs a failed request and goes on
        return _offline(task, "setup", net)
    if ok is False:
        return {
            "error": f"task {task}: setup: the server did not answer /terminal",
            "kind": "setup",
        }
    return {"ok": True}


def _offline(task: str, getter: str, net: Network) -> dict[str, Any]:
    return {
        "error": f"task {task}: {getter} needs the internet ({net.refused[0]}); "
        "offline, put its files in the task's cache folder (env.desktop.osworld_cache_dir)",
        "kind": "offline",
    }


def serve(out: Any) -> None:
    desktop_env, unavailable = import_desktop_env()
    net = Network()
    net.install()
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            answer: dict[str, Any] = {"error": f"bad request line: {e}", "kind": "input"}
        else:
            op = req.get("op", "evaluate")
            if op == "setup":
                answer = setup(req, net)
            elif op == "evaluate":
                answer = evaluate(req, desktop_env, net, unavailable)
            else:
                answer = {"error": f"unknown op {op!r}: 'setup' or 'evaluate'", "kind": "input"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        _, unavailable = import_desktop_env()
        print(f"desktop_env imports; metrics unavailable here: {', '.join(unavailable) or 'none'}")
        return 0
    out = os.fdopen(os.dup(1), "w")  # the protocol's own stdout
    os.dup2(2, 1)  # what metrics print goes to stderr
    sys.stdout = sys.stderr
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        serve(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
