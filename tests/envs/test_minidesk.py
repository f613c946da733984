"""MiniDesk: every shipped task is solvable, random play fails, and the toolkit rules hold."""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dart_ray.config import EnvConfig, MiniDeskOptions
from dart_ray.envs.base import EnvInputError, FrameObservation, make_env
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.envs.minidesk.families import FAMILIES
from dart_ray.envs.minidesk.generate import load_tasks, main, make_task, solve
from dart_ray.envs.minidesk.oracle import oracle_action
from dart_ray.envs.minidesk.render import position_wallpaper
from dart_ray.records import Action, ActionKind, Observation, Task

ALL_TASKS = load_tasks(split="train") + load_tasks(split="heldout")


def _cfg(**kw: object) -> EnvConfig:
    return EnvConfig(minidesk=MiniDeskOptions(**kw))  # type: ignore[arg-type]


def test_suite_shape() -> None:
    train, held = load_tasks(split="train"), load_tasks(split="heldout")
    assert len(FAMILIES) >= 8
    assert {t.config["family"] for t in train} == set(FAMILIES)
    assert {t.config["tier"] for t in train} == {1, 2, 3}
    # held-out tasks come from disjoint seeds, so no held-out scene is a training scene
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    assert not {t.config["seed"] for t in train} & {t.config["seed"] for t in held}
    assert all(t.split == "heldout" for t in held)


@pytest.mark.parametrize("placement", ["flow", "scatter"])
def test_oracle_solves_every_shipped_task(placement: str) -> None:
    steps_by_family: dict[str, list[int]] = {}
    for t in ALL_TASKS:
        reward, steps = solve(t, _cfg(placement=placement))
        assert reward == 1.0, t.task_id
        steps_by_family.setdefault(t.config["family"], []).append(steps)
    # single-step and multi-step families; the longest forms need 8 actions:
    # name (click, type) + email (click, type) + role (open, pick) + newsletter + Submit = 8
    assert max(steps_by_family["click-button"]) == max(steps_by_family["click-target"]) == 1
    assert max(steps_by_family["fill-form"]) == 8
    assert all(
        2 <= max(s) <= 8
        for f, s in steps_by_family.items()
        if f not in ("click-button", "click-target")
    )


def _random_action(rng: random.Random, w: int, h: int) -> Action:
    pt = (rng.uniform(0, w), rng.uniform(0, h))
    kind = rng.choice(
        [ActionKind.CLICK] * 4
        + [ActionKind.TYPE, ActionKind.HOTKEY, ActionKind.SCROLL, ActionKind.LEFT_DOUBLE]
        + [ActionKind.DRAG, ActionKind.WAIT, ActionKind.FINISHED]
    )
    if kind == ActionKind.TYPE:
        return Action(kind, text=rng.choice(["hello", "Ada", "kiwi", "x\n"]))
    if kind == ActionKind.HOTKEY:
        return Action(kind, text=rng.choice(["enter", "escape", "ctrl a", "tab", "backspace"]))
    if kind == ActionKind.SCROLL:
        return Action(kind, point=pt, direction=rng.choice(["up", "down"]))
    if kind == ActionKind.DRAG:
        return Action(kind, point=pt, end_point=(rng.uniform(0, w), rng.uniform(0, h)))
    return Action(kind, point=pt)


def test_random_policy_scores_near_zero() -> None:
    env = MiniDeskEnv(EnvConfig())
    rng = random.Random(1234)
    rewards: dict[str, list[float]] = {}
    for _ in range(3):
        for t in ALL_TASKS:
            env.reset(t)
            for _ in range(8):
                if env.step(_random_action(rng, 320, 240)).done:
                    break
            rewards.setdefault(t.config["family"], []).append(env.evaluate())
    overall = np.mean([r for rs in rewards.values() for r in rs])
    assert overall < 0.05, overall
    # click-button at tier 1 has 2 big buttons, the easiest target for luck; still rare.
    # click-target is one button and nothing else to hit: 8 random clicks find it 1 in 4.
    luck = {f: float(np.mean(rs)) for f, rs in rewards.items()}
    assert luck.pop("click-target") < 0.35, luck
    assert max(luck.values()) < 0.2, luck


def test_same_task_gives_same_pixels_and_placement_changes_them() -> None:
    t = make_task("fill-form", 3, 7)
    a = MiniDeskEnv(_cfg(placement="flow")).reset(t).screenshot
    b = MiniDeskEnv(_cfg(placement="flow")).reset(t).screenshot
    c = MiniDeskEnv(_cfg(placement="scatter")).reset(t).screenshot
    assert a == b
    assert a != c


def test_position_wallpaper_codes_coordinates() -> None:
    img = np.asarray(position_wallpaper(320, 240))
    # red = round(255 * x / 319), green = round(255 * y / 239), blue = 96
    assert tuple(img[0, 0]) == (0, 0, 96)
    assert tuple(img[239, 319]) == (255, 255, 96)
    assert tuple(img[120, 160]) == (128, 128, 96)  # 255*160/319 = 127.9; 255*120/239 = 128.0
    # and it shows through the window body on a real frame (a corner far from widgets)
    obs = MiniDeskEnv(_cfg(wallpaper="position")).reset(make_task("click-button", 1, 0))
    frame = np.asarray(obs.frame)  # type: ignore[attr-defined]
    assert tuple(frame[230, 310]) == tuple(img[230, 310])


def test_png_is_encoded_lazily_and_pickles_as_plain_observation() -> None:
    env = MiniDeskEnv(EnvConfig())
    obs = env.reset(make_task("dropdown", 2, 3))
    assert isinstance(obs, FrameObservation) and not obs.encoded
    decoded = np.asarray(Image.open(io.BytesIO(obs.screenshot)).convert("RGB"))
    assert obs.encoded
    assert (decoded == np.asarray(obs.frame)).all()
    plain = pickle.loads(pickle.dumps(obs))
    assert type(plain) is Observation and plain.screenshot == obs.screenshot
    eager = MiniDeskEnv(_cfg(encode_png=True)).reset(make_task("dropdown", 2, 3))
    assert type(eager) is Observation and eager.screenshot == obs.screenshot


def _play(env: MiniDeskEnv, actions: list[Action]) -> list[dict[str, object]]:
    return [env.step(a).info for a in actions]


def _click(p: tuple[float, float]) -> Action:
    return Action(ActionKind.CLICK, point=p)


def test_dialog_is_modal_and_cancel_keeps_the_file() -> None:
    env = MiniDeskEnv(_cfg(placement="flow"))
    t = make_task("confirm-dialog", 1, 0)
    env.reset(t)
    s = env.scene
    files, delete = s.widgets["files"], s.widgets["delete"]
    target = t.config["goal"]["values"]["files"]
    row = files.row_rect(files.items.index(target)).center
    _, cancel = s.dialog_buttons()
    infos = _play(
        env, [_click(row), _click(delete.rect.center), _click((2, 236)), _click(cancel.center)]
    )
    assert [i["event"] for i in infos] == [
        "selected",
        "dialog",
        "blocked_by_dialog",
        "dialog_cancel",
    ]
    assert not env.done and env.evaluate() == 0.0
    r = env.step(_click(delete.rect.center))
    r = env.step(Action(ActionKind.HOTKEY, text="enter"))  # Enter confirms the dialog
    assert r.done and r.info["committed"] == "delete" and env.evaluate() == 1.0


def test_typing_select_all_and_enter() -> None:
    env = MiniDeskEnv(_cfg(placement="flow"))
    t = make_task("type-field", 3, 5)  # tier 3: the field starts with text to replace
    env.reset(t)
    f = env.scene.widgets["t0"]
    want = t.config["goal"]["values"]["t0"]
    assert f.text
    _play(env, [Action(ActionKind.TYPE, text="lost")])  # no focus: goes nowhere
    _play(env, [_click(f.field_box().center), Action(ActionKind.TYPE, text="zz")])
    assert f.text.endswith("zz")
    _play(env, [Action(ActionKind.HOTKEY, text="ctrl a"), Action(ActionKind.TYPE, text=want)])
    assert f.text == want
    t1 = env.scene.widgets["t1"]
    _play(env, [Action(ActionKind.HOTKEY, text="tab"), Action(ActionKind.HOTKEY, text="ctrl+a")])
    r = env.step(Action(ActionKind.TYPE, text=t.config["goal"]["values"]["t1"] + "\n"))
    # "...\n" typed into the second field, then Enter pressed the default commit button
    assert t1.text == t.config["goal"]["values"]["t1"]
    assert r.done and r.info["committed"] == "ok" and env.evaluate() == 1.0


def test_scroll_clamps_and_wrong_commit_fails() -> None:
    env = MiniDeskEnv(_cfg(placement="flow"))
    env.reset(make_task("scroll-list", 3, 2))  # 20 items, 5 rows: offsets 0..15
    lst = env.scene.widgets["items"]
    c = lst.list_box().center
    for _ in range(20):
        env.step(Action(ActionKind.SCROLL, point=c, direction="down"))
    assert lst.offset == 15
    env.step(Action(ActionKind.DRAG, point=(c[0], c[1]), end_point=(c[0], c[1] + 24)))
    assert lst.offset == 13  # dragged down 24 px = 2 rows of 12 px: content moves back 2
    r = env.step(_click(env.scene.widgets["cancel"].rect.center))
    assert r.done and env.evaluate() == 0.0
    r2 = env.step(_click((1, 1)))  # after the end nothing changes
    assert r2.done and r2.info["event"] == "episode_over"


def test_oracle_recovers_from_a_detour() -> None:
    env = MiniDeskEnv(_cfg(placement="scatter"))
    t = make_task("fill-form", 3, 11)
    env.reset(t)
    role = env.scene.widgets["role"]
    _play(env, [_click(role.field_box().center), Action(ActionKind.HOTKEY, text="escape")])
    _play(env, [_click(env.scene.widgets["news"].rect.center)])
    steps = 0
    while not env.done and steps < 20:
        env.step(oracle_action(env))
        steps += 1
    assert env.evaluate() == 1.0


def test_bad_input_names_the_problem() -> None:
    env = make_env(EnvConfig(kind="minidesk"))
    with pytest.raises(EnvInputError, match="reset"):
        env.step(_click((1, 1)))
    with pytest.raises(EnvInputError, match="widgets"):
        env.reset(Task("x", "do it", "minidesk", {"goal": {"commit": "ok"}}))
    spec = dict(make_task("click-button", 1, 0).config)
    spec["goal"] = {"commit": "nope"}
    with pytest.raises(EnvInputError, match="'nope'"):
        env.reset(Task("x", "do it", "minidesk", spec))
    env.reset(make_task("click-button", 1, 0))
    # an action it cannot carry out is a failed step that says why, not an exception
    r = env.step(Action(ActionKind.CLICK))
    assert (r.done, r.info) == (
        False,
        {"event": "invalid", "error": "invalid action: click needs a point"},
    )
    # the env is still usable after refusing bad input
    assert env.step(Action(ActionKind.WAIT)).info["event"] == "wait"
    tiny = MiniDeskEnv(EnvConfig(screen_width=120, screen_height=60))
    with pytest.raises(EnvInputError, match="does not fit a 120x60 screen"):
        tiny.reset(make_task("fill-form", 3, 0))


def test_generator_reproduces_the_shipped_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    main(["--out", str(tmp_path)])
    from dart_ray.envs.minidesk.generate import TASKS_DIR

    for split in ("train", "heldout"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (
            TASKS_DIR / f"{split}.jsonl"
        ).read_bytes()


def test_oracle_thought_names_the_element_it_acts_on() -> None:
    from dart_ray.envs.minidesk.oracle import thought

    env = MiniDeskEnv()
    for task in ALL_TASKS[::5]:
        env.reset(task)
        for _ in range(20):
            if env.done:
                break
            a = oracle_action(env)
            words = thought(env.scene, a)
            if a.point is not None:  # every oracle click lands on something it can name
                assert "'" in words and not words.endswith("there."), (task.task_id, words)
            env.step(a)
    env.reset(make_task("click-button", 2, 7))
    label = env.task.instruction.split("'")[1]  # type: ignore[union-attr]
    assert thought(env.scene, oracle_action(env)) == f"I click the '{label}' button."


def test_button_colours_follow_the_label_not_the_screen() -> None:
    from dart_ray.envs.minidesk.render import FACE, button_face
    from dart_ray.envs.minidesk.vocab import BUTTONS

    assert len({button_face(b) for b in BUTTONS}) == len(BUTTONS)

    def face_of(env: MiniDeskEnv, label: str, obs: Observation) -> tuple[int, ...]:
        w = next(w for w in env.scene.widgets.values() if w.label == label)
        img = np.asarray(Image.open(io.BytesIO(obs.screenshot)).convert("RGB"))
        return tuple(int(c) for c in img[w.rect.y + 2, w.rect.x + 2])

    coloured, plain = MiniDeskEnv(_cfg(button_colours=True)), MiniDeskEnv(_cfg())
    seen: dict[str, set[tuple[int, ...]]] = {}
    for seed in range(6):
        task = make_task("click-button", 2, seed)
        obs, plain_obs = coloured.reset(task), plain.reset(task)
        for w in coloured.scene.widgets.values():
            seen.setdefault(w.label, set()).add(face_of(coloured, w.label, obs))
            assert face_of(plain, w.label, plain_obs) == FACE
    assert all(faces == {button_face(label)} for label, faces in seen.items())


def test_generate_writes_a_suite_of_chosen_families_and_tiers(tmp_path: Path) -> None:
    args = ["--families", "click-button", "--tiers", "2", "--train-per-cell", "3"]
    main(["--out", str(tmp_path), *args, "--heldout-per-cell", "2"])
    train = load_tasks(tmp_path / "train.jsonl")
    held = load_tasks(tmp_path / "heldout.jsonl", "heldout")
    assert (len(train), len(held)) == (3, 2)
    assert {(t.config["family"], t.config["tier"]) for t in train + held} == {("click-button", 2)}


def test_the_learning_suite_holds_out_its_seeds() -> None:
    root = Path(__file__).resolve().parents[2] / "fixtures" / "click-grounding"
    train = load_tasks(root / "train.jsonl")
    held = load_tasks(root / "heldout.jsonl", "heldout")
    assert (len(train), len(held)) == (1000, 300)
    assert not {t.config["seed"] for t in train} & {t.config["seed"] for t in held}
    assert {len(t.config["widgets"]) for t in held} == {4}  # the named button among four


def test_grid_placement_centres_every_widget_on_a_28px_cell() -> None:
    cfg = EnvConfig(screen_width=168, screen_height=112, minidesk=MiniDeskOptions(placement="grid"))
    env, centres = MiniDeskEnv(cfg), set()
    for seed in range(40):
        task = make_task("click-button", 2, seed)
        env.reset(task)
        for w in env.scene.widgets.values():
            cx, cy = w.rect.center
            assert (int(cx) % 28, int(cy) % 28) == (14, 14), (task.task_id, w.rect)
            centres.add((int(cx), int(cy)))
        assert solve(task, cfg) == (1.0, 1)
    assert len(centres) >= 6  # seeded cells, not one fixed layout


def _scroll_list() -> tuple[MiniDeskEnv, str]:
    env = MiniDeskEnv(_cfg(placement="flow"))
    env.reset(make_task("scroll-list", 3, 1))
    [lst] = [w.id for w in env.scene.widgets.values() if w.kind == "list"]
    return env, lst


def test_a_scroll_without_a_point_scrolls_where_the_pointer_is() -> None:
    """UI-TARS may leave the point out (`scroll(direction='down')`); pyautogui then scrolls
    wherever the mouse is. Here: at the last point the model clicked or scrolled at, the
    centre of the screen before any."""
    env, lst = _scroll_list()
    box = env.scene.widgets[lst].list_box()
    assert not box.contains(160, 120)  # the list is not under the centre of the screen
    r = env.step(Action(ActionKind.SCROLL, direction="down"))
    assert r.info == {"event": "nothing"} and env.scene.widgets[lst].offset == 0
    env.step(_click((box.x + 5, box.y + 3)))  # the pointer is over the list now
    r = env.step(Action(ActionKind.SCROLL, direction="down"))
    assert r.info == {"event": "scrolled", "target": lst, "value": 3}  # three rows
    r = env.step(Action(ActionKind.SCROLL, direction="up"))
    assert r.info["value"] == 0


def test_typed_lines_are_typed_with_enter_between() -> None:
    """`type(content='ab\\ncd')` types ab, presses Enter, types cd (UI-TARS's newline is
    Enter); here Enter commits nothing (the only commit is a menu item), so cd must land."""
    spec = {
        "widgets": [{"id": "note", "kind": "textfield", "label": "Note"}],
        "menus": {"File": ["Save"]},
        "goal": {"commit": "menu:File/Save", "values": {"note": "abcd"}},
    }
    env = MiniDeskEnv(_cfg(placement="flow"))
    env.reset(Task("t", "Type abcd, save.", "minidesk", spec))
    env.step(_click(env.scene.widgets["note"].field_box().center))
    r = env.step(Action(ActionKind.TYPE, text="ab\ncd"))
    assert env.scene.widgets["note"].text == "abcd" and not r.done
    # once an Enter commits, the episode is over: what follows is not typed
    spec["widgets"].append({"id": "ok", "kind": "button", "label": "OK", "commit": True})
    spec["goal"] = {"commit": "ok"}
    env.reset(Task("t", "Press OK.", "minidesk", spec))
    env.step(_click(env.scene.widgets["note"].field_box().center))
    r = env.step(Action(ActionKind.TYPE, text="ab\ncd"))
    assert r.done and env.scene.committed == "ok" and env.scene.widgets["note"].text == "ab"


def test_text_over_the_type_limit_is_a_failed_step() -> None:
    env = MiniDeskEnv(EnvConfig(max_type_chars=5))
    env.reset(make_task("type-field", 1, 0))
    r = env.step(Action(ActionKind.TYPE, text="abcdef"))
    assert (r.done, r.info) == (
        False,
        {"event": "invalid", "error": "invalid action: type content has 6 characters, more than 5"},
    )
    assert env.step(Action(ActionKind.TYPE, text="abcde")).info["event"] != "invalid"


def test_sessions_of_a_process_share_one_background_and_frames_never_draw_on_it() -> None:
    """Memory per session (docs/BENCHMARKS.md): a 1920x1080 session holds its current frame,
    not a background of its own as well; the shared background stays as drawn."""
    cfg = EnvConfig(screen_width=1920, screen_height=1080)
    task = next(t for t in ALL_TASKS if t.config["family"] == "click-button")
    a, b = MiniDeskEnv(cfg), MiniDeskEnv(cfg)
    a.reset(task)
    b.reset(task)
    assert a._base is b._base
    before = np.asarray(a._base).copy()
    a.step(oracle_action(a))
    assert np.array_equal(np.asarray(b._base), before)
    assert a._frame is not a._base


def test_an_unknown_key_is_a_failed_step_that_names_it_not_a_silent_no_op() -> None:
    """`hotkey(key='blorp')` is not a key: the step fails and says which key (as the desktop's
    and MiniWoB's envs do); a real key with nothing to act on (`ctrl z`) stays a quiet no-op."""
    env = MiniDeskEnv(_cfg())
    env.reset(make_task("click-button", 1, 0))
    bad = env.step(Action(ActionKind.HOTKEY, text="ctrl blorp"))
    assert not bad.done and "unknown key 'blorp'" in bad.info.get("error", ""), bad.info
    ok = env.step(Action(ActionKind.HOTKEY, text="ctrl z"))
    assert "error" not in ok.info and ok.info["event"] == "nothing", ok.info


def test_text_the_bitmap_font_cannot_draw_is_typed_and_shown_not_an_env_crash() -> None:
    # a sampled response can hold U+FFFD (a token cut mid-character) or any non-Latin-1 text:
    # the field keeps what was typed and the frame draws it, as a real text box would; it
    # raised UnicodeEncodeError from PIL's bitmap font, which the session turned into an
    # ABORTED episode (the machine's fault, retried) in run r3tbo
    env = MiniDeskEnv(_cfg(placement="flow"))
    t = make_task("type-field", 1, 58)
    env.reset(t)
    f = env.scene.widgets["t0"]
    _play(env, [_click(f.field_box().center)])
    r = env.step(Action(ActionKind.TYPE, text="li\ufffdnus €"))
    assert f.text == "li\ufffdnus €" and not r.done
    assert np.asarray(Image.open(io.BytesIO(r.observation.screenshot))).size
    assert env.evaluate() == 0.0
