"""The coverage measurement's static half: which OSWorld tasks are excluded before anything
runs, and why, on task files we write in OSWorld's format (a checkout's layout in tmp_path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dart_ray.envs.desktop.machine import _empty, _fill
from dart_ray.envs.osworld.cache import main as cache_main
from dart_ray.envs.osworld.cache import task_files
from dart_ray.envs.osworld.coverage import Coverage, exclusion_reasons, main, table
from dart_ray.envs.osworld.setup import cache_name


def _task(task_id: str, config: list[Any], evaluator: dict[str, Any]) -> dict[str, Any]:
    return {"id": task_id, "instruction": "do it", "config": config, "evaluator": evaluator}


OFFLINE = _task(
    "offline-1",
    [{"type": "execute", "parameters": {"command": ["bash", "-c", "touch ~/a"]}}],
    {"func": "exact_match", "result": {"type": "vm_command_line"}, "expected": {"type": "rule"}},
)
DOWNLOADS = _task(
    "download-1",
    [{"type": "download", "parameters": {"files": [{"url": "https://x/y.xlsx", "path": "/p"}]}}],
    {
        "func": "compare_table",
        "result": {"type": "vm_file"},
        "expected": {"type": "cloud_file", "path": "https://x/gold.xlsx", "dest": "gold.xlsx"},
    },
)
CHROME = _task(  # our client runs the Chrome steps; opening a web page needs the internet
    "chrome-1",
    [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.com"]}}],
    {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"}},
)
HISTORY = _task(  # history rows are only written down: no page is fetched
    "history-1",
    [
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["about:blank"]}},
        {
            "type": "update_browse_history",
            "parameters": {"history": [{"url": "https://example.com", "title": "E"}]},
        },
    ],
    {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"}},
)
AUDIO = _task("audio-1", [], {"func": ["compare_audios"], "result": [{"type": "vm_file"}]})


def test_an_offline_task_has_no_reason_to_be_excluded() -> None:
    assert exclusion_reasons(OFFLINE, "os") == []


def test_each_reason_names_what_the_task_needs() -> None:
    assert exclusion_reasons(DOWNLOADS, "libreoffice_calc") == [
        "internet: downloads its files (setup `download`)",
        "internet: getter `cloud_file`",
    ]
    assert exclusion_reasons(CHROME, "chrome") == ["internet: a setup step names a URL"]
    assert exclusion_reasons(HISTORY, "chrome") == []
    assert exclusion_reasons(AUDIO, "vlc") == [
        "metric `compare_audios` needs librosa (left out of the venv)"
    ]
    assert exclusion_reasons(OFFLINE, "vs_code") == ["app not packaged by Debian: VS Code"]


def test_files_in_the_cache_need_no_internet(tmp_path: Path) -> None:
    folder = tmp_path / "download-1"  # OSWorld's cache folder of the task
    folder.mkdir()
    # the download, keyed as OSWorld's SetupController keys it: half of what the task needs
    (folder / cache_name("https://x/y.xlsx", "/p")).write_bytes(b"x")
    assert exclusion_reasons(DOWNLOADS, "libreoffice_calc", tmp_path) == [
        "internet: getter `cloud_file`"
    ]
    (folder / "gold.xlsx").write_bytes(b"x")  # the cloud_file getter's dest: all of it
    assert exclusion_reasons(DOWNLOADS, "libreoffice_calc", tmp_path) == []
    # another task's cache folder is not this task's
    assert exclusion_reasons({**DOWNLOADS, "id": "download-2"}, "os", tmp_path) == [
        "internet: downloads its files (setup `download`)",
        "internet: getter `cloud_file`",
    ]


def test_static_run_writes_one_record_per_task_and_a_table_by_domain(
    tmp_path: Path, capsys: Any
) -> None:
    examples = tmp_path / "evaluation_examples"
    index = {"os": ["offline-1", "download-1"], "chrome": ["chrome-1", "broken-1"]}
    for domain in index:
        (examples / "examples" / domain).mkdir(parents=True)
    for domain, task in (("os", OFFLINE), ("os", DOWNLOADS), ("chrome", CHROME)):
        (examples / "examples" / domain / f"{task['id']}.json").write_text(json.dumps(task))
    (examples / "examples" / "chrome" / "broken-1.json").write_text("{not json")
    (examples / "test_all.json").write_text(json.dumps(index))
    out = tmp_path / "cov.json"
    assert main(["--osworld", str(tmp_path), "--json", str(out), "--static"]) == 0
    rows = {r["task_id"]: r for r in json.loads(out.read_text())["tasks"]}
    assert set(rows) == {"offline-1", "download-1", "chrome-1", "broken-1"}
    assert rows["offline-1"]["loads"] and not rows["offline-1"]["excluded"]
    assert rows["download-1"]["excluded"] and rows["chrome-1"]["excluded"]
    assert not rows["broken-1"]["loads"]
    assert rows["broken-1"]["reasons"][0].startswith("does not load:")
    printed = capsys.readouterr().out
    # chrome: 2 tasks, 1 loads, 1 excluded; os: 2 tasks, 2 load, 1 excluded; nothing run
    assert "| chrome | 2 | 1 | 1 | 0 | 0 | 0 |" in printed
    assert "| os | 2 | 2 | 1 | 0 | 0 | 0 |" in printed
    assert "| **all** | 4 | 3 | 2 | 0 | 0 | 0 |" in printed
    # with download-1's files in a cache folder, only chrome-1 is left out
    cache = tmp_path / "cache" / "download-1"
    cache.mkdir(parents=True)
    (cache / cache_name("https://x/y.xlsx", "/p")).write_bytes(b"x")
    (cache / "gold.xlsx").write_bytes(b"x")
    argv = ["--osworld", str(tmp_path), "--json", str(out), "--static", "--cache"]
    assert main([*argv, str(tmp_path / "cache")]) == 0
    rows = {r["task_id"]: r for r in json.loads(out.read_text())["tasks"]}
    assert not rows["download-1"]["excluded"] and rows["chrome-1"]["excluded"]
    assert "| os | 2 | 2 | 0 | 0 | 0 | 0 | 0 |" in capsys.readouterr().out


def test_the_table_counts_what_ran() -> None:
    rows = [
        Coverage("a", "os", loads=True, ran=True, sets_up=True, evaluates=True, score=0.0),
        Coverage("b", "os", loads=True, ran=True, reasons=["set-up: TimeoutError: over 1s"]),
        Coverage("c", "os", True, False, True, True, True, 0.0, solved=True),
        Coverage("d", "os", True, False, True, True, True, 0.0, solved=False),
    ]
    assert "| os | 4 | 4 | 0 | 4 | 3 | 3 | 1 |" in table(rows)


def test_a_reset_home_gets_the_skeleton_of_the_vms_first_run(tmp_path: Path) -> None:
    """OSWorld's VLC getters read ~/.config/vlc/vlcrc, which the VM image has (VLC's first
    run writes it): without it every VLC task failed its evaluation instead of scoring 0."""
    skeleton = tmp_path / "skel"
    (skeleton / ".config" / "vlc").mkdir(parents=True)
    (skeleton / ".config" / "vlc" / "vlcrc").write_text("#qt-bgcone=1\n")
    home = tmp_path / "home"
    home.mkdir()
    _fill(home, skeleton)
    assert (home / ".config" / "vlc" / "vlcrc").read_text() == "#qt-bgcone=1\n"
    assert (home / "Desktop").is_dir() and (home / "Documents").is_dir()
    _fill(tmp_path / "other", tmp_path / "no-skeleton")  # none installed: only the folders
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == [
        ".config",
        "Desktop",
        "Documents",
    ]


def test_a_fixed_home_is_emptied_but_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "Desktop" / "deep").mkdir(parents=True)
    (home / ".bashrc").write_text("x")
    (home / "link").symlink_to(tmp_path)  # a link is removed, never followed
    _empty(home)
    assert home.is_dir() and list(home.iterdir()) == []
    assert tmp_path.is_dir()


def test_the_cache_list_names_what_the_coverage_looks_for(tmp_path: Path, capsys: Any) -> None:
    files = list(task_files(DOWNLOADS))
    assert files == [
        ("https://x/y.xlsx", f"download-1/{cache_name('https://x/y.xlsx', '/p')}"),
        ("https://x/gold.xlsx", "download-1/gold.xlsx"),
    ]
    examples = tmp_path / "evaluation_examples"
    (examples / "examples" / "os").mkdir(parents=True)
    (examples / "examples" / "os" / "download-1.json").write_text(json.dumps(DOWNLOADS))
    (examples / "test_all.json").write_text(json.dumps({"os": ["download-1"]}))
    cache = tmp_path / "cache"
    (cache / "download-1").mkdir(parents=True)
    (cache / files[1][1]).write_bytes(b"x")  # one of the two already fetched
    assert cache_main(["--osworld", str(tmp_path), "--missing-from", str(cache)]) == 0
    assert capsys.readouterr().out == f"{files[0][0]}\t{files[0][1]}\n"
    # once every listed file is there, the task counts as offline
    (cache / files[0][1]).write_bytes(b"x")
    assert exclusion_reasons(DOWNLOADS, "os", cache) == []
