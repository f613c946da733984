"""The learning claim (issue 9, docs/LEARNING.md), markers `slow` and `learning`.

From the warm start in `fixtures/tiny-ground` (SFT on oracle demonstrations, stopped early),
the decoupled RL run of `configs/learning.toml` (`dart-ray train`, the same code path as the
7B recipe) must raise success on 300 held-out screens by at least 15 points within 20
minutes on 2 CPU cores (DART-GUI: +14.6 on OSWorld). Each held-out screen shows four
buttons and names one; no held-out seed is in the training file. Both checkpoints are
measured greedily by `dart-ray eval`, one episode per task.

It takes about 25 minutes, so CI's `make test` leaves it out (`make test-learning` runs it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = REPO / "configs" / "learning.toml"
WARM_START = REPO / "fixtures" / "tiny-ground"
LIFT = 0.15
"""Required gain in held-out success rate (never loosen it: docs/LEARNING.md)."""

pytestmark = [pytest.mark.slow, pytest.mark.learning]


def _success(checkpoint: Path, out: Path) -> float:
    subprocess.run(
        [BIN / "dart-ray", "eval", "-c", CONFIG, "--checkpoint", checkpoint, "--json", out],
        cwd=REPO,
        check=True,
        timeout=600,
        stdout=subprocess.DEVNULL,
    )
    summary = json.loads(out.read_text())
    assert summary["tasks"] == 300 and summary["aborted"] == 0
    return float(summary["success"])


def _newest_checkpoint(run_dir: Path) -> Path:
    versions = sorted(run_dir.glob("checkpoints/v*"), key=lambda p: int(p.name[1:]))
    assert versions, f"the run wrote no checkpoint under {run_dir}"
    return versions[-1]


@pytest.mark.timeout(40 * 60)
@pytest.mark.xfail(
    reason="measured 2026-12-03: 35.3% -> 37.3% held out (+2.0 points) after 20 minutes, 201 "
    "versions; the warm start clicks a button but binds the named one barely above chance, and "
    "RL does not form the binding in this budget (docs/LEARNING.md has the curves)",
    strict=False,
)
def test_rl_lifts_heldout_success_by_15_points(tmp_path: Path) -> None:
    before = _success(WARM_START, tmp_path / "before.json")
    subprocess.run(
        [
            BIN / "dart-ray",
            "train",
            "-c",
            CONFIG,
            f"run.root_dir={tmp_path / 'runs'}",
            "run.run_id=learning",
        ],
        cwd=REPO,
        check=True,
        timeout=30 * 60,
    )
    after = _success(_newest_checkpoint(tmp_path / "runs" / "learning"), tmp_path / "after.json")
    print(f"held-out success: warm start {before:.1%}, after RL {after:.1%}")
    assert after - before >= LIFT, f"{before:.1%} -> {after:.1%}: +{after - before:.1%}"
