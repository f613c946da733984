"""The run report's per-version off-policy summary, on numbers worked by hand."""

from __future__ import annotations

import pytest

from dart_ray.report import off_policy_by_version


def test_off_policy_metrics_are_averaged_per_version() -> None:
    # version 1 had two steps (clip 0.1 and 0.3 -> 0.2); version 2 one step, and only it
    # measured the on-policy gap; keys a step did not report are left out, not zero
    history = [
        {"version": 1, "clip_frac": 0.1, "is_capped_frac": 0.0, "loss": 5.0},
        {"version": 1, "clip_frac": 0.3, "is_capped_frac": 0.5},
        {"version": 2, "clip_frac": 0.0, "onpolicy_logp_diff_abs": 2e-6},
    ]
    rows = off_policy_by_version(history)
    assert rows == [
        {"version": 1.0, "clip_frac": pytest.approx(0.2), "is_capped_frac": 0.25},
        {"version": 2.0, "clip_frac": 0.0, "onpolicy_logp_diff_abs": 2e-6},
    ]
