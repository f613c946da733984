"""OSWorld's task files become the JSONL `env.tasks` reads, one domain per family."""

from __future__ import annotations

import json
from pathlib import Path

from dart_ray.envs.minidesk.generate import load_tasks
from dart_ray.envs.osworld.tasks import main


def _osworld_tree(root: Path) -> Path:
    """A two-domain copy of OSWorld's `evaluation_examples` layout."""
    tasks = {
        "os": {
            "id": "a1",
            "instruction": "Make a folder named x",
            "config": [{"type": "execute", "parameters": {"command": ["mkdir", "-p", "/tmp/q"]}}],
            "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line"}},
        },
        "chrome": {
            "id": "b2",
            "instruction": "Open a new tab",
            "config": [],
            "evaluator": {"func": "infeasible"},
            "snapshot": "chrome",  # OSWorld fields we do not use are left out
        },
    }
    for domain, t in tasks.items():
        d = root / "examples" / domain
        d.mkdir(parents=True)
        (d / f"{t['id']}.json").write_text(json.dumps(t))
    (root / "test_all.json").write_text(json.dumps({"os": ["a1"], "chrome": ["b2"]}))
    return root


def test_an_index_becomes_loadable_tasks(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    ex = _osworld_tree(tmp_path / "evaluation_examples")
    out = tmp_path / "out" / "test_all.jsonl"
    argv = ["--examples", str(ex), "--index", str(ex / "test_all.json"), "--out", str(out)]
    assert main([*argv, "--split", "heldout"]) == 0
    assert "2 tasks written" in capsys.readouterr().out
    tasks = load_tasks(out, "heldout")
    assert [(t.task_id, t.env, t.split, t.config["family"]) for t in tasks] == [
        ("a1", "osworld", "heldout", "os"),
        ("b2", "osworld", "heldout", "chrome"),
    ]
    assert tasks[0].config["config"][0]["parameters"]["command"] == ["mkdir", "-p", "/tmp/q"]
    assert tasks[1].config["evaluator"] == {"func": "infeasible"}
    assert "snapshot" not in tasks[1].config


def test_a_missing_task_file_is_named(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    ex = _osworld_tree(tmp_path / "evaluation_examples")
    (ex / "bad.json").write_text(json.dumps({"os": ["nope"]}))
    argv = ["--examples", str(ex), "--index", str(ex / "bad.json"), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "examples/os/nope.json: not a readable OSWorld task" in capsys.readouterr().err
