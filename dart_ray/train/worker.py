"""The Ray Train worker loop: pull a shard, take an optimizer step, acknowledge, publish.

    for each step k:
        shard_k = curator.get_shard(k, rank)           # all ranks get a shard of the same step
        learner.step(shard_k)                           # FSDP2 forward/backward/clip/AdamW
        rank 0: log.ack(step k's claims)                # rows are trained exactly once
        every sync_every steps: version += 1
            gather the full state dict (all ranks) -> rank 0: pack, ray.put once,
            checkpoint row PENDING -> RUNNING, policy.update_weights (every replica loads
            in place), COMPLETED (or FAILED with the reason); tell the curator the version
        every save_every versions: a durable HF checkpoint + optimizer state

Publishing goes through the policy server's `update_weights`, which broadcasts to every
replica and records the version for replicas that start later. Rank 0 owns the object and
waits until every replica has loaded it, so the object outlives every `ray.get` on it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist
from dart_ray.models.loading import PolicyProcessor, load_model
from dart_ray.weights import pack
from ray import serve
from ray.serve.handle import DeploymentHandle
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from dart_ray.config import Config
from dart_ray.store import Store, open_store
from dart_ray.train.checkpointing import TrainerState, read_trainer_state, save_checkpoint
from dart_ray.train.fsdp import full_state_dict, shard_model
from dart_ray.train.learner import Learner, LossSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainJob:
    """Everything a train worker needs (picklable; no secrets: the DSN is resolved inside)."""

    config: Config
    run_id: str
    model_dir: str
    """Where the initial weights come from (the base model, or a checkpoint to resume)."""
    run_dir: str
    curator: str
    """Name of the Curator actor."""
    policy_app: str
    """Ray Serve application of the policy server (its `update_weights` reaches every replica)."""
    control: str
    namespace: str
    start: TrainerState = field(default_factory=lambda: TrainerState(step=0, version=0))
    poll_s: float = 2.0


def _rank() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _any(flag: bool) -> bool:
    if not dist.is_initialized():
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _next_shard(job: TrainJob, curator: Any, control: Any, step: int, rank: int) -> Any | None:
    """This rank's shard of `step`, or None when the run stops (decided by all ranks at once)."""
    while True:
        res = ray.get(curator.get_shard.remote(step, rank, timeout_s=job.poll_s))
        if _any(res is not None):
            if res is None:  # a peer bound the step: it is there now
                res = ray.get(curator.get_shard.remote(step, rank))
            return res
        if _any(ray.get(control.stop_requested.remote())):
            return None


def _learner(job: TrainJob, model: torch.nn.Module, processor: PolicyProcessor) -> Learner:
    c = job.config
    return Learner(
        model,
        processor.image_processor,
        image_pad_id=processor.image_pad_id,
        pad_id=processor.pad_id,
        settings=LossSettings(
            loss=c.algo.loss,
            eps_low=c.algo.eps_low,
            eps_high=c.algo.eps_high,
            dual_clip=c.algo.dual_clip,
            is_cap=c.algo.is_cap,
            kl_beta=c.algo.kl_beta,
            loss_agg=c.algo.loss_agg,
            temperature=c.policy.temperature if c.policy.temperature > 0 else 1.0,
        ),
        lr=c.train.lr,
        weight_decay=c.train.weight_decay,
        grad_clip=c.train.grad_clip,
        tokens_per_micro=c.train.tokens_per_rank,
    )


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Entry point for `ray.train.torch.TorchTrainer`."""
    job: TrainJob = loop_config["job"]
    c = job.config
    rank, _ = _rank()
    torch.manual_seed(c.run.seed)
    processor = PolicyProcessor.from_dir(job.model_dir)
    model = load_model(job.model_dir)
    if c.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    ref = None
    if c.algo.kl_beta > 0:
        ref = shard_model(load_model(job.model_dir))
    shard_model(model, "cuda" if c.train.use_gpu else "cpu")
    learner = _learner(job, model, processor)
    learner.ref_model = ref
    if (Path(job.model_dir) / "optimizer.pt").is_file():
        opt_state = (
            torch.load(Path(job.model_dir) / "optimizer.pt", weights_only=False)
            if rank == 0
            else {}
        )
        set_optimizer_state_dict(
            model,
            learner.optimizer,
            opt_state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )

    curator = ray.get_actor(job.curator, namespace=job.namespace)
    policy = serve.get_deployment_handle("PolicyServer", job.policy_app) if rank == 0 else None
    control = ray.get_actor(job.control, namespace=job.namespace)
    store = open_store(c) if rank == 0 else None
    step, version = job.start.step, job.start.version
    ray.get(curator.set_version.remote(version))

    while version < c.run.max_versions:
        res = _next_shard(job, curator, control, step, rank)
        if res is None:
            break
        shard, info = res
        t0 = time.monotonic()
        metrics = learner.step(shard)
        metrics["step_s"] = time.monotonic() - t0
        if store is not None:
            for claim in info.claims:
                store.log.ack(claim)  # after the optimizer step, never before
        step += 1
        metrics.update(step=step, samples=info.num_samples, mean_reward=info.mean_reward)
        if step % c.train.sync_every == 0:
            version += 1
            metrics["sync_s"] = _publish(job, model, learner, store, policy, version, step)
            ray.get(curator.set_version.remote(version))
        metrics["version"] = version
        ray.train.report(metrics)

    if store is not None:
        store.dispose()


def _publish(
    job: TrainJob,
    model: torch.nn.Module,
    learner: Learner,
    store: Store | None,
    policy: DeploymentHandle | None,
    version: int,
    step: int,
) -> float:
    """Gather, put once, publish to every replica, record the checkpoint; returns seconds.

    Every rank calls it (the gathers are collectives); only rank 0 holds a store."""
    c = job.config
    t0 = time.monotonic()
    cid = None
    if store is not None:
        cid = store.checkpoints.create(job.run_id, version, source="train")
        store.checkpoints.start(cid)
    state = full_state_dict(model)  # collective: every rank
    save = version % c.train.save_every == 0
    opt_state = None
    if save:
        opt_state = get_optimizer_state_dict(
            model,
            learner.optimizer,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )
    if store is None or cid is None or policy is None:
        return time.monotonic() - t0
    try:
        ref = ray.put(pack(state))  # once; the replicas read it zero-copy
        report = policy.update_weights.remote(version, [ref]).result()
        path = None
        if save:
            out = Path(job.run_dir) / "checkpoints" / f"v{version}"
            path = str(
                save_checkpoint(
                    out, model, state, opt_state, Path(job.model_dir), TrainerState(step, version)
                )
            )
        behind = {r: v for r, v in report.replicas.items() if v < version}
        if behind:
            raise RuntimeError(f"replicas still on older versions after the update: {behind}")
        store.checkpoints.complete(cid, path)
        del ref
    except Exception as e:
        store.checkpoints.fail(cid, f"{type(e).__name__}: {e}")
        raise
    return time.monotonic() - t0


def resume_point(store: Store, run_id: str) -> tuple[str, TrainerState] | None:
    """The newest COMPLETED checkpoint with files: (folder, step/version), or None."""
    for cp in reversed(store.checkpoints.list(run_id)):
        if cp.status == "COMPLETED" and cp.path and Path(cp.path, "trainer_state.json").is_file():
            return cp.path, read_trainer_state(Path(cp.path))
    return None
