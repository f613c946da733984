"""MiniWoB++ in real headless Chromium (marker `browser`): scripted solutions of seven task
families scored by each task's own JavaScript reward, and recovery from a killed and from a
frozen browser through a real EnvSession actor.

The scripts read the page's elements from `Observation.accessibility` (MiniWoB's DOM, in
screenshot pixels) and act only through UI-TARS actions at pixel positions."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
import ray

from dart_ray.config import EnvConfig, MiniWobOptions
from dart_ray.envs.base import EnvAborted, EnvInputError
from dart_ray.records import Action, ActionKind, Observation, Status, Task
from dart_ray.testing.procs import alive

pytest.importorskip("miniwob", reason="needs the browser extra")
from dart_ray.envs.miniwob.env import MiniWobEnv

pytestmark = pytest.mark.browser
Elements = list[dict[str, Any]]


@pytest.fixture(scope="module")
def env() -> Iterator[MiniWobEnv]:
    e = MiniWobEnv(EnvConfig(kind="miniwob"))
    yield e
    e.close()


def _task(sub: str, seed: int) -> Task:
    return Task(f"miniwob/{sub}/{seed}", "", "miniwob", {"subdomain": sub, "seed": seed})


def _els(obs: Observation) -> tuple[dict[str, str], Elements]:
    d = json.loads(obs.accessibility or "{}")
    return d["fields"], d["elements"]


def _center(e: dict[str, Any]) -> tuple[float, float]:
    return (e["left"] + e["width"] / 2, e["top"] + e["height"] / 2)


def _click(e: dict[str, Any]) -> Action:
    return Action(ActionKind.CLICK, point=_center(e))


def _find(
    els: Elements, tag: str, text: str | None = None, id_: str | None = None
) -> dict[str, Any]:
    for e in els:
        if (
            e["tag"] == tag
            and (text is None or e["text"] == text)
            and (id_ is None or e["id"] == id_)
        ):
            return e
    raise AssertionError(f"no {tag} {text or id_!r} in the page")


def click_test(f: dict[str, str], els: Elements) -> list[Action]:
    return [_click(_find(els, "button"))]


def click_button(f: dict[str, str], els: Elements) -> list[Action]:
    return [_click(_find(els, "button", f["target"]))]


def click_link(f: dict[str, str], els: Elements) -> list[Action]:
    return [_click(_find(els, "span", f["target"]))]


def enter_text(f: dict[str, str], els: Elements) -> list[Action]:
    field = _find(els, "input_text")
    return [
        _click(field),
        Action(ActionKind.TYPE, text=f["target"]),
        _click(_find(els, "button", "Submit")),
    ]


def login_user(f: dict[str, str], els: Elements) -> list[Action]:
    return [
        _click(_find(els, "input_text", id_="username")),
        Action(ActionKind.TYPE, text=f["username"]),
        _click(_find(els, "input_password", id_="password")),
        Action(ActionKind.TYPE, text=f["password"]),
        _click(_find(els, "button", "Login")),
    ]


def click_checkboxes(f: dict[str, str], els: Elements) -> list[Action]:
    wanted = {v for k, v in f.items() if k.startswith("target")}
    by_ref = {e["ref"]: e for e in els}
    actions = []
    for label in (e for e in els if e["tag"] == "t" and e["text"] in wanted):
        box = next(
            e for e in els if e["tag"] == "input_checkbox" and e["parent"] == label["parent"]
        )
        assert by_ref[box["parent"]]["tag"] == "label"
        actions.append(_click(box))
    return [*actions, _click(_find(els, "button", "Submit"))]


def click_dialog(f: dict[str, str], els: Elements) -> list[Action]:
    close = next(e for e in els if e["tag"] == "button" and e["width"] == e["height"] == 20.0)
    return [_click(close)]


SOLVERS: dict[str, Callable[[dict[str, str], Elements], list[Action]]] = {
    "click-test": click_test,
    "click-button": click_button,
    "click-link": click_link,
    "enter-text": enter_text,
    "login-user": login_user,
    "click-checkboxes": click_checkboxes,
    "click-dialog": click_dialog,
}


@pytest.mark.parametrize("sub", sorted(SOLVERS))
def test_scripted_actions_earn_the_tasks_own_reward(env: MiniWobEnv, sub: str) -> None:
    for seed in (1, 2):
        obs = env.reset(_task(sub, seed))
        assert (obs.width, obs.height) == (160, 210) and obs.screenshot.startswith(b"\x89PNG")
        fields, els = _els(obs)
        results = [env.step(a) for a in SOLVERS[sub](fields, els)]
        assert results[-1].done, (sub, seed, results[-1].info)
        reward = env.evaluate()
        # MiniWoB's reward is raw * (1 - elapsed / EPISODE_MAX_TIME); with the 600 s clock and
        # an episode of a few seconds, 1 * (1 - 5/600) > 0.99
        assert 0.99 < reward <= 1.0, (sub, seed, reward)
        assert results[-1].info["raw_reward"] == 1.0


def test_wrong_answer_and_unfinished_episode_score_negative(env: MiniWobEnv) -> None:
    obs = env.reset(_task("click-button", 5))
    fields, els = _els(obs)
    wrong = next(e for e in els if e["tag"] == "button" and e["text"] != fields["target"])
    r = env.step(_click(wrong))
    assert r.done and env.evaluate() < 0
    env.reset(_task("click-test", 5))
    r = env.step(Action(ActionKind.FINISHED, text="I am done"))
    assert r.done and env.evaluate() == -1.0  # left unfinished, as MiniWoB's own timeout


def test_bad_tasks_are_refused_and_the_browser_stays(env: MiniWobEnv) -> None:
    with pytest.raises(EnvInputError, match="no MiniWoB"):
        env.reset(_task("../../etc/passwd", 0))
    env.reset(_task("click-test", 3))
    r = env.step(Action(ActionKind.CLICK))  # the model's mistake: a failed step, not an error
    assert (r.done, r.info) == (
        False,
        {"event": "invalid", "error": "invalid action: click needs a point"},
    )
    assert env.healthy()


def test_scale_maps_points_back_to_the_page() -> None:
    e = MiniWobEnv(EnvConfig(kind="miniwob", miniwob=MiniWobOptions(scale=2.0)))
    try:
        obs = e.reset(_task("click-test", 4))
        assert (obs.width, obs.height) == (320, 420)
        _, els = _els(obs)
        e.step(_click(_find(els, "button")))  # a point in the 2x screenshot
        assert e.evaluate() > 0.99
    finally:
        e.close()


def _chromium_pids(session: Any) -> list[int]:
    pids = ray.get(session.processes.remote())
    return [
        p
        for p in pids
        if "chrom" in psutil.Process(p).name() and "driver" not in psutil.Process(p).name()
    ]


@pytest.mark.usefixtures("ray_local")
def test_session_recovers_from_a_killed_and_a_frozen_browser() -> None:
    from actors.env_session import start_session

    cfg = EnvConfig(kind="miniwob", step_timeout_s=5.0, wait_s=1.0)
    s = start_session(cfg, "miniwob-crash")
    try:
        # 1. Chromium killed mid-episode: the step raises EnvAborted, never a reward
        obs = ray.get(s.reset.remote(_task("click-test", 7)))
        for pid in _chromium_pids(s):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(EnvAborted, match="browser failed on step"):
            ray.get(s.step.remote(_click(_find(_els(obs)[1], "button"))))
        with pytest.raises(EnvInputError, match="aborted"):
            ray.get(s.evaluate.remote())
        # 2. the next episode runs on a new browser and is scored by the task
        obs = ray.get(s.reset.remote(_task("click-test", 8)))
        ray.get(s.step.remote(_click(_find(_els(obs)[1], "button"))))
        assert ray.get(s.evaluate.remote()) > 0.99
        # 3. a frozen browser (SIGSTOP) hangs the step: the deadline aborts it, the stuck
        # processes are killed, and the session serves the next episode
        obs = ray.get(s.reset.remote(_task("click-test", 9)))
        frozen = _chromium_pids(s)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        with pytest.raises(EnvAborted, match="timed out after 5s"):
            ray.get(s.step.remote(_click(_find(_els(obs)[1], "button"))))
        # SIGKILL reaches stopped processes too; give the kernel a moment to reap them
        _, left = psutil.wait_procs(alive(frozen), timeout=10)
        assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE]
        obs = ray.get(s.reset.remote(_task("click-test", 10)))
        ray.get(s.step.remote(_click(_find(_els(obs)[1], "button"))))
        assert ray.get(s.evaluate.remote()) > 0.99
        st = ray.get(s.stats.remote())
        assert (st.aborted, st.recreations) == (2, 2)
        assert ray.get(s.health.remote()).ok
    finally:
        ray.get(s.close.remote())
        ray.kill(s)


def test_a_point_off_the_page_is_a_failed_step_not_a_crash(env: MiniWobEnv) -> None:
    env.reset(_task("click-test", 11))
    r = env.step(Action(ActionKind.CLICK, point=(5000.0, 5000.0)))
    assert not r.done and r.info["event"] == "invalid"
    assert r.info["error"].startswith("invalid action: ") and "out of bounds" in r.info["error"]
    assert env.healthy()


@pytest.mark.parametrize("error", ["TimeoutException", "StaleElementReferenceException"])
def test_a_browser_error_with_a_healthy_browser_aborts_the_episode(
    env: MiniWobEnv, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45, point 2: a WebDriver error other than a point off the page (a command that
    timed out under load, an element gone stale) is the machine's, whether or not the browser
    still answers: the episode is aborted (EnvCrashed, then retried), never scored as the
    model's invalid step. Before the fix a healthy browser turned it into `invalid`."""
    from selenium.common import exceptions

    from dart_ray.envs.base import EnvCrashed

    env.reset(_task("click-test", 12))
    gym = env._gym
    assert gym is not None

    def fail(*_: object) -> None:
        raise getattr(exceptions, error)("injected")

    monkeypatch.setattr(gym, "step", fail)
    with pytest.raises(EnvCrashed, match=f"erred \\(still answering\\) on step: {error}"):
        env.step(Action(ActionKind.CLICK, point=(80.0, 100.0)))
    monkeypatch.undo()
    assert env.healthy()


def _js(env: MiniWobEnv, script: str) -> Any:
    return env._gym.instance.driver.execute_script(script)  # type: ignore[union-attr]


def _value(obs: Observation, id_: str) -> str:
    return next(e["value"] for e in _els(obs)[1] if e["id"] == id_)  # type: ignore[no-any-return]


def _focused(obs: Observation) -> str:
    return next(e["id"] for e in _els(obs)[1] if e["focused"])  # type: ignore[no-any-return]


def test_a_scroll_without_a_point_scrolls_where_the_pointer_is(env: MiniWobEnv) -> None:
    """`scroll(direction='down')` (UI-TARS allows no point) scrolls where the mouse is, as
    pyautogui does: the last point acted at, the centre of the screen before any. It used to
    raise EnvInputError, which ended the rollouter."""
    down = Action(ActionKind.SCROLL, direction="down")
    scrolled = "return document.getElementById('text-area').scrollTop"
    obs = env.reset(_task("scroll-text", 1))
    area = _find(_els(obs)[1], "textarea")
    x, y = _center(area)
    assert area["top"] < 105 < area["top"] + area["height"]  # the centre (80, 105) is on it
    r = env.step(down)
    assert r.info["event"] == "acted" and _js(env, scrolled) > 0
    env.reset(_task("scroll-text", 1))
    env.step(_click(_find(_els(obs)[1], "input_text")))  # the pointer leaves it
    assert env.step(down).info["event"] == "acted" and _js(env, scrolled) == 0
    env.step(Action(ActionKind.CLICK, point=(x, y)))  # back on the text
    assert env.step(down).info["event"] == "acted" and _js(env, scrolled) > 0
    # a click off the page fails and leaves the pointer where it was: on the text
    before = _js(env, scrolled)
    assert env.step(Action(ActionKind.CLICK, point=(5000.0, 5.0))).info["event"] == "invalid"
    assert env.step(down).info["event"] == "acted" and _js(env, scrolled) > before
    # MiniWoB++ scrolls only up and down: sideways is a failed step that says so
    r = env.step(Action(ActionKind.SCROLL, point=(x, y), direction="left"))
    assert r.info == {
        "event": "invalid",
        "error": "invalid action: MiniWoB++ scrolls only up and down, not left",
    }


def test_typed_lines_are_each_typed_with_enter_between(env: MiniWobEnv) -> None:
    """`type(content='ab\\ncd\\n')` types ab, Enter, cd, Enter; the text after the first
    newline used to be dropped."""
    obs = env.reset(_task("copy-paste", 1))
    env.step(_click(_find(_els(obs)[1], "textarea")))
    env.step(Action(ActionKind.HOTKEY, text="ctrl a"))
    r = env.step(Action(ActionKind.TYPE, text="ab\ncd\n"))
    assert _value(r.observation, "to-copy") == "ab\ncd\n"


def test_hotkeys_press_what_miniwob_can_and_say_what_it_cannot(env: MiniWobEnv) -> None:
    obs = env.reset(_task("login-user", 1))
    env.step(_click(_find(_els(obs)[1], "input_text", id_="username")))

    def key(keys: str) -> Observation:
        r = env.step(Action(ActionKind.HOTKEY, text=keys))
        assert r.info["event"] == "acted", (keys, r.info)
        return r.observation

    assert _value(key("a"), "username") == "a"  # a single letter
    assert _value(key("shift b"), "username") == "aB"
    key("home")
    assert _value(env.step(Action(ActionKind.TYPE, text="x")).observation, "username") == "xaB"
    key("End")
    assert _value(env.step(Action(ActionKind.TYPE, text="y")).observation, "username") == "xaBy"
    assert _value(key("+"), "username") == "xaBy+"  # the plus key, not a separator
    key("ctrl+a")
    assert _value(key("backspace"), "username") == ""
    assert _focused(key("tab")) == "password"
    assert _focused(key("shift+tab")) == "username"
    key("esc")
    # keys it cannot press: a failed step each, with the reason
    for keys, why in [
        ("ctrl w", "MiniWoB++ does not press 'ctrl w'"),
        ("alt f4", "MiniWoB++ does not press 'alt f4'"),
        ("hyper", "unknown key 'hyper'"),
        ("ctrl shift", "'ctrl shift' presses no key besides modifiers"),
        ("a b", "'a b' presses more than one key"),
    ]:
        r = env.step(Action(ActionKind.HOTKEY, text=keys))
        assert (r.done, r.info["event"]) == (False, "invalid"), keys
        assert r.info["error"].startswith(f"invalid action: {why}"), r.info
    # and a right click, which MiniWoB++ has no action for
    r = env.step(Action(ActionKind.RIGHT_SINGLE, point=(10.0, 10.0)))
    assert r.info == {"event": "invalid", "error": "invalid action: MiniWoB++ has no right click"}


def test_wait_pauses_for_env_wait_s() -> None:
    """UI-TARS's wait() means 'pause 5 s and look again'; it used to return at once."""
    import time

    e = MiniWobEnv(EnvConfig(kind="miniwob", wait_s=0.6))
    try:
        e.reset(_task("click-test", 12))
        t0 = time.monotonic()
        r = e.step(Action(ActionKind.WAIT))
        assert time.monotonic() - t0 >= 0.6
        assert not r.done and r.info["event"] == "wait"
        assert r.observation.screenshot.startswith(b"\x89PNG")  # the page, looked at again
    finally:
        e.close()


class InProcess:
    """An EnvSession (deadlines, crash recovery) in this process, as an episode's Session."""

    def __init__(self, session: Any) -> None:
        self.s = session

    async def reset(self, task: Task) -> Observation:
        return await asyncio.to_thread(self.s.reset, task)  # type: ignore[no-any-return]

    async def step(self, action: object) -> Any:
        return await asyncio.to_thread(self.s.step, action)

    async def evaluate(self) -> float:
        return await asyncio.to_thread(self.s.evaluate)  # type: ignore[no-any-return]


class Typist:
    """Types 20,000 characters, then gives up."""

    def __init__(self) -> None:
        self.turn = 0

    async def generate(self, request: object) -> Any:
        from dart_ray.engines.base import Generation

        self.turn += 1
        action = "type(content='" + "x" * 20_000 + "')" if self.turn == 1 else "finished()"
        return Generation(f"Action: {action}", (1,), (2,), (0.0,), (0.0,), 0, "stop")


def test_a_very_long_type_is_the_models_failed_step_not_an_aborted_episode() -> None:
    """20,000 characters take Chromium ~30 s: past the step deadline, so the session rebuilt
    the browser and the episode was ABORTED (retried, never penalised). Past
    env.max_type_chars it is the model's failed step."""
    from actors.env_session import EnvSession
    from dart_ray.rollout.episode import EpisodeSettings, Slot, run_episode

    cfg = EnvConfig(kind="miniwob", step_timeout_s=10.0)
    session = EnvSession(cfg, "miniwob-typist")
    try:
        slot, settings = Slot("g", 1, "", 0, "run"), EpisodeSettings(max_steps=3)
        t = asyncio.run(
            run_episode(InProcess(session), Typist(), _task("enter-text", 1), slot, settings)  # type: ignore[arg-type]
        )
        assert (t.status, t.num_steps, t.error) == (Status.OK, 2, None)
        assert t.steps[0].action.error == (
            "invalid action: type content has 20000 characters, more than 1000"
        )
        assert t.reward == -1.0  # finished without submitting: the task's own verdict
        st = session.stats()
        assert (st.aborted, st.recreations) == (0, 0)
    finally:
        session.close()


def test_another_page_reuses_the_browser(env: MiniWobEnv) -> None:
    """A reset on another page sends the same Chromium there (it used to start a new one,
    ~1.4 s, at nearly every reset of a run mixing pages); the new page's task is scored."""
    env.reset(_task("click-test", 20))
    pids = env.processes()
    for sub in ("enter-text", "click-button", "click-test"):
        obs = env.reset(_task(sub, 20))
        assert env.processes() == pids, sub
        fields, els = _els(obs)
        for a in SOLVERS[sub](fields, els):
            env.step(a)
        assert env.evaluate() > 0.99, sub
