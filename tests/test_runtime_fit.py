"""A run whose parts cannot all be placed on a local Ray fails at once, naming the parts."""

from __future__ import annotations

import logging

import pytest

from dart_ray.config import ConfigError, load_config
from dart_ray.run import capacity, runtime


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
    demand = capacity.cpu_demand(_config())
    assert sum(demand.values()) == pytest.approx(32 * 0.1 + 0.5 + 0.5 + 0.1 + 0.25)
    assert "32 env actors x env.num_cpus 0.1" in demand
    # sessions hosted 16 to an actor reserve CPUs per actor
    hosted = capacity.cpu_demand(_config("env.sessions_per_actor=16"))
    assert hosted["2 env actors (16 sessions each) x env.num_cpus 0.1"] == pytest.approx(0.2)


def test_too_many_sessions_for_a_local_ray_is_a_config_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(capacity.ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ConfigError, match=r"reserves 4.55 CPUs .* has 2: lower env.num_cpus"):
        capacity.check_fits(_config())
    capacity.check_fits(_config("env.num_cpus=0.01"))  # 1.67 CPUs: fits


def test_on_a_cluster_it_waits_for_the_autoscaler(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(capacity.ray, "cluster_resources", lambda: {"CPU": 2.0})
    with caplog.at_level(logging.WARNING, logger="dart_ray.run.runtime"):
        capacity.check_fits(_config("cluster.address=auto"), lambda: True)
    assert "waiting for the autoscaler" in caplog.text


def test_on_a_cluster_without_an_autoscaler_it_fails_at_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(capacity.ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ConfigError, match=r"reserves 4.55 CPUs .* has no autoscaler"):
        capacity.check_fits(_config("cluster.address=auto"), lambda: False)


def test_a_cluster_without_the_env_resource_is_named_at_once_and_fails_after_the_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen: `ray start --head` then `ray job submit ... cluster.address=auto` on nodes with no
    `env` resource waited forever while the autoscaler repeated that nothing fits."""
    cfg = _config("cluster.address=auto", "cluster.resource_wait_s=6")
    slept: list[float] = []
    asked: list[list[dict[str, float]]] = []
    with (
        caplog.at_level(logging.WARNING, logger="dart_ray.run.runtime"),
        pytest.raises(ConfigError, match=r"resource 'env'.*--resources=.*env.resource=\"\"") as e,
    ):
        capacity.wait_for_env_resource(
            cfg, lambda: {"CPU": 8.0}, slept.append, lambda: True, asked.append
        )
    assert "waited 6 s" in str(e.value) and sum(slept) == 6.0
    assert "resource 'env'" in caplog.text  # said before the wait, not after it
    # asked for the 32 sessions' units before waiting; withdrawn when the wait failed
    assert asked == [[{"CPU": 0.1, "env": 1}] * 32, []]
    # the autoscaler adds nodes offering the 32 units during the wait: the run goes on
    offers = iter([{"CPU": 8.0}, {"CPU": 8.0}, {"CPU": 40.0, "env": 32.0}])
    asked.clear()
    capacity.wait_for_env_resource(
        cfg, lambda: next(offers), lambda _: None, lambda: True, asked.append
    )
    assert asked == [[{"CPU": 0.1, "env": 1}] * 32]  # standing: the run withdraws it at stop
    # sessions that ask for no resource, or a cluster that has it: nothing to wait for
    assert capacity.missing_env_resource(_config('env.resource=""'), {}) is None
    assert capacity.missing_env_resource(cfg, {"env": 1.0}) is None
    # a local Ray that lacks it (never: start_ray adds it) fails at once, without waiting
    with pytest.raises(ConfigError, match="resource 'env'"):
        capacity.wait_for_env_resource(_config(), dict, lambda _: pytest.fail("waited"))


def test_the_run_asks_the_autoscaler_for_its_env_nodes_and_withdraws_only_its_own() -> None:
    """An autoscaler adds nodes for work waiting in Ray; a run that waits before starting its
    sessions has none waiting, so it asks (request_resources): with cluster/fake-multinode.yaml
    and no env node up, no node came without it and the run failed after the wait."""
    # one bundle per session actor, shaped as the actor asks Ray
    hosted = _config("env.num_sessions=10", "env.sessions_per_actor=4", "env.num_cpus=0.5")
    assert capacity.env_bundles(hosted) == [{"CPU": 0.5, "env": 1}] * 3
    sent: list[list[dict[str, float]]] = []
    request = capacity.EnvRequest(sent.append)
    request.withdraw()  # nothing asked: nothing sent (another caller's request stays)
    assert sent == [] and not request.standing
    request([{"env": 1}])
    assert request.standing
    request.withdraw()
    request.withdraw()  # once
    assert sent == [[{"env": 1}], []] and not request.standing

    def broken(_: list[dict[str, float]]) -> None:
        raise RuntimeError("GCS gone")

    failing = capacity.EnvRequest(broken)
    failing.standing = True
    failing.withdraw()  # said, not raised: a stopping run does not fail on it
    # no request where nothing is short, or nothing would add nodes
    cfg = _config("cluster.address=auto", "env.num_sessions=8")
    capacity.wait_for_env_resource(cfg, lambda: {"env": 8.0}, pytest.fail, pytest.fail, sent.append)
    with pytest.raises(ConfigError, match="no autoscaler"):
        capacity.wait_for_env_resource(
            cfg, lambda: {"env": 0.0}, pytest.fail, lambda: False, sent.append
        )
    assert len(sent) == 2


def test_a_failed_pre_flight_leaves_no_run_folder(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The run does not fit: `runtime.start` fails before anything starts, the log records
    the run FAILED, and no empty `runs/<run_id>/` is left behind (there was one)."""
    from dart_ray.store import open_store
    from dart_ray.store.runs import get_run

    monkeypatch.setattr(runtime, "start_ray", lambda config: None)
    monkeypatch.setattr(runtime.ray, "cluster_resources", lambda: {"CPU": 2.0, "env": 32.0})
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


def test_fewer_env_units_than_sessions_fail_at_once_with_the_numbers_and_the_fix() -> None:
    """Seen: cluster/node-resources.sh offered {"env": 1} on a 2-core node; 7 of 8 sessions
    stayed pending for minutes with nothing in the log (the check needed one unit)."""
    cfg = _config("cluster.address=auto", "env.num_sessions=8")

    def no_autoscaler() -> bool:
        return False

    with pytest.raises(ConfigError) as e:
        capacity.wait_for_env_resource(cfg, lambda: {"env": 1.0}, pytest.fail, no_autoscaler)
    msg = str(e.value)
    assert (
        "env.num_sessions = 8 sessions need 8 units of the Ray resource 'env' (1 per session)"
        in msg
    )
    assert "offers 1: lower env.num_sessions to 1" in msg
    assert "node-resources.sh" in msg and "env.fit_to_cluster=true" in msg
    assert "no autoscaler" in msg and "failing now rather than waiting 6" not in msg
    # 16 sessions 4 to an actor ask for 4 units; 3 offered hold 12 sessions
    hosted = _config("cluster.address=auto", "env.num_sessions=16", "env.sessions_per_actor=4")
    with pytest.raises(ConfigError, match=r"need 4 units .*1 per actor of 4 sessions.* to 12"):
        capacity.wait_for_env_resource(hosted, lambda: {"env": 3.0}, pytest.fail, no_autoscaler)
    # a local Ray says it without asking about an autoscaler
    with pytest.raises(ConfigError, match="need 8 units"):
        capacity.wait_for_env_resource(
            _config("env.num_sessions=8"), lambda: {"env": 1.0}, pytest.fail, pytest.fail
        )
    # enough units: the config comes back as it was
    assert capacity.wait_for_env_resource(cfg, lambda: {"env": 8.0}, pytest.fail) is cfg


def test_fit_to_cluster_runs_with_the_sessions_offered_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = _config("cluster.address=auto", "env.num_sessions=8", "env.fit_to_cluster=true")
    with caplog.at_level(logging.WARNING, logger="dart_ray.run.capacity"):
        fitted = capacity.wait_for_env_resource(cfg, lambda: {"env": 3.0}, pytest.fail)
    assert fitted.env.num_sessions == 3 and cfg.env.num_sessions == 8
    [line] = caplog.messages
    assert line == (
        "env.fit_to_cluster: the cluster offers 3 units of 'env', so the run starts 3 of "
        "env.num_sessions = 8 sessions"
    )
    # 2 units hold two actors of 4 sessions: 8 of 10
    hosted = _config("env.num_sessions=10", "env.sessions_per_actor=4", "env.fit_to_cluster=true")
    assert capacity.wait_for_env_resource(hosted, lambda: {"env": 2.0}).env.num_sessions == 8


def test_the_read_only_provider_means_no_autoscaler() -> None:
    """`node_type_mapping` as the v1 monitor wrote it on two real heads (Ray 2.60): `ray start
    --head` (read-only provider) and one started with a fake_multinode cluster YAML."""
    from dart_ray.run.capacity import node_types_show_autoscaler

    node = "5c55416d374f87fd80541291a1a78df3e1ac0749b663fe5a50ec46c3"
    assert node_types_show_autoscaler({node: f"node_{node}"}) is False
    assert node_types_show_autoscaler({node: "ray.head.default"}) is True
    assert node_types_show_autoscaler({node: f"node_{node}", "10.0.0.7": "env"}) is True
    assert node_types_show_autoscaler({}) is None
