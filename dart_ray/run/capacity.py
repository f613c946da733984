"""Does the Ray cluster hold the run's environment sessions, and will anything add what it lacks?

Each session actor asks Ray for one unit of `env.resource` (an EnvHost of
`env.sessions_per_actor` sessions asks for one unit too). A cluster offering fewer units than
the run starts actors would leave the rest pending, silently, for as long as the run lasts:
that was seen with `cluster/node-resources.sh` on a 2-core node (one unit) and 8 sessions.
So before anything starts, the run compares the units offered with the units needed and

- runs with what is offered, said in one line, when `env.fit_to_cluster` allows it;
- waits `cluster.resource_wait_s` for nodes when an autoscaler can add them;
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

from actors.env_host import host_count
from dart_ray.config import Config

log = logging.getLogger(__name__)


def units_needed(config: Config) -> int:
    """Units of `env.resource` the run's session actors ask for (0 when they ask for none)."""
    return host_count(config.env) if config.env.resource else 0


def shortfall(config: Config, offered: float) -> str | None:
    """What to tell an operator whose cluster offers fewer `env.resource` units than the
    sessions need, with the numbers and each fix; None when they fit (or none is offered at
    all: `runtime.missing_env_resource` says that)."""
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
