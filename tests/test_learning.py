"""The learning claim (issue 9, docs/LEARNING.md), markers `slow` and `learning`.

From the warm start in `fixtures/tiny-ground` (SFT on oracle demonstrations, stopped early),
the decoupled RL run of `configs/learning.toml` (`dart-ray train`, the same code path as the
7B recipe) must raise success on 300 held-out screens by at least 15 points within 20
minutes on 2 CPU cores (DART-GUI: +14.6 on OSWorld). Each held-out screen shows four
buttons and names one; no held-out seed is in the training file. Both checkpoints are
measured greedily by `dart-ray eval`, one episode per task.

The default run's claim (`make run`, +10 points), the ladder of issue 17 (rung 1: one
button, +30; rung 2: this claim; rung 3: two or three actions, +10) and rung 4 (MiniWoB++ in
Chromium, +10 in 30 minutes; also marker `browser`) are tests here too. All of them take about
two hours, so CI's `make test` leaves them out (`make test-learning` runs them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = REPO / "configs" / "learning.toml"
WARM_START = REPO / "fixtures" / "tiny-ground"
LIFT = 0.15
"""Required gain in held-out success rate (never loosen it: docs/LEARNING.md)."""

pytestmark = [pytest.mark.slow, pytest.mark.learning]


def _success(checkpoint: Path, out: Path, config: Path = CONFIG) -> float:
    subprocess.run(
        [BIN / "dart-ray", "eval", "-c", config, "--checkpoint", checkpoint, "--json", out],
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


def _train_newest_checkpoint(config: Path, root: Path, run_id: str, timeout_s: float) -> Path:
    """`dart-ray train -c CONFIG` into `root`; the newest checkpoint it wrote."""
    subprocess.run(
        [BIN / "dart-ray", "train", "-c", config, f"run.root_dir={root}", f"run.run_id={run_id}"],
        cwd=REPO,
        check=True,
        timeout=timeout_s,
    )
    return _newest_checkpoint(root / run_id)


@pytest.mark.timeout(40 * 60)
@pytest.mark.xfail(
    reason="measured 2026-12-03: 35.3% -> 37.3% held out (+2.0 points) after 20 minutes, 201 "
    "versions; the warm start clicks a button but binds the named one barely above chance, and "
    "RL does not form the binding in this budget (docs/LEARNING.md has the curves)",
    strict=False,
)
def test_rl_lifts_heldout_success_by_15_points(tmp_path: Path) -> None:
    before = _success(WARM_START, tmp_path / "before.json")
    last = _train_newest_checkpoint(CONFIG, tmp_path / "runs", "learning", 30 * 60)
    after = _success(last, tmp_path / "after.json")
    print(f"held-out success: warm start {before:.1%}, after RL {after:.1%}")
    assert after - before >= LIFT, f"{before:.1%} -> {after:.1%}: +{after - before:.1%}"


RUNG1 = REPO / "configs" / "click-target.toml"
RUNG1_LIFT = 0.30
"""Rung 1's required gain (issue 17; never loosen it)."""


@pytest.mark.timeout(30 * 60)
def test_rung1_single_target_lifts_heldout_success_by_30_points(tmp_path: Path) -> None:
    """Rung 1: one button per screen, from `fixtures/tiny-target` (under 40% held out), +30
    points on the 300 held-out screens within the 10 minutes of `configs/click-target.toml`.
    Measured 2026-12-04 (1D image positions, the old warm start): 22.7% -> 73.3% (+50.6
    points), 11.6 minutes for the whole test; the rebuilt warm start scores 14.3%."""
    before = _success(REPO / "fixtures" / "tiny-target", tmp_path / "before.json", RUNG1)
    assert before < 0.40, f"the warm start must start under 40%, it scores {before:.1%}"
    last = _train_newest_checkpoint(RUNG1, tmp_path / "runs", "rung1", 20 * 60)
    after = _success(last, tmp_path / "after.json", RUNG1)
    print(f"rung 1 held-out success: warm start {before:.1%}, after RL {after:.1%}")
    assert after - before >= RUNG1_LIFT, f"{before:.1%} -> {after:.1%}: +{after - before:.1%}"


DEFAULT_LIFT = 0.10
"""The default run's required gain (issue 17; never loosen it)."""


@pytest.mark.timeout(20 * 60)
def test_default_run_lifts_heldout_success_by_10_points(tmp_path: Path) -> None:
    """`make run`'s job as a new user runs it (`dart-ray train`, no options): held-out
    success, greedy, on 200 unseen screens (at least 100) measured in the run before and after its 8 minutes
    of RL, rises by at least 10 points, and the report prints the change with its interval."""
    t0 = time.monotonic()
    p = subprocess.run(
        [BIN / "dart-ray", "train", f"run.root_dir={tmp_path}", "run.run_id=default"],
        cwd=REPO,
        check=True,
        timeout=15 * 60,
        capture_output=True,
        text=True,
    )
    minutes = (time.monotonic() - t0) / 60
    report = json.loads((tmp_path / "default" / "report.json").read_text())
    before, after = report["heldout_before"], report["heldout_after"]
    print(f"default run: {before:.1%} -> {after:.1%} held out in {minutes:.1f} minutes")
    assert report["heldout_tasks"] >= 100 and minutes <= 10.5
    assert "held-out success before -> after" in p.stdout and "95%" in p.stdout
    assert after - before >= DEFAULT_LIFT, f"{before:.1%} -> {after:.1%}"


RUNG3 = REPO / "configs" / "multi-step.toml"
RUNG3_LIFT = 0.10
"""Rung 3's required gain (issue 17; never loosen it)."""


@pytest.mark.timeout(40 * 60)
@pytest.mark.xfail(
    reason="measured 2026-12-06 under Qwen2.5-VL's 3D image positions from the rebuilt "
    "fixtures/tiny-multi-copy (31.0%), 20 minutes, 93-108 versions a run: trajectory credit "
    "(this config) +9.0, +12.7 and -0.4 (this test's own run) in three runs, step credit "
    "-0.3 and +8.0 in two, back-off by family +3.7 (step) and -3.0 (trajectory): the bar "
    "is within reach of one run in three and the spread between runs (10 points at one seed) "
    "is as large as any effect (docs/LEARNING.md, rung 3)",
    strict=False,
)
def test_rung3_multi_step_lifts_heldout_success_by_10_points(tmp_path: Path) -> None:
    """Rung 3: tasks of two or three actions (`fixtures/multi-step`: open a menu then pick its
    item; open a drop-down, pick the option, click OK; click a field, type the word, click OK),
    from `fixtures/tiny-multi-copy`, +10 points on the 300 held-out tasks within the 20 minutes of
    `configs/multi-step.toml`."""
    before = _success(REPO / "fixtures" / "tiny-multi-copy", tmp_path / "before.json", RUNG3)
    last = _train_newest_checkpoint(RUNG3, tmp_path / "runs", "rung3", 30 * 60)
    after = _success(last, tmp_path / "after.json", RUNG3)
    print(f"rung 3 held-out success: warm start {before:.1%}, after RL {after:.1%}")
    assert after - before >= RUNG3_LIFT, f"{before:.1%} -> {after:.1%}: +{after - before:.1%}"


MINIWOB = REPO / "configs" / "miniwob.toml"
MINIWOB_LIFT = 0.10
"""The MiniWoB++ rung's required gain (issue 29; never loosen it)."""


@pytest.mark.browser
@pytest.mark.timeout(50 * 60)
@pytest.mark.xfail(
    reason="measured 2026-12-06 under 3D image positions from the rebuilt "
    "fixtures/tiny-miniwob (19.7%), with back-off by family, step credit and rollouts at "
    "temperature 0.7 (run mw3): 100 versions in 30 minutes, 19.7% -> 17.7% greedy "
    "(-2.0, -8.2..+4.2), sampled at 0.7 20.3% -> 20.0%; click-test rises (3 -> 14 of 30), "
    "pages whose label must be read fall. Before the fix (1D positions, old warm start "
    "27.3%): -6.6 and +0.7 (docs/LEARNING.md, rung 4)",
    strict=False,
)
def test_miniwob_rung_lifts_heldout_success_by_10_points(tmp_path: Path) -> None:
    """Rung 4: ten MiniWoB++ pages of one to three actions in headless Chromium, scored by
    each page's own JavaScript, from `fixtures/tiny-miniwob` (SFT on the DOM oracle's
    demonstrations, stopped early), +10 points on the 300 held-out seeds within the 30
    minutes of `configs/miniwob.toml`."""
    before = _success(REPO / "fixtures" / "tiny-miniwob", tmp_path / "before.json", MINIWOB)
    last = _train_newest_checkpoint(MINIWOB, tmp_path / "runs", "miniwob", 40 * 60)
    after = _success(last, tmp_path / "after.json", MINIWOB)
    print(f"MiniWoB++ held-out success: warm start {before:.1%}, after RL {after:.1%}")
    assert after - before >= MINIWOB_LIFT, f"{before:.1%} -> {after:.1%}: +{after - before:.1%}"
