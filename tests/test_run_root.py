"""Where a run's outputs go, and that the operator is told where in full (issue 31).

Seen: a job submitted with `ray job submit --working-dir .` wrote its run under Ray's
temporary copy of the working directory (`.../runtime_resources/working_dir_files/
_ray_pkg_*/runs/`), where `dart-ray status` never looked, and the report printed that path
cut to the console's width."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from dart_ray.config import load_config
from dart_ray.reporting.report import render
from dart_ray.reporting.summary import RunReport
from dart_ray.run.runtime import run_root

JOB_SPEC = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""What Ray's job supervisor gives the driver it starts: the job's runtime_env and metadata."""


def test_a_relative_root_of_a_job_with_a_working_dir_goes_to_the_job_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, copy = tmp_path / "home", tmp_path / "_ray_pkg_0123"
    copy.mkdir()
    monkeypatch.chdir(copy)  # Ray runs the job in its copy of the working directory
    monkeypatch.setenv("HOME", str(home))
    cfg = load_config(None, ["run.root_dir=runs"])
    # a local run (no job): from the working directory, as always
    monkeypatch.delenv(JOB_SPEC, raising=False)
    assert run_root(cfg) == copy / "runs"
    # a job without an uploaded working directory runs where it was started: the same
    monkeypatch.setenv(JOB_SPEC, json.dumps({"runtime_env": {}, "metadata": {}}))
    assert run_root(cfg) == copy / "runs"
    # `ray job submit --working-dir .`: under run.job_root_dir (default ~/dart-ray)
    spec = {"runtime_env": {"working_dir": "gcs://_ray_pkg_0123.zip"}, "metadata": {}}
    monkeypatch.setenv(JOB_SPEC, json.dumps(spec))
    assert run_root(cfg) == home / "dart-ray" / "runs"
    assert run_root(load_config(None, [f"run.job_root_dir={tmp_path / 'shared'}"])) == (
        tmp_path / "shared" / "runs"
    )
    # an absolute root is used as it is, job or not
    assert run_root(load_config(None, [f"run.root_dir={tmp_path / 'out'}"])) == tmp_path / "out"


def test_the_report_prints_the_run_folder_whole_on_a_narrow_console(tmp_path: Path) -> None:
    report = RunReport.empty("a-run")
    report.run_dir = str(tmp_path / ("deep-" * 12) / "runs" / "a-run")  # > 80 characters
    console = Console(width=80, record=True, force_terminal=False)
    render(report, console)
    lines = console.export_text().splitlines()
    assert f"outputs in {report.run_dir}: report.json, curve.png, system.png, tb/" in lines
