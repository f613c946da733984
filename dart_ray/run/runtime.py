"""Set-up and tear-down of a run's parts on Ray, so that the driver's loop reads in one screen.

`start(config)` connects to (or starts) Ray, opens the run in the durable log, finds or builds
the model, and starts the policy server (Ray Serve), the environment sessions, the curator,
the run control and the rollouter(s). Each part is a named actor in the run's namespace, so
an operator can find it on the dashboard and a resumed run can replace it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import time
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
from actors.curator import Curator
from actors.env_host import actors_of, address, session_names, start_sessions
from actors.env_pool import start_grower
from actors.rollouter import Rollouter
from dart_ray.config import Config, ConfigError
from dart_ray.engines.base import SamplingParams
from dart_ray.envs.suites import load_suite
from dart_ray.evaluation.suite import EvalResult, evaluate
from dart_ray.records import PackedTasks, Task
from dart_ray.rollout.episode import EpisodeSettings, ServePolicy
from dart_ray.run.capacity import (
    EnvRequest,
    check_fits,
    has_autoscaler,
    wait_for_env_resource,
)
from dart_ray.run.preflight import check_local_inputs, poll_interval, start_ray
from dart_ray.store import Store, open_store
from dart_ray.store.episodes import log_unfinished
from dart_ray.store.runs import finish_run, register_run
from dart_ray.train.checkpointing import TrainerState
from dart_ray.train.job import TrainJob
from dart_ray.train.resume import resume_from_durable
from dart_ray.train.worker import train_loop_per_worker

# imported before Ray connects: a job's driver (`ray job submit --working-dir`) can lose its
# working directory's files once it connects (Ray unpacks the package again), so a module
# imported lazily after that is not found (tests/test_job_submit.py)
from serve_apps.policy import deploy_policy

log = logging.getLogger(__name__)


def new_run_id(config: Config) -> str:
    return config.run.run_id or f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


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
    """The weights the run starts from now: its base, or the checkpoint it resumes."""
    policy: DeploymentHandle
    sessions: list[Any]
    curator: Any
    control: Any
    rollouters: list[Any]
    tasks: list[Task]
    heldout: list[Task]
    start: TrainerState = field(default_factory=lambda: TrainerState(0, 0))
    app: str = ""
    policy_url: str = ""
    """The full URL of the policy's OpenAI route (printed when the run starts)."""
    grower: Any = None
    """The EnvPoolGrower when `env.max_sessions` is set (the pool grows with the resource)."""
    env_request: EnvRequest | None = None
    """The run's request to the autoscaler for env nodes, if it made one (withdrawn at stop)."""
    stopped: bool = False
    base_dir: Path | None = None
    """The run's initial weights (the KL reference), when a resume starts from a checkpoint."""

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
            base_dir=str(self.base_dir or ""),
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


def job_working_dir() -> str | None:
    """The working directory Ray uploaded for this driver (`ray job submit --working-dir`),
    or None when the driver is not such a job. Ray runs the job in a temporary copy of it
    (`.../runtime_resources/working_dir_files/_ray_pkg_*`), removed when no longer used."""
    spec = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")  # set by Ray's job supervisor
    if not spec:
        return None
    working_dir = (json.loads(spec).get("runtime_env") or {}).get("working_dir")
    return str(working_dir) if working_dir else None


def run_root(config: Config) -> Path:
    """Where the run's outputs and its embedded log go, as an absolute path: `run.root_dir`
    as it is when absolute; a relative one from the working directory, except in a job with
    an uploaded working directory, whose copy is temporary and unknown to the operator:
    there it is taken from `run.job_root_dir` (`~/dart-ray/runs` by default)."""
    root = config.run.root_dir.expanduser()
    if root.is_absolute():
        return root
    if job_working_dir() is not None:
        return (config.run.job_root_dir.expanduser() / root).resolve()
    return root.resolve()


def start(config: Config) -> Parts:
    """Bring up every part of a run (or of a resumed run). The run is in the log from the
    start; if bringing it up fails, however, the log says FAILED (never RUNNING)."""
    if config.policy.engine == "script":
        raise ConfigError(
            "policy.engine = 'script' plays written solutions: it has no weights to train; use "
            "it with `dart-ray eval` or `dart-ray serve`"
        )
    if config.curation.replay_seeds is not None and config.policy.engine != "hf":
        raise ConfigError(
            "curation.replay_seeds scores the solutions under the policy (teacher forcing), "
            f"which policy.engine = {config.policy.engine!r} cannot: use 'hf'"
        )
    check_local_inputs(config)
    # Actors and train workers run in other working directories: every path they derive
    # from the config (the SQLite log, blobs, checkpoints) must be absolute.
    config = config.model_copy(
        update={"run": config.run.model_copy(update={"root_dir": run_root(config)})}
    ).simulated()  # a timing-mode run: sessions run LatencyMiniDesk with [timing]'s figures
    if config.timing.enabled:
        log.warning("timing mode: a SIMULATED run (compute replaced by calibrated latencies)")
    run_id = new_run_id(config)
    run_dir = config.run.root_dir / run_id
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(config, init=True)
    register_run(store.engine, run_id, config.run.name, config.model_dump(mode="json"))
    try:
        return _bring_up(config, run_id, run_dir, store, created)
    except BaseException:
        finish_run(store.engine, run_id, "FAILED")
        raise


def _bring_up(config: Config, run_id: str, run_dir: Path, store: Store, created: bool) -> Parts:
    start_state = TrainerState(0, 0)
    model_dir = base_dir = prepare_model(config, run_dir)
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
    # asked for the env nodes the run waits for; withdrawn when it stops (or fails here)
    env_request = EnvRequest()
    try:
        autoscaler = functools.cache(has_autoscaler)  # asked at most once, only when short
        config = wait_for_env_resource(config, autoscaler=autoscaler, request=env_request)
        check_fits(config, autoscaler)
    except ConfigError:
        env_request.withdraw()
        if created:  # the log keeps the FAILED run; no empty folder is left to explain
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    try:
        return _start_parts(
            config, run_id, run_dir, store, model_dir, base_dir, start_state, env_request
        )
    except BaseException:
        env_request.withdraw()
        raise


def _start_parts(
    config: Config,
    run_id: str,
    run_dir: Path,
    store: Store,
    model_dir: Path,
    base_dir: Path,
    start_state: TrainerState,
    env_request: EnvRequest,
) -> Parts:
    ns = config.cluster.namespace
    app = f"policy-{run_id}"
    # the OpenAI route: /v1/chat/completions when this is Serve's only application
    policy, policy_url = deploy_policy(
        config.policy,
        model_dir,
        app,
        initial_version=start_state.version,
        timing=config.timing if config.timing.enabled else None,
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
        policy_url=policy_url,
        env_request=env_request,
        base_dir=base_dir,
    )
    here = on_driver_node()
    parts.curator = Curator.options(name=parts.names("curator"), namespace=ns, **here).remote(
        config, run_id, config.train.num_workers, poll_interval(config)
    )
    # curating from the start, not from the trainer's first request: a synchronous dynamic
    # round samples until the curator reports a step's groups, and a trainer still loading
    # would leave every session sampling past it
    ray.get(parts.curator.start.remote(), timeout=60)
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
    if parts.env_request is not None:  # the env nodes may go once idle
        parts.env_request.withdraw()
    parts.store.dispose()
