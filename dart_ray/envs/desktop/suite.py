"""The desktop task suite: OSWorld-format tasks for a terminal (xterm) and an editor (Mousepad).

Each task has OSWorld's fields (`id`, `instruction`, `config` setup steps, `evaluator`) and a
`demo`: a scripted solution in a tiny language (`focus` a window by title, `type` text, press a
`hotkey`, `call_user`) that tests and warm-start demonstrations turn into UI-TARS actions.
Every evaluator checks real state: file contents and directory listings (through
`vm_command_line`), or the window titles in the accessibility tree (an editor title without
`*` means the file is saved). They use only getters and metrics that OSWorld has, with its
semantics, so OSWorld's own evaluator scores them as ours does
(`tests/envs/osworld/test_official.py`). `load_desktop_tasks()` gives them as dart-ray Tasks; `python -m
dart_ray.envs.desktop.suite` prints them as JSONL.
"""

from __future__ import annotations

import json
from typing import Any

from dart_ray.envs.osworld.env import task_from_json
from dart_ray.records import Task

# Launch the terminal, then wait for its window (titled "Terminal") so the first action finds
# it: OSWorld's own steps, which its SetupController runs as ours does (a loaded CI host can
# take well over 10 s to show it)
TERM = [
    {"type": "launch", "parameters": {"command": ["xterm"]}},
    {
        "type": "execute_with_verification",
        "parameters": {
            "command": ["true"],
            "verification": {"window_exists": "Terminal"},
            "max_wait_time": 30,
            "check_interval": 0.2,
        },
    },
]


def _file(path: str, content: str) -> dict[str, Any]:
    return {"type": "upload_file", "parameters": {"files": [{"path": path, "content": content}]}}


def _open(path: str) -> dict[str, Any]:
    return {"type": "open", "parameters": {"path": path}}


def _rule(func: str, result: dict[str, Any], **rules: Any) -> dict[str, Any]:
    return {"func": func, "result": result, "expected": {"type": "rule", "rules": rules}}


def _shell(command: str) -> dict[str, Any]:
    return {"type": "vm_command_line", "command": command, "shell": True}


def _ls() -> dict[str, Any]:
    """Every path under the home folder, one `[relative/path]` a line: brackets make
    `photo.png` and `Pictures/photo.png` different substrings."""
    return _shell("cd ~ && find . -mindepth 1 -printf '[%P]\\n' | sort")


def _cat(path: str) -> dict[str, Any]:
    """The file's text without trailing newlines ("" when it is missing)."""
    return _shell(f'printf %s "$(cat {path})"')


def _sh(line: str) -> list[dict[str, str]]:
    return [{"focus": "Terminal"}, {"type": line + "\n"}]


TASKS: list[dict[str, Any]] = [
    {
        "id": "term-create-file",
        "instruction": "Using the terminal, create a file named hello.txt in your home folder "
        "that contains the text 'hello world'.",
        "config": TERM,
        "evaluator": _rule("exact_match", _cat("~/hello.txt"), expected="hello world"),
        "demo": _sh("echo 'hello world' > ~/hello.txt"),
    },
    {
        "id": "term-mkdir",
        "instruction": "Create a folder named projects in your home folder.",
        "config": TERM,
        "evaluator": _rule(
            "exact_match", _shell("test -d ~/projects && printf yes || printf no"), expected="yes"
        ),
        "demo": _sh("mkdir ~/projects"),
    },
    {
        "id": "term-rename",
        "instruction": "Rename the file draft.txt in your home folder to final.txt.",
        "config": [_file("~/draft.txt", "v1\n"), *TERM],
        "evaluator": _rule(
            "check_include_exclude", _ls(), include=["[final.txt]"], exclude=["[draft.txt]"]
        ),
        "demo": _sh("mv ~/draft.txt ~/final.txt"),
    },
    {
        "id": "term-delete",
        "instruction": "Delete junk.log from your home folder; keep every other file.",
        "config": [_file("~/junk.log", "x\n"), _file("~/keep.txt", "y\n"), *TERM],
        "evaluator": _rule(
            "check_include_exclude", _ls(), include=["[keep.txt]"], exclude=["[junk.log]"]
        ),
        "demo": _sh("rm ~/junk.log"),
    },
    {
        "id": "term-copy",
        "instruction": "Copy report.txt from your home folder into the Documents folder.",
        "config": [_file("~/report.txt", "Q3 numbers\n"), *TERM],
        "evaluator": _rule("exact_match", _cat("~/Documents/report.txt"), expected="Q3 numbers"),
        "demo": _sh("cp ~/report.txt ~/Documents/"),
    },
    {
        "id": "term-append",
        "instruction": "Add a line saying 'call mom' at the end of todo.txt in your home folder.",
        "config": [_file("~/todo.txt", "buy milk\n"), *TERM],
        "evaluator": _rule("exact_match", _cat("~/todo.txt"), expected="buy milk\ncall mom"),
        "demo": _sh("echo 'call mom' >> ~/todo.txt"),
    },
    {
        "id": "term-move",
        "instruction": "Make a folder named Pictures in your home folder and move "
        "photo.png into it.",
        "config": [_file("~/photo.png", "not really a png\n"), *TERM],
        "evaluator": _rule(
            "check_include_exclude",
            _ls(),
            include=["[Pictures/photo.png]"],
            exclude=["[photo.png]"],
        ),
        "demo": _sh("mkdir ~/Pictures && mv ~/photo.png ~/Pictures/"),
    },
    {
        "id": "editor-type-save",
        "instruction": "Type 'meeting at noon' into the open text editor and save the file.",
        "config": [_file("~/notes.txt", ""), _open("~/notes.txt")],
        "evaluator": {
            "func": ["exact_match", "check_include_exclude"],
            "result": [_cat("~/notes.txt"), {"type": "accessibility_tree"}],
            "expected": [
                {"type": "rule", "rules": {"expected": "meeting at noon"}},
                {"type": "rule", "rules": {"exclude": ["*notes.txt - Mousepad"]}},
            ],
            "conj": "and",
        },
        "demo": [{"focus": "notes.txt"}, {"type": "meeting at noon"}, {"hotkey": "ctrl s"}],
    },
    {
        "id": "editor-replace",
        "instruction": "In the text editor, change the text so that it reads 'color: blue' "
        "instead of 'color: red', and save.",
        "config": [_file("~/style.txt", "color: red"), _open("~/style.txt")],
        "evaluator": _rule("exact_match", _cat("~/style.txt"), expected="color: blue"),
        "demo": [
            {"focus": "style.txt"},
            {"hotkey": "ctrl a"},
            {"type": "color: blue"},
            {"hotkey": "ctrl s"},
        ],
    },
    {
        "id": "editor-open-from-terminal",
        "instruction": "Open the file readme.md from your home folder in the Mousepad text editor.",
        "config": [_file("~/readme.md", "# Read me\n"), *TERM],
        "evaluator": _rule(
            "check_include_exclude",
            {"type": "accessibility_tree"},
            include=["readme.md - Mousepad"],
        ),
        "demo": [*_sh("mousepad ~/readme.md &"), {"sleep": 1.5}],
    },
    {
        "id": "editor-new-line",
        "instruction": "Add a second line 'second' below the first line of list.txt, which is open "
        "in the editor, and save it.",
        "config": [_file("~/list.txt", "first"), _open("~/list.txt")],
        "evaluator": _rule("exact_match", _cat("~/list.txt"), expected="first\nsecond"),
        "demo": [
            {"focus": "list.txt"},
            {"hotkey": "ctrl end"},
            {"type": "\nsecond"},
            {"hotkey": "ctrl s"},
        ],
    },
    {
        "id": "infeasible-spreadsheet",
        "instruction": "Open the spreadsheet application and sum column A.",
        "config": TERM,
        "evaluator": {"func": "infeasible"},
        "demo": [{"call_user": True}],
    },
]


def load_desktop_tasks(split: str = "train") -> list[Task]:
    return [task_from_json(t, "desktop", split) for t in TASKS]


def demo(task_id: str) -> list[dict[str, Any]]:
    return next(t["demo"] for t in TASKS if t["id"] == task_id)


if __name__ == "__main__":
    for t in TASKS:
        print(json.dumps(t))
