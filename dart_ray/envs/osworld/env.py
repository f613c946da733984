"""The Env that drives a desktop through the OSWorld in-VM server protocol (the HTTP clients of
that server and of an emulator pool are in `dart_ray.envs.osworld.client`).

Three ways to get a desktop, one Env:

- `env.desktop.server_url`: an OSWorld VM (or any server speaking its protocol) already up.
- `env.desktop.pool_url`: a GUI-Docker-Env-style emulator pool. Each reset stops the previous
  emulator and asks for a fresh one (`/start_emulator`, `/stop_emulator`, bearer token), which
  is how a VM is reset to its snapshot.
- `env.kind = "desktop"` (`LocalDesktopEnv`): our own server (`dart_ray.envs.desktop.server`)
  on a private Xvfb display, started by the env itself with a random bearer token.

A task's `config` follows OSWorld's task files: `config` is a list of setup steps (run by
`dart_ray.envs.osworld.setup`: `launch`, `execute`, `open`, `download`, the Chrome steps, ...) and `evaluator` is getter/metric pairs, scored by ours (`dart_ray.envs.osworld.ours`)
or, with `env.desktop.evaluator = "osworld"`, by OSWorld's own (`dart_ray.envs.osworld.official`,
in its own venv). Actions
become pyautogui code (`dart_ray.envs.pyautogui_code`, where model strings are only ever
quoted); WAIT sleeps `env.wait_s`, DONE ends the episode, FAIL (UI-TARS `call_user`) ends it declaring the
task infeasible. An action that cannot become code (an unknown key, a missing point, a `type`
over `env.max_type_chars`: at pyautogui's 5 ms a character a longer one outlasts the step) is a
failed step that says why, and nothing runs.

A server that does not answer, answers 5xx, reports its X display dead (`/health`), or answers outside
the protocol (not JSON, a field missing or mistyped: `EnvProtocolError`) raises `EnvCrashed`:
EnvSession then rebuilds the env and the episode is ABORTED, not scored.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from dart_ray.config import EnvConfig, read_secret
from dart_ray.config.masking import remember
from dart_ray.envs.base import (
    Env,
    EnvCrashed,
    EnvInputError,
    InvalidAction,
    StepResult,
    check_type_length,
    invalid_step,
)
from dart_ray.envs.osworld import ours
from dart_ray.envs.osworld.chrome import history_template
from dart_ray.envs.osworld.client import EmulatorPool, EnvProtocolError, OSWorldClient
from dart_ray.envs.osworld.official import Evaluator, OSWorldEvaluator
from dart_ray.envs.osworld.setup import Screen, run_step
from dart_ray.envs.pyautogui_code import DONE, FAIL, WAIT, UnsafeAction, to_code
from dart_ray.envs.taskfile import TaskFileError, check_task_id
from dart_ray.records import Action, Observation, Task


class OSWorldEnv(Env):
    """A desktop reached through the OSWorld protocol (server_url or pool_url)."""

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config or EnvConfig(kind="osworld")
        self.options = self.config.desktop
        self.token = read_secret(
            self.options.token_env,
            self.options.token_file,
            required="env.desktop.token_file"
            if self.options.token_file
            else "env.desktop.token_env",
        )
        # OSWorld's {CLIENT_PASSWORD}: read once, masked in this process's logs
        password = self.options.password_env
        self.password = read_secret(password, None, required="env.desktop.password_env") or ""
        self.pool = (
            EmulatorPool(self.options.pool_url, self.token) if self.options.pool_url else None
        )
        self.emulator: str | None = None
        self.client: OSWorldClient | None = None
        if self.pool is None:
            if not self.options.server_url and type(self) is OSWorldEnv:
                raise EnvInputError("kind 'osworld' needs env.desktop.server_url or pool_url")
            if self.options.server_url:
                self.client = self._client(self.options.server_url)
        self.task: Task | None = None
        self.last_action: str | None = None
        self._done = False
        self._has_health_endpoint = True
        self._official: Evaluator | None = None

    def _client(self, url: str) -> OSWorldClient:
        return OSWorldClient(url, self.token, self.options.request_timeout_s)

    # ------------------------------------------------------------------ contract
    def reset(self, task: Task) -> Observation:
        steps = task.config.get("config", [])
        if not isinstance(steps, list) or not isinstance(task.config.get("evaluator", {}), dict):
            raise EnvInputError(f"task {task.task_id}: 'config' must be a list of setup steps")
        if self.pool is not None:
            if self.emulator is not None:
                self.pool.stop(self.emulator)
                self.emulator = None
            self.emulator, url = self.pool.start()
            self.client = self._client(url)
        c = self._need_client()
        c.reset(task.config.get("apps", self.options.apps))
        if self.options.evaluator == "osworld":  # set-up as OSWorld's own SetupController runs it
            self._osworld_setup(c, task, steps)
        else:
            for i, step in enumerate(steps):
                run_step(c, self.options, task.task_id, i, step, self._screen())
        self.task, self.last_action, self._done = task, None, False
        return self._observe(c)

    def step(self, action: Action) -> StepResult:
        c = self._need_client()
        if self._done:
            return StepResult(self._observe(c), True, {"event": "episode_over"})
        try:
            check_type_length(action, self.config.max_type_chars)
            code = to_code(action)
        except (UnsafeAction, InvalidAction) as e:  # the model's action cannot run: nothing does
            return invalid_step(self._observe(c), str(e))
        self.last_action = code if code in (WAIT, DONE, FAIL) else "code"
        info: dict[str, Any] = {"event": code if code in (WAIT, DONE, FAIL) else "executed"}
        if code in (DONE, FAIL):
            self._done = True
            return StepResult(self._observe(c), True, info)
        if code == WAIT:
            time.sleep(self.config.wait_s)  # for the app to finish what it started
        else:
            r = c.execute([sys_python(), "-c", code])
            info |= {"returncode": r.get("returncode"), "error": (r.get("error") or "")[-500:]}
            time.sleep(self.options.settle_s)
        self._check_display(c)
        return StepResult(self._observe(c), False, info)

    def evaluate(self) -> float:
        c = self._need_client()
        if self.task is None:
            raise EnvInputError("evaluate before reset")
        self._check_display(c)
        evaluator = self.task.config.get("evaluator", {})
        if self.options.evaluator == "osworld":  # postconfig, getters, metrics: all OSWorld's
            screen = (self.config.screen_width, self.config.screen_height)
            return self._osworld().evaluate(self.task, c.base, self.token, self.last_action, screen)
        # OSWorld runs the evaluator's `postconfig` setup steps before its getters
        for i, step in enumerate(evaluator.get("postconfig", [])):
            run_step(c, self.options, self.task.task_id, i, step, self._screen())
        return ours.evaluate(c, evaluator, self.last_action)

    def _screen(self) -> Screen:
        return Screen(self.config.screen_width, self.config.screen_height, self.password)

    def _osworld_setup(self, c: OSWorldClient, task: Task, steps: list[Any]) -> None:
        """The steps through OSWorld's SetupController in the evaluator's worker. OSWorld
        downloads the empty History database `update_browse_history` starts from; it is made
        here instead, where OSWorld looks for it first (`<task cache>/history_new.sqlite`)."""
        official = self._osworld()
        if any(isinstance(s, dict) and s.get("type") == "update_browse_history" for s in steps):
            from dart_ray.envs.osworld.chrome_history import make_history_template

            folder = official.cache / task.task_id
            folder.mkdir(parents=True, exist_ok=True)
            history_template(folder, make_history_template)
        screen = (self.config.screen_width, self.config.screen_height)
        official.setup(task, steps, c.base, self.token, screen, client_password=self.password)

    def _osworld(self) -> Evaluator:
        """The node's shared evaluator where a session in Ray has one (`shared_evaluator`),
        else a worker of this environment's own."""
        if self._official is None:
            if self.options.evaluator_workers > 0 and _in_ray():
                from actors.osworld_evaluator import NodeEvaluator

                self._official = NodeEvaluator(self.options)
            else:
                self._official = OSWorldEvaluator(
                    self.options.osworld_venv,
                    self.options.osworld_cache_dir,
                    chromium_port=self.options.chromium_port,
                )
        return self._official

    def healthy(self) -> bool:
        if self.client is None:
            return True
        try:
            self.client.request("GET", "/platform")
            return True
        except (EnvCrashed, EnvInputError):
            return False

    def close(self) -> None:
        if self._official is not None:
            self._official.close()
            self._official = None
        if self.pool is not None and self.emulator is not None:
            try:
                self.pool.stop(self.emulator)
            finally:
                self.emulator = None

    # ------------------------------------------------------------------ helpers
    def _need_client(self) -> OSWorldClient:
        if self.client is None:
            raise EnvInputError("no desktop yet: call reset(task) first")
        return self.client

    def _observe(self, c: OSWorldClient) -> Observation:
        png = c.screenshot()
        w, h = _png_size(png)
        tree = c.accessibility() if self.options.accessibility else None
        return Observation(png, w, h, accessibility=tree)

    def _check_display(self, c: OSWorldClient) -> None:
        """EnvCrashed once the X display has died. An app that ended (closed or killed by the
        agent's actions, or crashed) is the episode's state, scored as OSWorld scores it."""
        if not self._has_health_endpoint:
            return
        alive = c.display_alive()
        if alive is None:
            self._has_health_endpoint = False
        elif not alive:
            raise EnvCrashed("the desktop's X display died")


def sys_python() -> str:
    """`python`: the server maps it to an interpreter with pyautogui (OSWorld's convention)."""
    return "python"


def _png_size(png: bytes) -> tuple[int, int]:
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24 or png[12:16] != b"IHDR":
        raise EnvProtocolError(
            f"desktop server sent a screenshot that is not a PNG ({len(png)} bytes: {png[:16]!r})"
        )
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


class LocalDesktopEnv(OSWorldEnv):
    """OSWorldEnv over our own server on a private Xvfb display, started and owned by the env."""

    MIN_SIZE = (640, 480)

    def __init__(self, config: EnvConfig | None = None) -> None:
        config = config or EnvConfig(kind="desktop", screen_width=1024, screen_height=768)
        if config.screen_width < self.MIN_SIZE[0] or config.screen_height < self.MIN_SIZE[1]:
            raise EnvInputError(
                f"a desktop needs at least {self.MIN_SIZE[0]}x{self.MIN_SIZE[1]} pixels; "
                f"env.screen_width/height are {config.screen_width}x{config.screen_height}"
            )
        super().__init__(config)
        self._token = secrets.token_urlsafe(24)
        remember(self._token)  # masked in this process's logs
        self.token = self._token
        self._tree: dict[int, psutil.Process] = {}
        self._root = Path(tempfile.mkdtemp(prefix="dart-desktop-"))
        self.confine = (
            self.options.osworld_profile if self.options.confine is None else self.options.confine
        )
        self._layers = 0
        self._namespace: int | None = None
        self._proc = self._start_server()
        self._remember_tree()

    def _start_server(self) -> subprocess.Popen[str]:
        from dart_ray.envs.desktop.spawn import mount_namespace, spawn_server

        layers = None
        if self.confine:  # a fresh set of overlay layers for each server
            self._layers += 1
            layers = self._root.parent / f"{self._root.name}-layers-{self._layers}"
        proc, url = spawn_server(
            self.config.screen_width,
            self.config.screen_height,
            self.options.window_manager,
            self._token,
            root=self._root,
            osworld_profile=self.options.osworld_profile,
            confine=layers,
        )
        self._namespace = mount_namespace(proc.pid) if layers is not None else None
        self.client = self._client(url)
        return proc

    def reset(self, task: Task) -> Observation:
        if self.confine:  # the last episode's system changes and processes go with its server
            self._stop_server()
            self._proc = self._start_server()
        try:
            return super().reset(task)
        finally:
            self._remember_tree()

    def step(self, action: Action) -> StepResult:
        try:
            return super().step(action)
        finally:
            self._remember_tree()

    def _remember_tree(self) -> None:
        """Note the server's descendants (Xvfb, apps, what the terminal started): if the server
        dies they are orphaned, and close() must still find and stop them."""
        with contextlib.suppress(psutil.NoSuchProcess):
            self._tree = {p.pid: p for p in psutil.Process(self._proc.pid).children(recursive=True)}

    def processes(self) -> list[int]:
        alive = [p.pid for p in self._tree.values() if p.is_running()]
        return ([self._proc.pid] if self._proc.poll() is None else []) + alive

    def close(self) -> None:
        super().close()
        self._stop_server()
        shutil.rmtree(self._root, ignore_errors=True)

    def _stop_server(self) -> None:
        """Stop the server, its X server and apps, what they orphaned, and (confined) every
        process of its namespace and its overlay layers."""
        proc = self._proc
        if proc.poll() is None:
            self._remember_tree()
            proc.terminate()  # the server tears its X server and apps down on SIGTERM
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:  # a frozen (SIGSTOPped) server never answers
                proc.kill()
                proc.wait(5)
        for child in self._tree.values():  # orphans of a dead server, or what it left
            if child.is_running():  # is_running() also guards against a reused pid
                child.kill()
        self._tree = {}
        if self._namespace is not None:
            from dart_ray.envs.desktop.spawn import namespace_processes

            for pid in namespace_processes(self._namespace):
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()
            self._namespace = None
            shutil.rmtree(self._root.parent / f"{self._root.name}-layers-{self._layers}", True)


def task_from_json(d: dict[str, Any], env: str = "desktop", split: str = "train") -> Task:
    """An OSWorld task file (id, instruction, config, evaluator) as a dart-ray Task.

    TaskFileError names the task and the field that is missing or of the wrong type."""
    where = f"OSWorld task {str(d.get('id'))[:80]!r}" if isinstance(d, dict) else "OSWorld task"
    if not isinstance(d, dict):
        raise TaskFileError(f"{where}: must be a JSON object, not {type(d).__name__}")
    if (why := check_task_id(d.get("id"))) is not None:
        raise TaskFileError(f"{where}: id: {why}")
    for key, kind in (("instruction", str), ("config", list), ("evaluator", dict)):
        if (key in d or key == "instruction") and not isinstance(d.get(key), kind):
            name = {str: "a string", list: "a list", dict: "an object"}[kind]
            raise TaskFileError(f"{where}: {key}: must be {name}")
    cfg = {k: d[k] for k in ("config", "evaluator", "apps") if k in d}
    return Task(d["id"], d["instruction"], env, json.loads(json.dumps(cfg)), split)


def _in_ray() -> bool:
    """Whether this process is a Ray actor's or driver's with Ray started (the sessions of a
    run, `dart-ray eval --ray`), where a node's sessions share one evaluator."""
    import ray

    return ray.is_initialized()
