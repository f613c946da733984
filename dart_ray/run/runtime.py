"""Set-up and tear-down of a run's parts on Ray, so that the driver's loop reads in one screen.

`start(config)` connects to (or starts) Ray, opens the run in the durable log, finds or builds
the model, and starts the policy server (Ray Serve), the environment sessions, the curator,
the run control and the rollouter(s). Each part is a named actor in the run's namespace, so
an operator can find it on the dashboard and a resumed run can replace it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.control import RunControl
from actors.curator import NUM_CPUS as CURATOR_CPUS
from actors.curator import Curator
from actors.env_host import actors_of, address, host_count, session_names, start_sessions
from actors.env_pool import start_grower
from actors.rollouter import NUM_CPUS as ROLLOUTER_CPUS
from actors.rollouter import Rollouter
from dart_ray.config import Config, ConfigError
from dart_ray.engines.base import SamplingParams
from dart_ray.envs.suites import load_suite
from dart_ray.evaluation.suite import EvalResult, evaluate
from dart_ray.records import PackedTasks, Task
from dart_ray.rollout.episode import EpisodeSettings, ServePolicy
from dart_ray.store import Store, open_store
from dart_ray.store.episodes import log_unfinished
from dart_ray.store.runs import finish_run, register_run
from dart_ray.train.checkpointing import TrainerState
from dart_ray.train.worker import TrainJob, resume_from_durable, train_loop_per_worker

log = logging.getLogger(__name__)


def new_run_id(config: Config) -> str:
    return config.run.run_id or f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def start_ray(config: Config) -> None:
    """Join the cluster `cluster.address` names, or start a Ray of this run's own.

    Without an address, `ray.init()` would join whatever Ray it finds on the machine (the
    last `ray start`, or $RAY_ADDRESS) and then refuse our `num_cpus`; a local run must not
    join a cluster it was not pointed at, so it asks for `address="local"`, which Ray never
    resolves to another cluster. To use $RAY_ADDRESS, say `cluster.address=auto`."""
    if ray.is_initialized():
        return
    c = config.cluster
    if c.address:
        ray.init(address=c.address, namespace=c.namespace)
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


def check_fits(config: Config) -> None:
    """A run whose parts cannot all be placed would wait forever for the missing CPUs. On a
    local Ray (nothing will add nodes) that is a configuration error, said at once; on a
    cluster the autoscaler may add them, so it is a warning."""
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


def wait_for_env_resource(
    config: Config,
    resources: Callable[[], dict[str, float]] = ray.cluster_resources,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """On a cluster, say at once which resource is missing, then give the autoscaler
    `cluster.resource_wait_s` to add a node offering it; fail with the fix after that."""
    hint = missing_env_resource(config, resources())
    if hint is None:
        return
    wait = config.cluster.resource_wait_s
    if config.cluster.address is None or wait <= 0:
        raise ConfigError(hint)
    log.warning("%s; waiting up to %.0f s for the autoscaler to add one", hint, wait)
    waited = 0.0
    while waited < wait:
        sleep(2.0)
        waited += 2.0
        if missing_env_resource(config, resources()) is None:
            return
    raise ConfigError(f"{hint} (waited {wait:.0f} s)")


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
    Serve may already hold the port, so these are left to the parts there.)"""
    if config.cluster.address is not None:
        return
    p = config.policy
    if p.model_path is not None and not (p.model_path / "config.json").is_file():
        raise ConfigError(
            f"policy.model_path = {p.model_path}: no model there (no config.json); build the "
            "tiny one with `dart-ray model init --out DIR`, a warm start with `dart-ray sft "
            "--out DIR`, or point it at a local checkpoint folder"
        )
    if not ray.is_initialized() and _port_in_use(p.http_host, p.http_port):
        raise ConfigError(
            f"policy.http_port = {p.http_port}: {p.http_host}:{p.http_port} is in use (a Ray "
            "left running by an earlier run? `ray stop` ends it); free it or choose another, "
            f"e.g. policy.http_port={p.http_port + 1}"
        )


def prepare_model(config: Config, run_dir: Path) -> Path:
    """The configured model folder, or the tiny model built once into the run folder."""
    if config.policy.model_path is not None:
        return config.policy.model_path.resolve()
    out = run_dir / "base-model"
    if not (out / "config.json").is_file():
        from dart_ray.models.tiny import save_tiny_model

        save_tiny_model(out)
    return out


@dataclass
class Parts:
    config: Config
    run_id: str
    run_dir: Path
    store: Store
    model_dir: Path
    policy: DeploymentHandle
    sessions: list[Any]
    curator: Any
    control: Any
    rollouters: list[Any]
    tasks: list[Task]
    heldout: list[Task]
    start: TrainerState = field(default_factory=lambda: TrainerState(0, 0))
    app: str = ""
    grower: Any = None
    """The EnvPoolGrower when `env.max_sessions` is set (the pool grows with the resource)."""
    stopped: bool = False

    def names(self, part: str) -> str:
        return f"{part}:{self.run_id}"

    def trainer(self) -> TorchTrainer:
        c = self.config
        job = TrainJob(
            config=c,
            run_id=self.run_id,
            model_dir=str(self.model_dir),
            run_dir=str(self.run_dir),
            curator=self.names("curator"),
            policy_app=self.app,
            control=self.names("control"),
            namespace=c.cluster.namespace,
            start=self.start,
        )
        return TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"job": job},
            scaling_config=ScalingConfig(
                num_workers=c.train.num_workers,
                use_gpu=c.train.use_gpu,
                resources_per_worker=_worker_resources(c),
            ),
            torch_config=TorchConfig(backend="nccl" if c.train.use_gpu else "gloo"),
            # a unique name per fit: Ray Train's clean-up of an earlier fit in the same Ray
            # session removed the placement group of a later fit that shared its name
            run_config=RunConfig(
                storage_path=str(self.run_dir / "ray_train"), name=f"trainer-{job.session}"
            ),
        )

    def evaluate(self, n: int) -> EvalResult | None:
        if n <= 0 or not self.heldout:
            return None
        p = self.config.policy
        settings = EpisodeSettings(
            max_steps=self.config.rollout.max_steps,
            sampling=SamplingParams(0.0, 1.0, p.max_new_tokens),
            history_images=p.history_images,
            history_turns=p.history_turns,
            on_invalid=self.config.rollout.on_invalid_action,
        )
        return asyncio.run(
            evaluate(
                self.sessions,
                ServePolicy(self.policy),
                self.heldout[:n],
                settings,
                success_threshold=self.config.rollout.success_threshold,
            )
        )


def start(config: Config) -> Parts:
    """Bring up every part of a run (or of a resumed run)."""
    check_local_inputs(config)
    # Actors and train workers run in other working directories: every path they derive
    # from the config (the SQLite log, blobs, checkpoints) must be absolute.
    config = config.model_copy(
        update={"run": config.run.model_copy(update={"root_dir": config.run.root_dir.resolve()})}
    ).simulated()  # a timing-mode run: sessions run LatencyMiniDesk with [timing]'s figures
    if config.timing.enabled:
        log.warning("timing mode: a SIMULATED run (compute replaced by calibrated latencies)")
    run_id = new_run_id(config)
    run_dir = (config.run.root_dir / run_id).resolve()
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(config, init=True)
    register_run(store.engine, run_id, config.run.name, config.model_dump(mode="json"))
    start_state = TrainerState(0, 0)
    model_dir = prepare_model(config, run_dir)
    if config.run.resume:
        path, start_state = resume_from_durable(store, run_id)
        if path is not None:
            model_dir = Path(path)
        # nothing else consumes this run now: rows the last trainer held go back at once,
        # and the episodes that were running when it stopped are logged as ABORTED
        store.log.expire_leases(run_id, now=_far_future())
        log_unfinished(store, run_id, "in flight when the run stopped; resumed")
    # Ray after every relative path is resolved: a job's driver (`ray job submit
    # --working-dir`) can lose its working directory once it connects
    start_ray(config)
    try:
        check_fits(config)
        wait_for_env_resource(config)
    except ConfigError:
        finish_run(store.engine, run_id, "FAILED")
        if created:  # the log keeps the FAILED run; no empty folder is left to explain
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    ns = config.cluster.namespace
    app = f"policy-{run_id}"
    serve.start(http_options={"host": config.policy.http_host, "port": config.policy.http_port})
    from serve_apps.policy import build_app

    policy = serve.run(
        build_app(
            config.policy,
            model_dir,
            initial_version=start_state.version,
            timing=config.timing if config.timing.enabled else None,
        ),
        name=app,
        route_prefix=f"/{app}",
    )
    sessions = start_sessions(config.env, prefix=f"env-{run_id}")
    # rollouters find a session by name (a restarted rollouter looks it up again)
    names = (
        session_names(config.env, prefix=f"env-{run_id}")
        if config.env.sessions_per_actor == 1
        else [address(s) for s in sessions]
    )
    tasks, heldout = load_suite(config, "train"), _heldout(config)
    parts = Parts(
        config,
        run_id,
        run_dir,
        store,
        model_dir,
        policy,
        sessions,
        None,
        None,
        [],
        tasks,
        heldout,
        start_state,
        app,
    )
    here = on_driver_node()
    parts.curator = Curator.options(name=parts.names("curator"), namespace=ns, **here).remote(
        config, run_id, config.train.num_workers
    )
    parts.control = RunControl.options(name=parts.names("control"), namespace=ns, **here).remote(
        parts.run_id
    )
    packed = PackedTasks.of(tasks)
    if not packed.inline:
        log.warning(
            "%d training tasks pack to %d KB, above what travels inline with an actor: a "
            "rollouter that Ray restarts then depends on the object store's copy of them",
            len(tasks),
            len(packed.blob) // 1024,
        )
    parts.rollouters = [
        Rollouter.options(name=parts.names(f"rollouter-{i}"), namespace=ns, **here).remote(
            config,
            run_id,
            packed,
            names[i :: config.rollout.rollouters],
            app,
            (i, config.rollout.rollouters),
            parts.names("env-pool") if config.env.max_sessions is not None else None,
            parts.names("curator"),
        )
        for i in range(config.rollout.rollouters)
    ]
    if config.env.max_sessions is not None:
        parts.grower = start_grower(
            config.env, f"env-{run_id}", parts.rollouters, len(sessions), parts.names("env-pool")
        )
    return parts


def on_driver_node() -> dict[str, Any]:
    """Actor options that keep a run's own parts (curator, run control, rollouters) on the
    driver's node, the head: Ray placed RunControl, which reserves no CPU, on an environment
    node even with a soft affinity, and a part there dies with that node (a RunControl is
    not restarted). Hard: these parts live and die with the driver's node, as the driver does."""
    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def _worker_resources(c: Config) -> dict[str, float]:
    """What each Ray Train worker reserves: CPUs, and GPUs (possibly a fraction) on GPU."""
    res = {"CPU": c.train.cpus_per_worker}
    if c.train.use_gpu:
        res["GPU"] = c.train.gpus_per_worker
    return res


def _heldout(config: Config) -> list[Task]:
    try:
        return load_suite(config, "heldout")
    except ConfigError:
        return []


def _far_future() -> Any:
    from datetime import datetime

    return datetime(9999, 1, 1)


def stop(parts: Parts) -> None:
    """Release what the curator holds, stop every part, keep the log and the files (once)."""
    if parts.stopped:
        return
    parts.stopped = True
    try:
        ray.get(parts.curator.shutdown.remote(), timeout=60)
    except (ray.exceptions.RayError, TimeoutError) as e:
        log.warning("curator shutdown: %s", e)
    grown: list[Any] = []
    if parts.grower is not None:
        try:
            grown = ray.get(parts.grower.sessions.remote(), timeout=60)
        except (ray.exceptions.RayError, TimeoutError) as e:  # its sessions die with the job
            log.warning("env pool grower: %s", e)
        ray.kill(parts.grower)
    for a in [*parts.rollouters, parts.curator, parts.control, *actors_of(parts.sessions), *grown]:
        ray.kill(a)
    serve.delete(parts.app)
    parts.store.dispose()
