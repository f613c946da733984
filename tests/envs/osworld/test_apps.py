"""OSWorld-format tasks on the OSWorld desktop profile, end to end: each of our task files in
`fixtures/osworld_apps` (OSWorld's layout: an index and `examples/<domain>/<id>.json`) is
loaded by our converter, set up through `LocalDesktopEnv` as OSWorld's `user` with HOME
/home/user, scored 0 by OSWorld's own evaluator, solved by a script, and scored 1.

Marker `osworld_apps`: needs the profile (`scripts/install-osworld-desktop.sh`, as root: the
apps, the account, sudo) and `.venv-osworld`; `make test-osworld-apps` installs both and runs
this. LibreOffice makes it slow (docs/ENVIRONMENTS.md gives the time), so CI leaves it out."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from dart_ray.config import EnvConfig
from dart_ray.config.env import DesktopOptions
from dart_ray.envs.desktop import profile
from dart_ray.envs.osworld.env import LocalDesktopEnv
from dart_ray.envs.osworld.tasks import iter_tasks
from dart_ray.records import Action, ActionKind, Task
from tests.envs.osworld.venv import VENV, has_venv


def _profile_missing() -> str | None:
    try:
        profile.run_as_user(["true"])
    except profile.ProfileMissing as e:
        return str(e)
    return None


pytestmark = [
    pytest.mark.osworld_apps,
    pytest.mark.skipif(_profile_missing() is not None, reason=f"{_profile_missing()}"),
    has_venv,
]
FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "osworld_apps"
TASKS = list(iter_tasks(FIXTURES, FIXTURES / "test_apps.json", "desktop", "heldout"))
H = "/home/user"
# soffice with a profile of its own: never hands the job to a LibreOffice already running
LO = "soffice -env:UserInstallation=file:///tmp/dart-lo-solve-$USER --headless --convert-to"

# id -> the solution: shell lines run through the server's /execute, or actions
SOLUTIONS: dict[str, list[str | Action]] = {
    "dart-os-open-terminal": [
        Action(ActionKind.HOTKEY, text="ctrl alt t"),
        Action(ActionKind.WAIT),
    ],
    "dart-os-sudo-root-file": [f"sudo -n touch {H}/Desktop/root_owned.txt"],
    "dart-os-chmod-scripts": [f"chmod u+x {H}/Desktop/scripts/*.sh"],
    "dart-os-backup-report": [f"mkdir {H}/Desktop/backup && cp {H}/Documents/report.txt $_"],
    "dart-calc-csv-to-xlsx": [f"{LO} xlsx --outdir {H}/Desktop {H}/Desktop/scores.csv"],
    "dart-calc-total-row": [
        f"cd /tmp && {LO} csv {H}/Desktop/sales.xlsx"
        " && awk -F, 'NR>1{s+=$2} {print} END{print \"Total,\" s}' sales.csv > sales-t.csv"
        f" && mv sales-t.csv sales.csv && {LO} xlsx --outdir {H}/Desktop sales.csv"
    ],
    "dart-calc-export-csv": [f"{LO} csv --outdir {H}/Desktop {H}/Desktop/inventory.xlsx"],
    "dart-writer-new-letter": [
        "printf 'Dear team,\\nThe build is green.\\n' > /tmp/letter.txt"
        f' && {LO} "docx:MS Word 2007 XML" --outdir {H}/Desktop /tmp/letter.txt'
    ],
    "dart-writer-export-pdf": [f"{LO} pdf --outdir {H}/Desktop {H}/Desktop/report.docx"],
    "dart-writer-odt-to-docx": [
        f'{LO} "docx:MS Word 2007 XML" --outdir {H}/Documents {H}/Documents/notes.odt'
    ],
    # through the GUI: a terminal by Ctrl+Alt+T, a command typed into it; scored on the
    # AT-SPI tree (OSWorld's `accessibility_tree` getter reads our /accessibility)
    "dart-writer-open-in-writer": [
        Action(ActionKind.HOTKEY, text="ctrl alt t"),
        Action(ActionKind.WAIT),
        Action(ActionKind.TYPE, text="libreoffice --writer ~/Desktop/memo.txt &\n"),
    ],
    # Chrome's address bar; scored through CDP (OSWorld's open_tabs_info getter, Playwright)
    "dart-chrome-open-local-page": [
        Action(ActionKind.HOTKEY, text="ctrl l"),
        Action(ActionKind.TYPE, text=f"file://{H}/Desktop/notes.html\n"),
        Action(ActionKind.WAIT),
    ],
}
# how the solution's last effect shows in the accessibility tree, for tasks that start an app
SHOWN = {"dart-writer-open-in-writer": "memo.txt - LibreOffice Writer"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDesktopEnv]:
    options = DesktopOptions(
        evaluator="osworld",
        osworld_venv=VENV,
        osworld_profile=True,
        request_timeout_s=180,
        osworld_cache_dir=tmp_path_factory.mktemp("osworld-cache"),
    )
    cfg = EnvConfig(kind="desktop", screen_width=1024, screen_height=768, desktop=options)
    e = LocalDesktopEnv(cfg)
    yield e
    e.close()


def test_the_fixtures_are_twelve_tasks_from_four_domains_each_with_a_solution() -> None:
    assert len(TASKS) == 12
    domains = {t.config["family"] for t in TASKS}
    assert domains == {"os", "libreoffice_calc", "libreoffice_writer", "chrome"}
    assert {t.task_id for t in TASKS} == set(SOLUTIONS)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
def test_osworlds_evaluator_scores_0_before_and_1_after_the_solution(
    env: LocalDesktopEnv, task: Task
) -> None:
    env.reset(task)
    assert env.evaluate() == 0.0  # nothing done yet
    assert env.client is not None
    for step in SOLUTIONS[task.task_id]:
        if isinstance(step, Action):
            env.step(step)
            continue
        r = env.client.execute(["bash", "-c", step])
        assert r.get("returncode") == 0, r
    if task.task_id in SHOWN:
        _wait_for(env, SHOWN[task.task_id])
    assert env.evaluate() == 1.0


def _wait_for(env: LocalDesktopEnv, text: str, timeout_s: float = 90.0) -> None:
    """Until the accessibility tree shows `text` (an app starting takes a while here)."""
    assert env.client is not None
    deadline = time.monotonic() + timeout_s
    while text not in env.client.accessibility():
        assert time.monotonic() < deadline, f"{text!r} not shown after {timeout_s:g}s"
        time.sleep(2)


def test_the_desktop_runs_as_user_with_home_at_home_user(env: LocalDesktopEnv) -> None:
    env.reset(TASKS[0])
    assert env.client is not None
    r = env.client.execute(["bash", "-c", 'echo "$(id -un) $HOME $(pwd)"'])
    assert r["output"].split() == ["user", H, H]
    # a reset empties /home/user: what an episode left is gone
    env.client.execute(["bash", "-c", f"touch {H}/left-behind"])
    env.reset(TASKS[0])
    r = env.client.execute(["bash", "-c", f"ls -A {H}"])
    assert "left-behind" not in r["output"]


def test_accessibility_is_the_atspi_widget_tree_in_osworlds_shape(env: LocalDesktopEnv) -> None:
    env.reset(TASKS[0])
    assert env.client is not None
    env.client.setup("launch", {"command": ["mousepad"], "timeout": 20})
    root = ET.fromstring(env.client.accessibility())
    st = "{https://accessibility.ubuntu.example.org/ns/state}"
    cp = "{https://accessibility.ubuntu.example.org/ns/component}"
    assert root.tag == "desktop-frame"
    app = root.find("application[@name='mousepad']")
    assert app is not None, [a.get("name") for a in root]
    frame = app.find("frame")
    assert frame is not None and frame.get(f"{st}showing") == "true"
    assert frame.get(f"{cp}screencoord", "").startswith("(")
    menus = [m.get("name") for m in app.iter("menu")]
    assert "File" in menus  # the editor's own widgets, not just its window


def test_pkill_chrome_ends_the_browser_as_on_osworlds_vm(env: LocalDesktopEnv) -> None:
    """Many OSWorld tasks end Chrome with `pkill chrome` before a getter reads the settings
    it writes on close; Chromium names its process `chromium`, which that pattern missed, so
    the browser went on running and the file was never written."""
    env.reset(next(t for t in TASKS if t.task_id == "dart-chrome-open-local-page"))
    assert env.client is not None
    before = env.client.execute("sleep 3; pgrep -c -x chromium", shell=True)["output"]
    assert int(before.strip() or 0) > 0  # the task's own google-chrome line started it
    after = env.client.execute(
        "pkill chrome; for i in $(seq 20); do pgrep -x chromium >/dev/null || break; sleep 0.5;"
        " done; pgrep -x chromium || echo gone",
        shell=True,
    )["output"]
    assert after.strip() == "gone"
