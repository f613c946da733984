"""The policy deployment `build_app` makes from the config, inspected without starting
Serve: replicas or Serve autoscaling, and the resources each replica asks Ray for."""

from __future__ import annotations

from pathlib import Path

import pytest

from dart_ray.config import ConfigError, load_config
from serve_apps.policy import build_app

MODEL = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-sft"


def _deployment(*overrides: str):  # type: ignore[no-untyped-def]
    cfg = load_config(None, list(overrides)).policy
    return build_app(cfg, MODEL)._bound_deployment


def test_autoscaling_from_config() -> None:
    d = _deployment(
        "policy.autoscaling=true",
        "policy.min_replicas=2",
        "policy.max_replicas=6",
        "policy.target_ongoing_requests=12",
        "policy.num_gpus=1",
        "policy.num_cpus=4",
    )
    auto = d._deployment_config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (2, 6, 12.0)
    assert d.ray_actor_options == {"num_cpus": 4.0, "num_gpus": 1.0}


def test_fixed_replicas_without_autoscaling() -> None:
    d = _deployment("policy.replicas=3", "policy.max_batch_size=96")
    assert d._deployment_config.autoscaling_config is None
    assert d.num_replicas == 3
    # a replica accepts at least a full batch, or batching could never fill
    assert d.max_ongoing_requests == 96


def test_torch_threads_reach_the_replica_environment() -> None:
    assert "runtime_env" not in _deployment().ray_actor_options  # Ray's choice by default
    d = _deployment("policy.num_cpus=0.5", "policy.torch_threads=2")
    assert d.ray_actor_options["runtime_env"] == {"env_vars": {"OMP_NUM_THREADS": "2"}}


def test_autoscaling_delays_and_window_reach_serve() -> None:
    """Serve's defaults (30 s up, 600 s down, a 30 s window) unless configured: a run on
    replicas that start in seconds may scale faster."""
    auto = _deployment("policy.autoscaling=true")._deployment_config.autoscaling_config
    assert (auto.upscale_delay_s, auto.downscale_delay_s, auto.look_back_period_s) == (
        30.0,
        600.0,
        30.0,
    )
    auto = _deployment(
        "policy.autoscaling=true",
        "policy.upscale_delay_s=1",
        "policy.downscale_delay_s=5",
        "policy.look_back_period_s=12",
    )._deployment_config.autoscaling_config
    assert (auto.upscale_delay_s, auto.downscale_delay_s, auto.look_back_period_s) == (
        1.0,
        5.0,
        12.0,
    )


def test_replica_bounds_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"min_replicas = 3 is above policy\.max_replicas = 2"):
        load_config(
            None, ["policy.autoscaling=true", "policy.min_replicas=3", "policy.max_replicas=2"]
        )
    with pytest.raises(ConfigError, match="downscale_delay_s"):
        load_config(None, ["policy.downscale_delay_s=-1"])
