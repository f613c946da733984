"""scripts/gpu-check.sh's dry run on CPU: every step is wired, the results folder has what a
GPU run would bring back, and on a machine without the project's dependencies (a bare GPU
machine has torch only) the steps that need them are recorded as not run, with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def dry_run(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/gpu-check.sh", "--dry-run", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def summary(out: Path) -> dict[str, str]:
    rows = [ln.split("|")[1:3] for ln in (out / "SUMMARY.md").read_text().splitlines()]
    return {
        r[0].strip(): r[1].strip()
        for r in rows
        if len(r) == 2 and r[0].strip() not in ("step", "---")
    }


def test_the_dry_run_passes_every_step(tmp_path: Path) -> None:
    p = dry_run(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    s = summary(tmp_path)
    assert s.pop("vllm-lora") == "not run: vllm is not installed for " + sys.executable
    assert s == {"env": "passed", "weight-load": "passed", "staged-exact": "passed", "gpu-tier": "passed"}  # fmt: skip
    results = json.loads((tmp_path / "weight_load.json").read_text())["results"]
    assert [r["size"] for r in results] == ["10M", "100M"] and all(r["exact"] for r in results)
    assert len(list(tmp_path.iterdir())) <= 8  # what a device call brings back: 8 files


@pytest.mark.parametrize("missing", ["ray"])
def test_without_the_project_dependencies_those_steps_say_why(tmp_path: Path, missing: str) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / f"{missing}.py").write_text(f"raise ImportError('no {missing} here')\n")
    out = tmp_path / "out"
    p = dry_run(out, PYTHONPATH=str(shadow))
    assert p.returncode == 0, p.stdout[-3000:]
    s = summary(out)
    assert s["weight-load"] == "passed"  # torch alone is enough for the benchmark
    assert s["staged-exact"].startswith("not run: the project's dependencies")
    assert s["gpu-tier"].startswith("not run: Ray and vLLM")
    assert s["vllm-lora"].startswith("not run: Ray and vLLM")
