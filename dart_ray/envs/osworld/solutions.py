"""Written solutions of OSWorld tasks that run offline here, as UI-TARS actions (issue 43).

What they are for: the script engine (`policy.engine = "script"`) plays them through the same
episodes as a model, so `dart-ray eval` shows that a task is set up, solved and scored 1 by
OSWorld's own evaluator on our desktop (and 0 with an empty script); and their trajectories
are successes to seed the success-replay pool where a tiny policy finds none.

How they solve: as a user at the keyboard would, with the actions UI-TARS has. Most open a
terminal (Ctrl+Alt+T) and type the command that makes the change; an app whose settings
file the task checks is closed first (it would write its own copy over the change on exit,
as GIMP, VLC, Chromium and LibreOffice do). Infeasible tasks (OSWorld's `infeasible`
evaluator) are solved by saying so: `call_user()`, OSWorld's FAIL. Keys are OSWorld task ids;
the task files come from the pinned checkout (`dart_ray.envs.osworld.tasks`). None of the
task text is copied here: only ids and our own actions.

    python -m dart_ray.envs.osworld.solutions --osworld ../OSWorld --out runs/osworld-local

writes there `tasks.jsonl` (the solved tasks, from the checkout), `scripts.jsonl` (their
solutions, for `policy.model_path` with the script engine, and `curation.replay_seeds`),
`empty.jsonl` (each task with no action: must score 0), and `train.jsonl` / `heldout.jsonl`
(`TRAIN` and the rest: what `configs/osworld-local.toml` trains on and holds out).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dart_ray.envs.osworld.tasks import iter_tasks, write_jsonl
from dart_ray.records import Action, ActionKind
from dart_ray.uitars.actions import format_action

WAIT = Action(ActionKind.WAIT)
INFEASIBLE = [Action(ActionKind.CALL_USER)]


def terminal(*commands: str) -> list[Action]:
    """Wait for the apps the set-up started to show (a window that appears later takes the
    focus, and the typing with it), open a terminal, type each command (a line each), wait
    for the last to finish."""
    typed = [Action(ActionKind.TYPE, text=c + "\n") for c in commands]
    return [WAIT, Action(ActionKind.HOTKEY, text="ctrl alt t"), WAIT, *typed, WAIT]


def _until_gone(name: str) -> str:
    """Close the app whose process name matches the pattern `name`, and wait until it has
    ended (and so written its files)."""
    return f"pkill '{name}'; while pgrep '{name}' >/dev/null; do sleep 0.5; done"


def gimp(file: str, key: str, value: str) -> list[Action]:
    """GIMP closed, then `(key value)` first in its config file in place of any earlier one."""
    f = f"~/.config/GIMP/2.10/{file}"
    return terminal(
        f"{_until_gone('^gimp')}; mkdir -p ~/.config/GIMP/2.10; touch {f}",
        f"{{ echo '({key} {value})'; grep -v '^({key} ' {f}; }} > /tmp/rc; mv /tmp/rc {f}",
    )


def vlc(section: str, key: str, value: str) -> list[Action]:
    """VLC closed, then `key=value` in its section of vlcrc in place of any earlier one."""
    f = "~/.config/vlc/vlcrc"
    return terminal(
        f"{_until_gone('^vlc$')}; mkdir -p ~/.config/vlc; touch {f}",
        f"sed -i '/^#*{key}=/d' {f} && printf '[{section}]\\n{key}={value}\\n' >> {f}",
    )


CHROME = "^chrom(e|ium)$"  # the browser's processes, not its crash handler (which stays)


def chrome(file: str, edit: str) -> list[Action]:
    """Chromium closed, then `edit` applied to its JSON settings file `file` (`d`, the file's
    object; empty where Chromium has not written the file yet, as `Bookmarks` before the first
    bookmark), as the settings page would write it."""
    path = f"~/.config/google-chrome/{file}"
    return terminal(
        _until_gone(CHROME),
        f"python3 -c \"import json,os; p=os.path.expanduser('{path}'); "
        f"d=json.load(open(p)) if os.path.exists(p) else {{}}; {edit}; json.dump(d, open(p, 'w'))\"",
    )


FORGET_YOUTUBE = (
    "import os,sqlite3; p=os.path.expanduser('~/.config/google-chrome/Default/History'); "
    "c=sqlite3.connect(p); q='%youtube%'; "
    "c.execute('delete from visits where url in (select id from urls where url like ?)', (q,)); "
    "c.execute('delete from urls where url like ?', (q,)); c.commit()"
)
LO_XCU = "~/.config/libreoffice/4/user/registrymodifications.xcu"
# LibreOffice's setting as its Options dialog writes it. `<` is written chr(60): typed into
# a terminal through pyautogui it comes out as `>` (pyautogui holds Shift for `<` and presses
# the first key X names for it, the ISO `<>` key, whose shifted symbol is `>`)
AUTOSAVE_3_MINUTES = (
    f"import os; p=os.path.expanduser('{LO_XCU}'); s=open(p).read(); L=chr(60); "
    "i=L+'item oor:path=\\\"/org.openoffice.Office.Common/Save/Document\\\">'+L+'prop "
    "oor:name=\\\"AutoSaveTimeIntervall\\\" oor:op=\\\"fuse\\\">'+L+'value>3'+L+'/value>'+L+"
    "'/prop>'+L+'/item>'; open(p, 'w').write(s.replace(L+'/oor:items>', i+L+'/oor:items>'))"
)

SOLUTIONS: dict[str, tuple[str, list[Action]]] = {
    # ------------------------------------------------------------------ chrome
    "bb5e4c0d-f964-439c-97b6-bdb9747de3f4": (  # Bing as the default search engine
        "chrome",
        chrome(
            "Default/Preferences",
            "d['default_search_provider_data']={'template_url_data': {'short_name': 'Bing', "
            "'keyword': 'bing.com', 'url': 'https://www.bing.com/search?q={searchTerms}'}}",
        ),
    ),
    "2ad9387a-65d8-4e33-ad5b-7580065a27ca": (  # a 'Favorites' folder on the bookmarks bar
        "chrome",
        chrome(
            "Default/Bookmarks",
            "d.setdefault('roots', {}).setdefault('bookmark_bar', {'type': 'folder', 'name': "
            "'Bookmarks bar', 'id': '1', 'children': []})['children'].append({'type': 'folder', "
            "'name': 'Favorites', 'id': '900', 'children': [], 'date_added': '13340000000000000'})",
        ),
    ),
    "44ee5668-ecd5-4366-a6ce-c1c9b8d4e938": (  # YouTube's visits out of the history
        "chrome",
        terminal(
            _until_gone(CHROME),
            f'python3 -c "{FORGET_YOUTUBE}"',
        ),
    ),
    "2ae9ba84-3a0d-4d4c-8338-3a1478dc5fe3": (  # the profile named Thomas
        "chrome",
        chrome("Default/Preferences", "d.setdefault('profile', {})['name']='Thomas'"),
    ),
    "480bcfea-d68f-4aaa-a0a9-2589ef319381": (  # the 2023 refresh UI off (chrome://flags)
        "chrome",
        chrome(
            "Local State",
            "d.setdefault('browser', {})['enabled_labs_experiments']="
            "['chrome-refresh-2023@2', 'chrome-webui-refresh-2023@2']",
        ),
    ),
    "af630914-714e-4a24-a7bb-f9af687d3b91": (  # a larger default font
        "chrome",
        chrome(
            "Default/Preferences",
            "d.setdefault('webkit', {}).setdefault('webprefs', {})['default_font_size']=20",
        ),
    ),
    "030eeff7-b492-4218-b312-701ec99ee0cc": (  # Do Not Track on
        "chrome",
        chrome("Default/Preferences", "d['enable_do_not_track']=True"),
    ),
    "9656a811-9b5b-4ddf-99c7-5117bcef0626": (  # enhanced safe browsing on
        "chrome",
        chrome(
            "Default/Preferences",
            "d.setdefault('safebrowsing', {}).update(enabled=True, enhanced=True)",
        ),
    ),
    "3720f614-37fd-4d04-8a6b-76f54f8c222d": ("chrome", INFEASIBLE),
    "93eabf48-6a27-4cb6-b963-7d5fe1e0d3a9": ("chrome", INFEASIBLE),
    "ae78f875-5b98-4907-bbb5-9c737fc68c03": ("chrome", INFEASIBLE),
    # ------------------------------------------------------------------ gimp
    "d52d6308-ec58-42b7-a2c9-de80e4837b2b": ("gimp", gimp("sessionrc", "hide-docks", "yes")),
    "7b7617bd-57cc-468e-9c91-40c4ec2bcb3d": ("gimp", gimp("gimprc", "undo-levels", "100")),
    "7767eef2-56a3-4cea-8c9f-48c070c7d65b": ("gimp", gimp("gimprc", "theme", '"Light"')),
    "e19bd559-633b-4b02-940f-d946248f088e": ("gimp", INFEASIBLE),
    "fbb548ca-c2a6-4601-9204-e39a2efc507b": ("gimp", INFEASIBLE),
    "5ca86c6f-f317-49d8-b6a7-b527541caae8": ("gimp", INFEASIBLE),
    # ------------------------------------------------------------------ libreoffice
    "2bd59342-0664-4ccb-ba87-79379096cc08": ("libreoffice_calc", INFEASIBLE),
    "2cd43775-7085-45d8-89fa-9e35c0a915cf": (  # AutoRecovery information every 3 minutes
        "libreoffice_impress",
        terminal(_until_gone("^soffice"), f'python3 -c "{AUTOSAVE_3_MINUTES}"'),
    ),
    # ------------------------------------------------------------------ multi_apps
    "6d72aad6-187a-4392-a4c4-ed87269c51cf": ("multi_apps", INFEASIBLE),
    # ------------------------------------------------------------------ os
    "e0df059f-28a6-4169-924f-b9623e7184cc": (  # rename a folder root made
        "os",
        terminal("sudo mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"),
    ),
    "a462a795-fdc7-4b23-b689-e8b6df786b78": ("os", INFEASIBLE),
    "b3d4a89c-53f2-4d6b-8b6a-541fb5d205fa": ("os", INFEASIBLE),
    "fe41f596-a71b-4c2f-9b2f-9dcd40b568c3": ("os", INFEASIBLE),
    "c288e301-e626-4b98-a1ab-159dcb162af5": ("os", INFEASIBLE),
    "4783cc41-c03c-4e1b-89b4-50658f642bd5": ("os", INFEASIBLE),
    # ------------------------------------------------------------------ vlc
    "8ba5ae7a-5ae5-4eab-9fcc-5dd4fe3abf89": (  # recordings go to the Desktop
        "vlc",
        vlc("core", "input-record-path", "/home/user/Desktop"),
    ),
    "9195653c-f4aa-453d-aa95-787f6ccfaae9": ("vlc", vlc("qt", "qt-max-volume", "200")),
    "d06f0d4d-2cd5-4ede-8de9-598629438c6e": (  # a black-ish volume slider
        "vlc",
        vlc("qt", "qt-slider-colours", "20;20;20;40;40;40;60;60;60;80;80;80"),
    ),
    "a5bbbcd5-b398-4c91-83d4-55e1e31bbb81": ("vlc", vlc("qt", "qt-minimal-view", "1")),
    "f3977615-2b45-4ac5-8bba-80c17dbe2a37": (
        "vlc",
        vlc("core", "one-instance-when-started-from-file", "0"),
    ),
    "215dfd39-f493-4bc3-a027-8a97d72c61bf": ("vlc", vlc("qt", "qt-bgcone", "0")),
    "5ac2891a-eacd-4954-b339-98abba077adb": ("vlc", INFEASIBLE),
    "cb130f0d-d36f-4302-9838-b3baf46139b6": ("vlc", INFEASIBLE),
    "7882ed6e-bece-4bf0-bada-c32dc1ddae72": ("vlc", INFEASIBLE),
}
"""OSWorld task id -> (domain, the actions that solve it)."""

LEFT_OUT: dict[str, str] = {
    "69acbb55-d945-4927-a87b-8480e1a5bb7e": "installs a project's packages (the internet)",
    "48d05431-6cd5-4e76-82eb-12b60d823f7d": "installs conda (a download)",
    "2373b66a-092d-44cb-bfd7-82e86e7a3b4d": "needs sysstat, not in the profile (apt: the internet)",
    "e1fc0df3-c8b9-4ee7-864c-d0b590d3aa56": "installs a LibreOffice extension (the internet)",
    "3c8f201a-009d-4bbe-8b65-a6f8b35bb57f": "downloads its image from Google Drive",
    "94d95f96-9699-4208-98ba-3c3119edf9c2": "installs Spotify (the internet)",
    "bba3381f-b5eb-4439-bd9e-80c22218d5a7": "streams a YouTube video (the internet)",
    "28cc3b7e-b194-4bc9-8353-d04c0f4d56d2": "no PulseAudio in the profile (its getter runs pactl)",
    "b6781586-6346-41cd-935a-a6b1487918fc": "timedatectl needs systemd, which the desktop lacks",
    "ef9d12bd-bcee-4ba0-a40e-918400f43ddf": "its set-up's menu keys miss the slide pane in "
    "Debian's LibreOffice: the initial state scores 1",
    "937087b6-f668-4ba6-9110-60682ee33441": "VLC is the profile's only video player: the "
    "initial state scores 1",
    "99146c54-4f37-4ab8-9327-5f3291665e1e": "Chromium writes the setting its getter looks for "
    "into every profile it closes: the initial state scores 1",
    "12086550-11c0-466b-b367-1d9e75b3910e": "its getter finds the address bar under the "
    "application 'Google Chrome' in the accessibility tree; ours is Chromium",
    "13584542-872b-42d8-b299-866967b5c3ef": "the profile's terminal (xterm, sized on its command "
    "line by Ctrl+Alt+T's binding) has no size setting a user can keep",
}
"""The offline-runnable tasks without a solution here, and why."""


TRAIN = (
    "bb5e4c0d-f964-439c-97b6-bdb9747de3f4",
    "2ad9387a-65d8-4e33-ad5b-7580065a27ca",
    "030eeff7-b492-4218-b312-701ec99ee0cc",
    "3720f614-37fd-4d04-8a6b-76f54f8c222d",
    "d52d6308-ec58-42b7-a2c9-de80e4837b2b",
    "e19bd559-633b-4b02-940f-d946248f088e",
    "e0df059f-28a6-4169-924f-b9623e7184cc",
    "a462a795-fdc7-4b23-b689-e8b6df786b78",
    "b3d4a89c-53f2-4d6b-8b6a-541fb5d205fa",
    "8ba5ae7a-5ae5-4eab-9fcc-5dd4fe3abf89",
    "9195653c-f4aa-453d-aa95-787f6ccfaae9",
    "5ac2891a-eacd-4954-b339-98abba077adb",
)
"""What `configs/osworld-local.toml` trains on (`train.jsonl`): 12 solved tasks over chrome,
gimp, os and vlc, 8 solved on the desktop and 4 infeasible (one per domain), each set up and
solved in well under a minute here, so a 20-minute run seeds every one and still trains. The
other 23 solved tasks are `heldout.jsonl`."""


def script_lines(
    solutions: dict[str, tuple[str, list[Action]]], instructions: dict[str, str]
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(scripts, empty): JSONL rows for the script engine, keyed by each task's instruction."""
    scripts: list[dict[str, object]] = []
    empty: list[dict[str, object]] = []
    for task_id, (_, actions) in solutions.items():
        row = {"task_id": task_id, "instruction": instructions[task_id]}
        scripts.append(row | {"actions": [format_action(a, box_tokens=False) for a in actions]})
        empty.append(row | {"actions": []})
    return scripts, empty


def write(osworld: Path, out: Path) -> int:
    """The solved tasks from an OSWorld checkout, their scripts and the empty scripts."""
    examples = osworld / "evaluation_examples"
    index: dict[str, list[str]] = {}
    for task_id, (domain, _) in SOLUTIONS.items():
        index.setdefault(domain, []).append(task_id)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    tasks = list(iter_tasks(examples, out / "index.json", "osworld", "heldout"))
    instructions = {t.task_id: t.instruction for t in tasks}
    scripts, empty = script_lines(SOLUTIONS, instructions)
    for name, rows in (("scripts.jsonl", scripts), ("empty.jsonl", empty)):
        (out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    train = [replace(t, split="train") for t in tasks if t.task_id in TRAIN]
    write_jsonl(iter(train), out / "train.jsonl")
    write_jsonl((t for t in tasks if t.task_id not in TRAIN), out / "heldout.jsonl")
    return write_jsonl(iter(tasks), out / "tasks.jsonl")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dart_ray.envs.osworld.solutions", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--osworld", type=Path, required=True, help="an OSWorld checkout")
    p.add_argument("--out", type=Path, required=True, help="folder to write the files to")
    args = p.parse_args(argv)
    try:
        n = write(args.osworld, args.out)
    except ValueError as e:
        print(f"osworld_solutions: {e}", file=sys.stderr)
        return 2
    domains = len({d for d, _ in SOLUTIONS.values()})
    print(f"{n} tasks of {domains} domains with their solutions written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
