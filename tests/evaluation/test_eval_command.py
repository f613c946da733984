"""`dart-ray eval` through its real command: how it says what it measured, and what it leaves
out of a success rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from dart_ray.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_eval_says_greedy_or_sampled_and_pass_at_k(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dart-ray eval --samples 2` printed `success 35.0%` for a sampled rate without saying
    so (greedy on the same tasks: 60%). Now the line and the JSON say how it was decoded."""
    import json

    args = ["eval", "--checkpoint", str(tiny_model_dir), "--tasks", "3"]
    cfg = ["rollout.max_steps=1", "policy.max_new_tokens=8", f"run.root_dir={tmp_path}"]
    greedy, sampled = tmp_path / "greedy.json", tmp_path / "sampled.json"
    assert main([*args, "--json", str(greedy), *cfg]) == 0
    out = capsys.readouterr().out
    assert "greedy success " in out and "over 3 tasks" in out and "pass@" not in out
    assert json.loads(greedy.read_text())["sampling"] == "greedy"
    assert main([*args, "--samples", "2", "--json", str(sampled), *cfg]) == 0
    out = capsys.readouterr().out
    assert "sampled (temperature 1, top-p 0.8), 2 episodes per task: success per episode" in out
    assert "pass@2" in out
    summary = json.loads(sampled.read_text())
    assert summary["sampling"] == "sampled (temperature 1, top-p 0.8)" and summary["episodes"] == 6


def test_eval_lists_a_task_its_env_refused_apart_from_the_rate(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task whose set-up the env refused (ENV_ERROR) counted as a failure: 0 in the rate."""
    import json

    lines = (REPO / "fixtures" / "click-target" / "heldout.jsonl").read_text().splitlines()[:3]
    bad = json.loads(lines[1])
    bad["config"]["widgets"][0]["kind"] = "slider"
    suite = tmp_path / "suite.jsonl"
    suite.write_text("\n".join([lines[0], json.dumps(bad), lines[2]]) + "\n")
    out_json = tmp_path / "eval.json"
    args = ["eval", "--checkpoint", str(tiny_model_dir), "--suite", str(suite)]
    cfg = ["rollout.max_steps=1", "policy.max_new_tokens=8", f"run.root_dir={tmp_path}"]
    assert main([*args, "--json", str(out_json), *cfg]) == 0
    out = capsys.readouterr().out
    assert "over 2 tasks; not scored, left out of the rate: 1 ENV_ERROR" in out
    assert f"not scored: {bad['task_id']}: ENV_ERROR:" in out and "'slider'" in out
    summary = json.loads(out_json.read_text())
    assert summary["tasks"] == 2 and summary["not_scored"] == {"ENV_ERROR": 1}
    assert summary["excluded"][0]["task"] == bad["task_id"]
    assert summary["by_family"]["click-target"]["tasks"] == 2
