"""Before a run's parts start: Ray started or joined (and the driver's signal handlers kept),
and the checks that fail a run in one line, naming the fix, before anything is created: the
model folder, the policy port, every secret the config names. And the polls' period (the
timing mode shrinks it with its latencies)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import ray

from dart_ray.config import Config, ConfigError, read_secret

log = logging.getLogger(__name__)


def start_ray(config: Config, *, log_to_driver: bool = True) -> None:
    """Join the cluster `cluster.address` names, or start a Ray of this run's own.

    Without an address, `ray.init()` would join whatever Ray it finds on the machine (the
    last `ray start`, or $RAY_ADDRESS) and then refuse our `num_cpus`; a local run must not
    join a cluster it was not pointed at, so it asks for `address="local"`, which Ray never
    resolves to another cluster. To use $RAY_ADDRESS, say `cluster.address=auto`."""
    if ray.is_initialized():
        return
    with _keeping_signal_handlers():
        _init_ray(config, log_to_driver)


@contextlib.contextmanager
def _keeping_signal_handlers() -> Iterator[None]:
    """`ray.init` puts Ray's own SIGTERM handler in place of the driver's (it logs "SIGTERM
    received" and aborts the process): put back what the driver had, so that `ray job stop`
    reaches `driver._graceful_signals` and the run stops cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in kept.items():
            if callable(handler):  # the driver's own (Python) handler
                signal.signal(s, handler)


def _init_ray(config: Config, log_to_driver: bool = True) -> None:
    c = config.cluster
    if c.address:
        ray.init(address=c.address, namespace=c.namespace, log_to_driver=log_to_driver)
        return
    if found := os.environ.get("RAY_ADDRESS"):
        log.warning(
            "RAY_ADDRESS=%s is set but cluster.address is not: starting a local Ray "
            "(cluster.address=auto joins that cluster)",
            found,
        )
    ray.init(
        address="local",
        num_cpus=c.num_cpus,
        namespace=c.namespace,
        _node_ip_address="127.0.0.1",  # a local Ray listens on loopback only
        include_dashboard=True,
        dashboard_host=c.dashboard_host,
        resources={config.env.resource: 10_000} if config.env.resource else None,
        log_to_driver=False,
    )


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Serve's server does
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_local_inputs(config: Config) -> None:
    """What a run on this machine needs from it, checked before anything starts, each a
    one-line error naming the fix. (On a cluster the model folder lives on the nodes and
    Serve may already hold the port, so these are left to the parts there; the driver
    reads `curation.replay_seeds` itself, so it is checked everywhere.)"""
    if config.curation.replay_seeds is not None:
        from dart_ray.engines.script import ScriptError, read_scripts

        try:
            read_scripts(Path(config.curation.replay_seeds))
        except ScriptError as e:
            raise ConfigError(f"curation.replay_seeds: {e}") from None
    if config.cluster.address is not None:
        return
    p = config.policy
    if p.engine == "script":
        if p.model_path is None or not p.model_path.exists():
            raise ConfigError(
                f"policy.engine = 'script' plays the scripts of policy.model_path = "
                f"{p.model_path}: no such file (a JSONL of instruction, actions)"
            )
    elif p.model_path is not None and not (p.model_path / "config.json").is_file():
        raise ConfigError(
            f"policy.model_path = {p.model_path}: no model there (no config.json); build the "
            "tiny one with `dart-ray model init --out DIR`, a warm start with `dart-ray sft "
            "--out DIR`, or point it at a local checkpoint folder"
        )
    if not ray.is_initialized() and _port_in_use(p.http_host, p.http_port):
        raise ConfigError(
            f"policy.http_port = {p.http_port}: {p.http_host}:{p.http_port} is in use (`ss "
            f"-ltnp 'sport = :{p.http_port}'` names the program: a Serve of another run or a "
            "cluster's?); choose another port, e.g. "
            f"policy.http_port={p.http_port + 1}, or join that cluster with cluster.address"
        )


def poll_interval(config: Config, base_s: float = 0.5) -> float:
    """A poll's period: `base_s`, shrunk with every simulated latency in the timing mode (so
    a poll weighs as much in the modelled regime as it does in a real run; at `timing.scale`
    0.1 an unscaled 0.5 s poll would stand for 5 s of the regime)."""
    return base_s * config.timing.scale if config.timing.enabled else base_s


def check_secrets(config: Config) -> None:
    """Every secret the config names is here, before anything starts: a token variable that is
    unset fails the run at once, naming the key and the variable (the parts read their own
    where they run: on a cluster, the nodes need them too; SECURITY.md)."""
    d, p = config.env.desktop, config.policy
    if config.env.kind in ("osworld", "desktop") and (d.token_env or d.token_file):
        key = "env.desktop.token_file" if d.token_file else "env.desktop.token_env"
        read_secret(d.token_env, d.token_file, required=key)
    if p.auth_token_env or p.auth_token_file:
        key = "policy.auth_token_file" if p.auth_token_file else "policy.auth_token_env"
        read_secret(p.auth_token_env, p.auth_token_file, required=key)
    s = config.store
    if s.dsn_env:
        read_secret(s.dsn_env, None, required="store.dsn_env")
    if s.password_file:
        read_secret(None, s.password_file, required="store.password_file")
