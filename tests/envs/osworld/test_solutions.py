"""Our written solutions of OSWorld tasks (dart_ray/envs/osworld/solutions.py): what the script
engine plays. Whether each scores 1 on the desktop is measured by `dart-ray eval` and the
coverage (docs/ENVIRONMENTS.md, benchmarks/results/osworld-coverage.json), which need an
OSWorld checkout; here, the files they are played from."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dart_ray.engines.script import next_response, read_scripts
from dart_ray.envs.osworld.solutions import LEFT_OUT, SOLUTIONS, TRAIN, main
from dart_ray.records import ActionKind
from dart_ray.uitars.actions import parse_action
from dart_ray.uitars.prompts import Turn, build_messages

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_at_least_25_tasks_over_4_domains_each_as_uitars_would_write_it() -> None:
    assert len(SOLUTIONS) >= 25
    assert len({domain for domain, _ in SOLUTIONS.values()}) >= 4
    for task_id, (_, actions) in SOLUTIONS.items():
        assert UUID.fullmatch(task_id), task_id
        assert actions, task_id
        kinds = {a.kind for a in actions}
        assert kinds <= {ActionKind.HOTKEY, ActionKind.TYPE, ActionKind.WAIT, ActionKind.CALL_USER}
        # `<` typed through pyautogui comes out as `>` (solutions.AUTOSAVE_3_MINUTES says why)
        assert not any("<" in (a.text or "") for a in actions), task_id
    # every offline-runnable task is solved or said why not (docs/ENVIRONMENTS.md: 49 run)
    assert not set(LEFT_OUT) & set(SOLUTIONS)
    assert len(SOLUTIONS) + len(LEFT_OUT) == 49


def _checkout(tmp_path: Path) -> Path:
    """An OSWorld checkout's layout with a task file for each solved task."""
    for task_id, (domain, _) in SOLUTIONS.items():
        folder = tmp_path / "evaluation_examples" / "examples" / domain
        folder.mkdir(parents=True, exist_ok=True)
        task = {
            "id": task_id,
            "instruction": f"do {task_id}",
            "config": [],
            "evaluator": {"func": "infeasible"},
        }
        (folder / f"{task_id}.json").write_text(json.dumps(task))
    return tmp_path


def test_the_files_written_are_what_the_script_engine_and_eval_read(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["--osworld", str(_checkout(tmp_path / "osworld")), "--out", str(out)]) == 0
    tasks = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert {t["task_id"] for t in tasks} == set(SOLUTIONS)
    assert all(t["config"]["family"] == SOLUTIONS[t["task_id"]][0] for t in tasks)
    # what configs/osworld-local.toml trains on and holds out: disjoint, together all
    train, heldout = (
        [json.loads(line) for line in (out / f"{n}.jsonl").read_text().splitlines()]
        for n in ("train", "heldout")
    )
    assert [t["task_id"] for t in train] == [t for t in SOLUTIONS if t in TRAIN] and len(
        train
    ) >= 10
    assert {t["split"] for t in train} == {"train"} and {t["split"] for t in heldout} == {"heldout"}
    assert {t["task_id"] for t in heldout} == set(SOLUTIONS) - set(TRAIN)
    assert len({SOLUTIONS[t][0] for t in TRAIN}) >= 4
    scripts = read_scripts(out / "scripts.jsonl")
    empty = read_scripts(out / "empty.jsonl")
    for task_id, (_, actions) in SOLUTIONS.items():
        instruction = f"do {task_id}"
        assert empty[instruction] == []
        played, turns = [], [Turn(b"png")]
        for _ in range(len(actions) + 1):  # each action, then `finished`
            answer = next_response(scripts, build_messages(instruction, turns, 1, 1))
            played.append(parse_action(answer.split("Action: ")[1]))
            turns = [*turns[:-1], Turn(b"png", answer), Turn(b"png")]
        assert [(a.kind, a.text or None) for a in played[:-1]] == [
            (a.kind, a.text or None) for a in actions
        ]
        assert played[-1].kind is ActionKind.FINISHED


def test_a_checkout_without_a_solved_task_is_named(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    checkout = _checkout(tmp_path / "osworld")
    gone = next(iter(SOLUTIONS))
    next(checkout.rglob(f"{gone}.json")).unlink()
    assert main(["--osworld", str(checkout), "--out", str(tmp_path / "out")]) == 2
    assert gone in capsys.readouterr().err
