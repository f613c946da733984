"""MiniWoB++ in a real headless Chromium, behind the dart-ray Env contract (extra `browser`).

Built over the `miniwob` package's gymnasium environment, with five changes it needs here:

- **Offline Chromium.** The package starts Chrome with only `headless`, `no-sandbox` and
  `disable-gpu`, and without an explicit driver Selenium Manager tries to download one. We
  subclass its Selenium instance to launch Debian's `chromium` (or `chromium-headless-shell`)
  through Debian's `chromedriver` with every background-network feature off, and set
  `SE_OFFLINE=true`, `MINIWOB_CHROME_BINARY`, `MINIWOB_CHROMEDRIVER` for anything else.
- **A longer episode clock.** MiniWoB scales the reward by elapsed wall time over
  `core.EPISODE_MAX_TIME` (10 s) and ends idle episodes at -1; a model policy takes seconds per
  step. The clock is set from `env.miniwob.episode_max_time_s` before every episode. A
  `wait()` pauses `env.wait_s` (the page's clock runs meanwhile) and looks again.
- **UI-TARS actions.** Points arrive in pixels of the screenshot we returned (the 160x210 task
  area, optionally scaled by `env.miniwob.scale`) and map back to the page by that scale. A
  scroll without a point scrolls where the pointer is (the last point acted at, the centre
  before any), as pyautogui does. `type` types each line and presses Enter between them.
- **More keys.** MiniWoB's default keys (Humphreys et al., 2022) lack Escape, Home, End and
  shift+Tab; the gym is built with `keys.ALLOWED_KEYS`, those plus the editing and
  navigation keys a page answers. Browser shortcuts that would close or leave the page (ctrl
  w, alt F4, F5) are not among them: such a hotkey, an unknown key, a right click (MiniWoB has
  none), a sideways scroll or a point off the page is a failed step that says why
  (`invalid action: ...`), never a silent no-op.
- **One browser for every page.** The package binds a gym to one task page; a reset on
  another page sends the same Chromium there (~0.1 s) instead of starting a new one (~1.4 s
  and a core), since a run that mixes pages changes page at nearly every reset.

The trajectory reward is the task's own (JavaScript) reward: in [-1, 1], scaled down by elapsed
time (unscaled with `env.miniwob.raw_reward`); an episode the policy leaves unfinished scores
-1, as MiniWoB's own timeout does.
Any Selenium/connection failure is a crashed browser: `EnvCrashed`, and EnvSession rebuilds it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import numpy as np
from PIL import Image

from dart_ray.config import EnvConfig
from dart_ray.envs.base import (
    Env,
    EnvCrashed,
    EnvInputError,
    FrameObservation,
    InvalidAction,
    StepResult,
    check_type_length,
    invalid_step,
)
from dart_ray.envs.miniwob.keys import ALLOWED_KEYS, miniwob_key
from dart_ray.records import Action, ActionKind, Observation, Task

try:
    from miniwob.action import ActionSpaceConfig, ActionTypes
    from miniwob.environment import MiniWoBEnvironment
    from miniwob.fields import get_field_extractor
    from miniwob.selenium_instance import SeleniumInstance
    from selenium import webdriver
    from selenium.common.exceptions import MoveTargetOutOfBoundsException, WebDriverException
    from selenium.webdriver.chrome.service import Service
except ImportError as e:  # pragma: no cover - depends on the optional extra
    raise ImportError(
        f"MiniWoB++ needs the `browser` extra: pip install 'dart-ray[browser]' ({e})"
    ) from e

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--window-size=640,640",  # new headless gives ~140 px less inner height
)
HTML_DIR = Path(__import__("miniwob").__file__).parent / "html" / "miniwob"
# Selenium and urllib3 raise these when the browser or chromedriver is gone
_BROWSER_GONE = (WebDriverException, ConnectionError, OSError)


def find_browser(config: EnvConfig) -> tuple[str, str]:
    """Chromium binary and chromedriver: config, then $MINIWOB_*, then PATH."""
    opts = config.miniwob
    binary = str(opts.chrome_binary or os.environ.get("MINIWOB_CHROME_BINARY") or "") or next(
        (
            p
            for n in ("chromium", "chromium-headless-shell", "google-chrome")
            if (p := shutil.which(n))
        ),
        "",
    )
    driver = str(opts.chromedriver or os.environ.get("MINIWOB_CHROMEDRIVER") or "") or (
        shutil.which("chromedriver") or ""
    )
    missing = [n for n, p in (("Chromium", binary), ("chromedriver", driver)) if not p]
    if missing:
        raise EnvInputError(
            f"MiniWoB++ needs {' and '.join(missing)}: install Debian's chromium and "
            "chromium-driver (scripts/install-test-deps.sh does) or set env.miniwob.chrome_binary"
            " / env.miniwob.chromedriver"
        )
    return binary, driver


class _OfflineInstance(SeleniumInstance):
    """The package's Selenium instance, launching an offline Chromium with a long clock."""

    binary = ""
    chromedriver = ""
    episode_max_ms = 10_000

    def create_driver(self) -> None:
        options = webdriver.ChromeOptions()
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.binary_location = self.binary
        service = Service(executable_path=self.chromedriver, log_output=os.devnull)
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(20)
        self.driver.get(self.url)
        self.driver.find_element("id", self.SYNC_SCREEN_ID)
        self.inner_width, self.inner_height = self.driver.execute_script(
            "return [window.innerWidth, window.innerHeight];"
        )

    def begin_task(self, seed: Any = None) -> None:
        self.driver.execute_script(f"core.EPISODE_MAX_TIME = {int(self.episode_max_ms)};")
        super().begin_task(seed=seed)


class _Gym(MiniWoBEnvironment):
    instance_cls: type[SeleniumInstance] = _OfflineInstance

    def _hard_reset_instance(self) -> None:
        if getattr(self, "instance", None):
            self.instance.close()
        self.instance = self.instance_cls(index=0, **self.instance_kwargs)
        self.instance.start()
        self.instance.wait()


def _open_page(g: _Gym, subdomain: str) -> None:
    """Send the gym's browser to another task page: ~0.1 s, where a new Chromium takes ~1.4 s
    (and a core meanwhile), and a run mixing pages changes page at nearly every reset."""
    inst = g.instance
    inst.url = urljoin(inst.url, f"{subdomain}.html")  # beside the current page
    inst.field_extractor = get_field_extractor(subdomain)
    inst.driver.get(inst.url)
    inst.driver.find_element("id", inst.SYNC_SCREEN_ID)
    g.subdomain = subdomain
    g.instance_kwargs["subdomain"] = subdomain  # what a hard reset of the gym reopens


class MiniWobEnv(Env):
    """One MiniWoB++ browser; a task names its page (`subdomain`) and seed in `config`."""

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config or EnvConfig()
        self.options = self.config.miniwob
        binary, driver = find_browser(self.config)
        os.environ.setdefault("SE_OFFLINE", "true")
        os.environ.setdefault("MINIWOB_CHROME_BINARY", binary)
        os.environ.setdefault("MINIWOB_CHROMEDRIVER", driver)
        self._instance_cls = type(
            "_Instance",
            (_OfflineInstance,),
            {
                "binary": binary,
                "chromedriver": driver,
                "episode_max_ms": self.options.episode_max_time_s * 1000,
            },
        )
        self._gym: _Gym | None = None
        self._subdomain: str | None = None
        self._done = False
        self._reward = -1.0
        self._pointer = self._centre()

    # ------------------------------------------------------------------ contract
    def reset(self, task: Task) -> Observation:
        sub = task.config.get("subdomain")
        if not isinstance(sub, str) or not (HTML_DIR / f"{sub}.html").is_file():
            raise EnvInputError(f"task {task.task_id}: no MiniWoB++ task named {sub!r}")
        seed = task.config.get("seed")
        try:
            flights = sub.startswith("flight.") or str(self._subdomain).startswith("flight.")
            if self._gym is None or (flights and sub != self._subdomain):
                self.close()  # the flight pages need their own window size and server
                self._gym = self._make(sub)
            elif sub != self._subdomain:
                _open_page(self._gym, sub)
            self._subdomain = sub
            obs, _ = self._gym.reset(seed=seed)
        except _BROWSER_GONE as e:
            raise EnvCrashed(f"browser failed on reset: {type(e).__name__}: {e}") from e
        self._done, self._reward, self._pointer = False, -1.0, self._centre()
        return self._observation(obs)

    def _make(self, subdomain: str) -> _Gym:
        gym_cls = type("_G", (_Gym,), {"instance_cls": self._instance_cls})
        keys = ActionSpaceConfig.get_preset("all_supported")
        keys.allowed_keys = ALLOWED_KEYS
        return gym_cls(subdomain=subdomain, render_mode=None, action_space_config=keys)

    def step(self, action: Action) -> StepResult:
        g = self._need_gym()
        if self._done:
            return StepResult(self._blank(), True, {"event": "episode_over"})
        if action.kind in (ActionKind.FINISHED, ActionKind.CALL_USER):
            self._done = True
            return StepResult(self._blank(), True, {"event": "finished"})
        if action.kind == ActionKind.WAIT:
            time.sleep(self.config.wait_s)  # for the page to finish what it started
        pointer = self._pointer
        try:
            check_type_length(action, self.config.max_type_chars)
            obs, reward, done, info = None, 0.0, False, {}
            for mw in self._translate(g, action):
                obs, reward, done, _, info = g.step(mw)
                if done:
                    break
        except InvalidAction as e:
            return invalid_step(self._screenshot(g), str(e))
        except MoveTargetOutOfBoundsException as e:
            # the model's: a point off the page; nothing happened and the pointer did not move
            self._pointer = pointer
            return invalid_step(self._screenshot(g), str(e).split("\n", 1)[0])
        except _BROWSER_GONE as e:
            # the machine's, whether the browser survived or not (a command that timed out
            # under load, an element gone stale mid-action): what the page did is unknown,
            # so the episode is aborted and retried, never scored as the model's mistake
            state = "failed" if not self.healthy() else "erred (still answering)"
            raise EnvCrashed(f"browser {state} on step: {type(e).__name__}: {e}") from e
        if obs is None:  # nothing to do in the page (an empty type)
            return StepResult(self._screenshot(g), False, {"event": "nothing"})
        scaled, raw = float(reward), float(info.get("raw_reward") or 0.0)
        if done:
            self._done, self._reward = True, raw if self.options.raw_reward else scaled
        out = {
            "event": "done" if done else "wait" if action.kind == ActionKind.WAIT else "acted",
            "reward": scaled,
            "raw_reward": raw,
        }
        return StepResult(self._observation(obs), bool(done), out)

    def evaluate(self) -> float:
        self._need_gym()
        return self._reward if self._done else -1.0

    def healthy(self) -> bool:
        if self._gym is None:
            return True
        try:
            return self._gym.instance.driver.execute_script("return 1;") == 1
        except _BROWSER_GONE:
            return False

    def processes(self) -> list[int]:
        if self._gym is None:
            return []
        proc = self._gym.instance.driver.service.process
        return [proc.pid] if proc is not None else []

    def close(self) -> None:
        g, self._gym = self._gym, None
        if g is None:
            return
        try:
            g.instance.driver.quit()
        except _BROWSER_GONE:
            proc = g.instance.driver.service.process  # chromedriver; its Chromium follows
            if proc is not None:
                proc.kill()

    # ------------------------------------------------------------------ translation
    def _need_gym(self) -> _Gym:
        if self._gym is None:
            raise EnvInputError("MiniWoB++ has no task: call reset(task) first")
        return self._gym

    def _centre(self) -> tuple[float, float]:
        s = self.options.scale
        return 80 * s, 105 * s  # of the 160x210 task area

    def _page(
        self, p: tuple[float, float] | None, kind: ActionKind, what: str = "a point"
    ) -> np.ndarray:
        """A screenshot point on the page (where the pointer now is); InvalidAction without."""
        if p is None:
            raise InvalidAction(f"{kind.value} needs {what}")
        self._pointer = p
        s = self.options.scale
        return np.array([p[0] / s, p[1] / s], dtype=np.float32)

    def _translate(self, g: _Gym, a: Action) -> list[dict[str, Any]]:
        """UI-TARS action -> MiniWoB actions (a drag is press, move, release); InvalidAction
        for what MiniWoB cannot do."""
        k, mk = a.kind, g.create_action
        if k == ActionKind.CLICK:
            return [mk(ActionTypes.CLICK_COORDS, coords=self._page(a.point, k))]
        if k == ActionKind.LEFT_DOUBLE:
            return [mk(ActionTypes.DBLCLICK_COORDS, coords=self._page(a.point, k))]
        if k == ActionKind.DRAG:
            start, end = self._page(a.point, k), self._page(a.end_point, k, "an end point")
            return [
                mk(ActionTypes.MOUSEDOWN_COORDS, coords=start),
                mk(ActionTypes.MOVE_COORDS, coords=(start + end) / 2),
                mk(ActionTypes.MOUSEUP_COORDS, coords=end),
            ]
        if k == ActionKind.SCROLL:
            d = (a.direction or "down").lower()
            if d not in ("up", "down"):
                raise InvalidAction(f"MiniWoB++ scrolls only up and down, not {d}")
            kind = ActionTypes.SCROLL_UP_COORDS if d == "up" else ActionTypes.SCROLL_DOWN_COORDS
            return [mk(kind, coords=self._page(a.point or self._pointer, k))]
        if k == ActionKind.TYPE:
            out = []
            for i, line in enumerate((a.text or "").split("\n")):
                if i:
                    out.append(self._press(g, "<Enter>"))
                if line:
                    out.append(mk(ActionTypes.TYPE_TEXT, text=line))
            return out
        if k == ActionKind.HOTKEY:
            return [self._press(g, miniwob_key(a.text or ""))]
        if k == ActionKind.RIGHT_SINGLE:
            raise InvalidAction("MiniWoB++ has no right click")
        if k == ActionKind.INVALID:
            raise InvalidAction(a.error or "unparseable")
        # wait (after its pause): a no-op step looks at the page again and notices an episode
        # that ended meanwhile (MiniWoB's clock ran out)
        return [mk(ActionTypes.NONE)]

    def _press(self, g: _Gym, key: str) -> dict[str, Any]:
        allowed = g.action_space_config.allowed_keys
        return g.create_action(ActionTypes.PRESS_KEY, key=allowed.index(key))

    # ------------------------------------------------------------------ observations
    def _observation(self, obs: dict[str, Any]) -> Observation:
        img = Image.fromarray(np.asarray(obs["screenshot"], dtype=np.uint8), "RGB")
        return self._wrap(img, str(obs.get("utterance", "")), self._dom(obs))

    def _dom(self, obs: dict[str, Any]) -> str:
        """The page's elements as JSON, in screenshot pixels: MiniWoB's accessibility tree."""
        s = self.options.scale
        elements = [
            {
                "ref": int(e["ref"]),
                "parent": int(e["parent"]),
                "tag": e["tag"],
                "text": e["text"],
                "value": e["value"],
                "id": e["id"],
                "classes": e["classes"],
                "left": float(e["left"][0]) * s,
                "top": float(e["top"][0]) * s,
                "width": float(e["width"][0]) * s,
                "height": float(e["height"][0]) * s,
                "focused": bool(e["flags"][0]),
            }
            for e in obs.get("dom_elements", ())
        ]
        return json.dumps({"fields": dict(obs.get("fields", ())), "elements": elements})

    def _wrap(self, img: Image.Image, text: str, dom: str | None = None) -> Observation:
        s = self.options.scale
        if s != 1:
            img = img.resize((round(img.width * s), round(img.height * s)), Image.NEAREST)
        return FrameObservation(img, text=text, accessibility=dom)

    def _screenshot(self, g: _Gym) -> Observation:
        try:
            obs, _ = g.instance.get_observation(use_cached_fields=True)
        except _BROWSER_GONE as e:
            raise EnvCrashed(f"browser failed on screenshot: {type(e).__name__}: {e}") from e
        return self._observation(obs)

    def _blank(self) -> Observation:
        return self._wrap(Image.new("RGB", (160, 210), (255, 255, 255)), "")
