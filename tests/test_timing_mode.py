"""The decoupling benchmark at its test size, in the timing mode (marker `slow`, on the
session's Ray): both modes run every real part with compute replaced by latencies, and the
run's behaviour is checked, never its speed: each mode trains and publishes, says SIMULATED,
loses and replays nothing (the audit), trains no sample staler than the bound, and the
decoupled mode keeps its environments busier than the synchronous ones (the design's point:
the synchronous modes' sessions wait for every train step); both synchronous baselines (a full
batch per round, and dynamic sampling) train only what their round rolled out, and the
ratios name the faster one as their baseline. A third mode runs the decoupled
one with partial rollouts (`policy.interrupt_on_update`): per-token versions reach the trainer
and every mode reports what its weight updates cost rollout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.bench,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("ray_local"),
]


def test_the_timing_mode_benchmark_runs_every_mode_correctly(tmp_path: Path) -> None:
    out = tmp_path / "decoupling.json"
    rc = load_script("benchmarks/decoupling.py").main(
        [
            "--minutes", "0.6",
            "--scale", "0.02",
            "--sessions", "8",
            "--modes", "decoupled,sync,sync-dynamic,partial",
            "--same-ray",
            "--port", "8170",
            "--root", str(tmp_path / "runs"),
            "--out", str(out),
            "--set", "env.sessions_per_actor=4",
            "--set", "rollout.n_rollouts=4",
            "--set", "rollout.max_steps=5",
            "--set", "curation.group_size=4",
            "--set", "curation.groups_per_step=2",
            "--set", "curation.group_timeout_s=10",
        ]
    )  # fmt: skip
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["simulated"] is True
    runs = {m["mode"]: m for m in r["modes"]}
    for mode, m in runs.items():
        assert m["report"]["simulated"] is True, mode
        assert m["train_steps"] >= 1 and m["versions"] >= 1, (mode, m["report"])
        assert m["audit_ok"], (mode, m["audit_breaches"])
        assert m["staleness_max"] <= m["max_staleness"], mode
        assert 0 < m["rollout_utilisation"] <= 1, mode
        assert m["watchdog_fired_at_s"] is None, mode
        assert sum(m["token_staleness"].values()) > 0, mode  # the trainer counted its tokens
        assert max(map(int, m["token_staleness"])) <= m["max_staleness"], mode
        assert m["update_wait_s"] is not None and m["update_wait_s"] >= 0, mode
    for key in (
        "env_utilisation_ratio",
        "rollout_utilisation_ratio",
        "samples_per_hour_ratio",
        "stale_dropped_frac",  # the decoupled run's, with admission (issue 32's keys)
    ):
        assert isinstance(r[key], float), key
    d = runs["decoupled"]
    assert d["rollouts_started"] >= d["trajectories"] - d["report"]["trajectories"].get(
        "ENV_ERROR", 0
    )
    assert runs["decoupled"]["env_utilisation"] > runs["sync"]["env_utilisation"]
    # the ratios are against the faster synchronous baseline, named in the file
    assert r["baseline"] in ("sync", "sync-dynamic")
    faster = max(("sync", "sync-dynamic"), key=lambda m: runs[m]["samples_per_hour"])
    assert r["baseline"] == faster and r["baseline_definition"]
    for mode in ("sync", "sync-dynamic"):  # a synchronous step trains its own round only
        assert max(map(int, runs[mode]["token_staleness"])) == 0, mode
    assert runs["partial"]["report"]["mode"] == "decoupled"
    assert set(r["partial_vs_decoupled"]) >= {"update_wait_s", "token_lag_mean"}
