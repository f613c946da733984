"""The learning claims (docs/LEARNING.md, "The protocol"), markers `slow` and `learning`.

Each test runs `dart-ray experiment` for one seed of the `rl` arm of a shipped config: the
run's warm start and its newest checkpoint are scored greedily on every held-out task (unseen
by content: `tests/envs/test_suites.py`), and the test asserts the lower end of the run's
paired 95% interval (a bootstrap over the same tasks before and after), never a point
estimate. One run is what a test can afford; the claims themselves are over three seeds
against the controls (lr0, rft, sft) and live in the committed JSON the docs quote:
`benchmarks/results/learning/default.json` for the default run.

All of them take about two hours, so CI's `make test` leaves them out (`make test-learning`
runs them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.slow, pytest.mark.learning]


def _one_run(tmp_path: Path, name: str, config: str, timeout_s: float) -> dict[str, Any]:
    """`dart-ray experiment` of one `rl` run (seed 0) of `config`, scored on held-out; the
    `rl` arm of the JSON it writes (`lift_ci95`: the paired interval, rates in 0..1)."""
    spec = tmp_path / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\nconfig = "{config}"\nseeds = [0]\nsplits = ["heldout"]\n'
        f'overrides = ["run.eval_tasks=0", "run.root_dir={tmp_path / "runs"}"]\n[arms.rl]\n'
    )
    out = tmp_path / f"{name}.json"
    subprocess.run(
        [BIN / "dart-ray", "experiment", spec, "--out", out],
        cwd=REPO,
        check=True,
        timeout=timeout_s,
    )
    result = json.loads(out.read_text())
    rl = result["arms"]["rl"]
    lo, hi = rl["lift_ci95"]
    print(f"{name}: held-out lift {rl['mean_lift']:+.1%} ({lo:+.1%}..{hi:+.1%}), one run")
    assert result["heldout_tasks"] >= 100 and rl["n_seeds"] == 1
    return dict(rl)


@pytest.mark.timeout(30 * 60)
def test_the_default_run_lifts_held_out_success(tmp_path: Path) -> None:
    """`make run`'s config (`configs/default.toml`: 8 minutes of decoupled RL from
    `fixtures/tiny-target`) on its 300 held-out screens: one run's paired lower bound is above
    0. Over three seeds against its controls: default.json (docs/LEARNING.md)."""
    rl = _one_run(tmp_path, "default-test", "configs/default.toml", 25 * 60)
    assert rl["lift_ci95"][0] > 0, rl


RUNGS = [
    pytest.param(
        "configs/learning.toml",
        35 * 60,
        marks=pytest.mark.xfail(
            reason="rung 2 (click-grounding, four buttons, one named) measured 2026-12-03 "
            "before the protocol: +2.0 points after 20 minutes (one run, no interval); the "
            "binding does not form in this budget (docs/LEARNING.md, history)",
            strict=False,
        ),
        id="rung2-grounding",
    ),
    pytest.param(
        "configs/multi-step.toml",
        35 * 60,
        marks=pytest.mark.xfail(
            reason="rung 3 (two or three actions) under the protocol, 2026-12-07, from "
            "fixtures/tiny-multi-step (chosen on validation): three rl runs -2.0, +4.0, -12.3 "
            "held out, mean -3.4 (-12.4..+4.9); rft +0.3, sft +23.7 (one run each; "
            "benchmarks/results/learning/multi-step.json, docs/LEARNING.md)",
            strict=False,
        ),
        id="rung3-multi-step",
    ),
    pytest.param(
        "configs/miniwob.toml",
        45 * 60,
        marks=[
            pytest.mark.browser,
            pytest.mark.xfail(
                reason="rung 4 (MiniWoB++ in Chromium) not yet measured under the protocol "
                "(configs/experiments/miniwob.toml); measured 2026-12-06 from "
                "fixtures/tiny-miniwob on the seeds that are its validation split since "
                "2026-12-07: 19.7% -> 17.7% greedy (-2.0, -8.2..+4.2), one run "
                "(docs/LEARNING.md, rung 4)",
                strict=False,
            ),
        ],
        id="rung4-miniwob",
    ),
]


@pytest.mark.timeout(50 * 60)
@pytest.mark.parametrize(("config", "timeout_s"), RUNGS)
def test_a_rung_lifts_held_out_success(tmp_path: Path, config: str, timeout_s: int) -> None:
    """Rungs 2-4 of the ladder (docs/LEARNING.md): one run's paired lower bound above 0."""
    rl = _one_run(tmp_path, Path(config).stem + "-test", config, timeout_s)
    assert rl["lift_ci95"][0] > 0, rl
