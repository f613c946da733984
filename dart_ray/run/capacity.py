"""Does the Ray cluster hold the run's environment sessions, and will anything add what it lacks?

Each session actor asks Ray for one unit of `env.resource` (an EnvHost of
`env.sessions_per_actor` sessions asks for one unit too). A cluster offering fewer units than
the run starts actors would leave the rest pending, silently, for as long as the run lasts:
that was seen with `cluster/node-resources.sh` on a 2-core node (one unit) and 8 sessions.
So before anything starts, the run compares the units offered with the units needed and

- runs with what is offered, said in one line, when `env.fit_to_cluster` allows it;
- waits `cluster.resource_wait_s` for nodes when an autoscaler can add them, having asked it
  for them (`EnvRequest`): an autoscaler adds nodes for work that waits in Ray, and a run that
  only polls the cluster's resources before starting its sessions leaves none waiting (seen
  with cluster/fake-multinode.yaml: no env node came, the run failed after the wait);
- fails at once with the numbers and the fix otherwise (a local Ray, or a cluster of nodes
  started by hand, which nothing will grow).

Whether an autoscaler runs is read from what it leaves in the GCS: the cluster config that
autoscaler v2 (and KubeRay's) reports, or the status the v1 monitor writes every few seconds
(`ray status` reads it). A head started with `ray start --head` runs that monitor too, but
with Ray's read-only provider, which names each node's type `node_<node id>` and can launch
nothing; an autoscaler with a cluster YAML names them after its node types.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import ray

from actors.curator import NUM_CPUS as CURATOR_CPUS
from actors.env_host import host_count
from actors.env_session import session_options
from actors.rollouter import NUM_CPUS as ROLLOUTER_CPUS
from dart_ray.config import Config, ConfigError

log = logging.getLogger(__name__)


def units_needed(config: Config) -> int:
    """Units of `env.resource` the run's session actors ask for (0 when they ask for none)."""
    return host_count(config.env) if config.env.resource else 0


def shortfall(config: Config, offered: float) -> str | None:
    """What to tell an operator whose cluster offers fewer `env.resource` units than the
    sessions need, with the numbers and each fix; None when they fit (or none is offered at
    all: `missing_env_resource` says that)."""
    e, need = config.env, units_needed(config)
    if offered < 1.0 or offered >= need:
        return None
    k, res = e.sessions_per_actor, e.resource
    per = "1 per session" if k == 1 else f"1 per actor of {k} sessions (env.sessions_per_actor)"
    fits = int(offered) * k
    return (
        f"env.num_sessions = {e.num_sessions} sessions need {need} units of the Ray resource "
        f"{res!r} ({per}) but the cluster offers {offered:g}: lower env.num_sessions to "
        f'{fits}, add nodes that offer {res!r} (`ray start ... --resources=\'{{"{res}": '
        f"{need}}}'`; cluster/node-resources.sh offers one unit per DART_RAY_CPUS_PER_ENV cores, "
        f"default 2), or set env.fit_to_cluster=true to run with the {fits} the cluster offers"
    )


def fit_to(config: Config, offered: float) -> Config:
    """The config with as many sessions as `offered` units hold, said in one line."""
    e = config.env
    n = min(e.num_sessions, int(offered) * e.sessions_per_actor)
    log.warning(
        "env.fit_to_cluster: the cluster offers %g units of %r, so the run starts %d of "
        "env.num_sessions = %d sessions",
        offered,
        e.resource,
        n,
        e.num_sessions,
    )
    return config.model_copy(update={"env": e.model_copy(update={"num_sessions": n})})


def node_types_show_autoscaler(mapping: dict[str, str]) -> bool | None:
    """From the v1 monitor's `node_type_mapping` (node -> node type): True if some node has a
    type of a cluster YAML, False if every type is the read-only provider's `node_<id>`,
    None if there are no nodes to tell by."""
    if not mapping:
        return None
    return any(kind != f"node_{node}" for node, kind in mapping.items())


def _autoscaler_verdict() -> bool | None:
    """True/False from what an autoscaler left in the GCS; None if nothing is there yet."""
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray._private.state import state
    from ray.experimental.internal_kv import _internal_kv_get

    config = state.get_cluster_config()  # autoscaler v2 and KubeRay report their node groups
    if config is not None and any(g.max_count != 0 for g in config.node_group_configs):
        return True
    raw = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)  # the v1 monitor's status (`ray status`)
    if not raw:
        return None
    report = json.loads(raw).get("autoscaler_report") or {}
    return node_types_show_autoscaler(report.get("node_type_mapping") or {})


def has_autoscaler(timeout_s: float = 10.0, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether an autoscaler can add nodes to the connected cluster. The v1 monitor writes
    its status every 5 s: a cluster started a moment ago may not have one yet, so look for
    `timeout_s`; nothing there by then means no autoscaler (e.g. `ray start --head
    --no-monitor`). A Ray whose private state API moved is taken to have one (the run then
    waits, as it always did)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            verdict = _autoscaler_verdict()
        except (ImportError, AttributeError) as e:
            log.warning("cannot tell whether the cluster autoscales (%s): assuming it does", e)
            return True
        if verdict is not None:
            return verdict
        if time.monotonic() >= deadline:
            return False
        sleep(1.0)


def cpu_demand(config: Config) -> dict[str, float]:
    """CPUs each kind of part reserves in Ray (what must fit at once for the run to start)."""
    p, e, t = config.policy, config.env, config.train
    replicas = p.min_replicas if p.autoscaling else p.replicas
    actors = host_count(e)
    per = f" ({e.sessions_per_actor} sessions each)" if e.sessions_per_actor > 1 else ""
    return {
        f"{actors} env actors{per} x env.num_cpus {e.num_cpus:g}": actors * e.num_cpus,
        f"{replicas} policy replicas x policy.num_cpus {p.num_cpus:g}": replicas * p.num_cpus,
        f"{t.num_workers} train workers x train.cpus_per_worker {t.cpus_per_worker:g}": (
            t.num_workers * t.cpus_per_worker
        ),
        f"{config.rollout.rollouters} rollouters x {ROLLOUTER_CPUS:g}": (
            ROLLOUTER_CPUS * config.rollout.rollouters
        ),
        "the curator": CURATOR_CPUS,
    }


def check_fits(config: Config, autoscaler: Callable[[], bool] = has_autoscaler) -> None:
    """A run whose parts cannot all be placed would wait forever for the missing CPUs. On a
    local Ray, or a cluster that no autoscaler grows, that is a configuration error, said at
    once; where an autoscaler may add nodes it is a warning."""
    demand = cpu_demand(config)
    need = sum(demand.values())
    have = float(ray.cluster_resources().get("CPU", 0.0))
    if need <= have + 1e-9:
        return
    parts = "; ".join(f"{k}: {v:g}" for k, v in demand.items())
    msg = (
        f"the run reserves {need:g} CPUs ({parts}) but the Ray cluster has {have:g}: lower "
        "env.num_cpus (sessions that mostly wait need little), env.num_sessions or "
        "policy.num_cpus, or give Ray more (cluster.num_cpus)"
    )
    if config.cluster.address is None:
        raise ConfigError(msg)
    if not autoscaler():
        raise ConfigError(f"{msg}, or add nodes: {NO_AUTOSCALER}")
    log.warning("%s; waiting for the autoscaler to add nodes", msg)


def missing_env_resource(config: Config, resources: dict[str, float]) -> str | None:
    """What to tell a user whose cluster offers no unit of `env.resource` (each environment
    session asks for one, so without it the run would wait forever); None if it is there."""
    res = config.env.resource
    if not res or resources.get(res, 0.0) >= 1.0:
        return None
    return (
        f"no node of the Ray cluster offers the resource {res!r} that each environment "
        f"session requests (env.resource): start nodes with `ray start ... "
        f"--resources='{{\"{res}\": 8}}'`, give a node type `resources: {{{res}: 16}}` in the "
        f'cluster YAML (cluster/aws.yaml does), or run with env.resource="" to place sessions '
        "on any node"
    )


def env_bundles(config: Config) -> list[dict[str, float]]:
    """What the run's session actors will ask Ray for, one bundle each (session_options):
    the shapes the autoscaler is asked to fit while the run waits for them."""
    opts = session_options(config.env)
    return [{"CPU": float(opts["num_cpus"]), **opts.get("resources", {})}] * units_needed(config)


def _request_resources(bundles: list[dict[str, float]]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)


class EnvRequest:
    """The run's standing request to the autoscaler for its sessions' nodes
    (`ray.autoscaler.sdk.request_resources`, v1 and v2): made while the run waits for them;
    held while the sessions run, where it asks for no more than they hold (the autoscaler
    counts what is in use), so it adds nothing then, and a lost node is asked for again at
    once; withdrawn when the run stops or fails, so that idle env nodes can go. It is the
    cluster's one request: a second run that waits on the same cluster replaces it."""

    def __init__(self, send: Callable[[list[dict[str, float]]], None] = _request_resources):
        self.send = send
        self.standing = False

    def __call__(self, bundles: list[dict[str, float]]) -> None:
        self.send(bundles)
        self.standing = bool(bundles)

    def withdraw(self) -> None:
        """Withdraw the request if this run made one (a request of nothing)."""
        if not self.standing:
            return
        try:
            self.send([])
            self.standing = False
        except Exception as e:  # a run that stops must not fail on this
            log.warning(
                "could not withdraw the request for env nodes (%s): the autoscaler keeps "
                "them until `ray.autoscaler.sdk.request_resources(bundles=[])`",
                e,
            )


NO_AUTOSCALER = (
    "this cluster has no autoscaler (its nodes were started with `ray start`), so nothing "
    "will add nodes: failing now rather than waiting"
)


def wait_for_env_resource(
    config: Config,
    resources: Callable[[], dict[str, float]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    autoscaler: Callable[[], bool] = has_autoscaler,
    request: Callable[[list[dict[str, float]]], None] | None = None,
) -> Config:
    """The config to run with, once the cluster offers the `env.resource` units its sessions
    need (capacity.py says why): at once if it does; with fewer sessions if it offers some
    and `env.fit_to_cluster` allows it; after the autoscaler added nodes, within
    `cluster.resource_wait_s`, having asked the autoscaler for them through `request` (an
    `EnvRequest`, which the caller withdraws; here only when the wait fails). A local Ray, or
    a cluster without an autoscaler, fails at once with the numbers and the fix."""
    res = config.env.resource
    if not res:
        return config
    resources = resources or ray.cluster_resources
    offered = resources().get(res, 0.0)
    if offered >= units_needed(config):
        return config
    if config.env.fit_to_cluster and offered >= 1.0:
        return fit_to(config, offered)
    hint = shortfall(config, offered) or missing_env_resource(config, {res: offered})
    assert hint is not None
    wait = config.cluster.resource_wait_s
    if config.cluster.address is None or wait <= 0:
        raise ConfigError(hint)
    if not autoscaler():
        raise ConfigError(f"{hint}; {NO_AUTOSCALER} {wait:.0f} s (cluster.resource_wait_s)")
    log.warning("%s; waiting up to %.0f s for the autoscaler to add nodes", hint, wait)
    request = request or EnvRequest()
    request(env_bundles(config))
    waited = 0.0
    while waited < wait:
        sleep(2.0)
        waited += 2.0
        if resources().get(res, 0.0) >= units_needed(config):
            return config
    request([])
    raise ConfigError(f"{hint} (waited {wait:.0f} s)")
