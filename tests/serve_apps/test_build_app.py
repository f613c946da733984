"""The policy deployment `build_app` makes from the config, inspected without starting
Serve: replicas or Serve autoscaling, and the resources each replica asks Ray for."""

from __future__ import annotations

from pathlib import Path

from dart_ray.config import load_config
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
