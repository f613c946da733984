"""A run whose parts cannot all be placed on a local Ray fails at once, naming the parts."""

from __future__ import annotations

import logging

import pytest

from dart_ray.config import ConfigError, load_config
from dart_ray.run import runtime


def _config(*overrides: str):  # type: ignore[no-untyped-def]
    return load_config(
        None,
        [
            "env.num_sessions=32",
            "env.num_cpus=0.1",
            "policy.num_cpus=0.5",
            "train.num_workers=1",
            "train.cpus_per_worker=0.5",
            *overrides,
        ],
    )


def test_cpu_demand_adds_every_part() -> None:
    demand = runtime.cpu_demand(_config())
    assert sum(demand.values()) == pytest.approx(32 * 0.1 + 0.5 + 0.5 + 0.1 + 0.25)
    assert "32 env actors x env.num_cpus 0.1" in demand
    # sessions hosted 16 to an actor reserve CPUs per actor
    hosted = runtime.cpu_demand(_config("env.sessions_per_actor=16"))
    assert hosted["2 env actors (16 sessions each) x env.num_cpus 0.1"] == pytest.approx(0.2)


def test_too_many_sessions_for_a_local_ray_is_a_config_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(runtime.ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ConfigError, match=r"reserves 4.55 CPUs .* has 2: lower env.num_cpus"):
        runtime.check_fits(_config())
    runtime.check_fits(_config("env.num_cpus=0.01"))  # 1.67 CPUs: fits


def test_on_a_cluster_it_waits_for_the_autoscaler(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(runtime.ray, "cluster_resources", lambda: {"CPU": 2.0})
    with caplog.at_level(logging.WARNING, logger="dart_ray.run.runtime"):
        runtime.check_fits(_config("cluster.address=auto"))
    assert "waiting for the autoscaler" in caplog.text


def test_a_cluster_without_the_env_resource_is_named_at_once_and_fails_after_the_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen: `ray start --head` then `ray job submit ... cluster.address=auto` on nodes with no
    `env` resource waited forever while the autoscaler repeated that nothing fits."""
    cfg = _config("cluster.address=auto", "cluster.resource_wait_s=6")
    slept: list[float] = []
    with (
        caplog.at_level(logging.WARNING, logger="dart_ray.run.runtime"),
        pytest.raises(ConfigError, match=r"resource 'env'.*--resources=.*env.resource=\"\"") as e,
    ):
        runtime.wait_for_env_resource(cfg, lambda: {"CPU": 8.0}, slept.append)
    assert "waited 6 s" in str(e.value) and sum(slept) == 6.0
    assert "resource 'env'" in caplog.text  # said before the wait, not after it
    # the autoscaler adds a node offering it during the wait: the run goes on
    offers = iter([{"CPU": 8.0}, {"CPU": 8.0}, {"CPU": 40.0, "env": 16.0}])
    runtime.wait_for_env_resource(cfg, lambda: next(offers), lambda _: None)
    # sessions that ask for no resource, or a cluster that has it: nothing to wait for
    assert runtime.missing_env_resource(_config('env.resource=""'), {}) is None
    assert runtime.missing_env_resource(cfg, {"env": 1.0}) is None
    # a local Ray that lacks it (never: start_ray adds it) fails at once, without waiting
    with pytest.raises(ConfigError, match="resource 'env'"):
        runtime.wait_for_env_resource(_config(), dict, lambda _: pytest.fail("waited"))


def test_a_failed_pre_flight_leaves_no_run_folder(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The run does not fit: `runtime.start` fails before anything starts, the log records
    the run FAILED, and no empty `runs/<run_id>/` is left behind (there was one)."""
    from dart_ray.store import open_store
    from dart_ray.store.runs import get_run

    monkeypatch.setattr(runtime, "start_ray", lambda config: None)
    monkeypatch.setattr(runtime.ray, "cluster_resources", lambda: {"CPU": 2.0})
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = _config(
        f"run.root_dir={tmp_path}",
        "run.run_id=nofit",
        "policy.model_path=fixtures/tiny-target",
        f"policy.http_port={port}",
    )
    with pytest.raises(ConfigError, match="reserves"):
        runtime.start(cfg)
    assert not (tmp_path / "nofit").exists()
    store = open_store(cfg)
    run = get_run(store.engine, "nofit")
    store.dispose()
    assert run is not None and run.status == "FAILED"
