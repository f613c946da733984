"""The Ray Train worker loop: pull a shard, take an optimizer step, publish, make it durable.

    for each step k:
        shard_k = curator.get_shard(session, k, rank)  # every rank: a shard of the same step
        learner.step(shard_k)                           # FSDP2 forward/backward/clip/AdamW
        rank 0 takes over step k's claims first (a step whose rows are no longer held is
            skipped by every rank); a heartbeat thread renews the leases throughout: while
            waiting, stepping, publishing and saving
        every sync_every steps: version += 1
            gather the full state dict (all ranks) -> rank 0: pack, ray.put once,
            policy.update_weights (every replica loads in place), checkpoint row
            PENDING -> RUNNING -> COMPLETED (or FAILED with the reason)
        every save_every versions, and at the end: a durable HF checkpoint + optimizer state,
            then rank 0 acknowledges every claim it holds in the log

Rows are acknowledged only once the weights they trained are in a durable checkpoint. A
trainer that dies loses at most the steps since its last checkpoint, and exactly those rows
go back to the pool (its leases lapse, and the curator releases them when a new trainer
session starts), to be trained again from the checkpoint it resumes: nothing trained twice
into the durable weights, nothing lost.

Rank 0 owns the object it publishes and waits in `update_weights` until every replica has
loaded it, so the object outlives every `ray.get` on it.
"""

from __future__ import annotations

import logging
import time
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from dart_ray.data.batches import TOKEN_LAG, token_lags
from dart_ray.models import lora
from dart_ray.models.loading import PolicyProcessor, load_model
from dart_ray.store import Claim, open_store
from dart_ray.train.checkpointing import TrainerState
from dart_ray.train.fsdp import comm_device, full_adapter_state, full_state_dict, shard_model
from dart_ray.train.job import TrainJob
from dart_ray.train.learner import Learner, loss_settings
from dart_ray.train.publisher import Publisher
from dart_ray.train.timing import timed_step

log = logging.getLogger(__name__)

REPORTED = ("version", "loss", "tokens", "step_s", "sync_s", "mean_reward")
"""The step's metrics `ray.train.report` gives Ray Train (its dashboard's view of the run)."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _any(flag: bool) -> bool:
    if not dist.is_initialized():
        return flag
    t = torch.tensor([int(flag)], device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class StepMismatchError(RuntimeError):
    """Ranks were handed different curated steps under one step number (the curator
    restarted between their requests and lost what it had bound)."""


def step_fingerprint(claims: tuple[Claim, ...]) -> int:
    """A number that identifies a curated step: its claims and rows (the same on every rank
    that received the same step; StepInfo carries the whole step's claims)."""
    key = ";".join(f"{c.claim_id}:{','.join(map(str, sorted(c.row_ids)))}" for c in claims)
    return zlib.crc32(key.encode())


def check_same_step(step: int, claims: tuple[Claim, ...]) -> None:
    """Every rank holds the same curated step, or all raise StepMismatchError (the trainer
    then restarts in a new session, and the curator gives every bound step back)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    f = step_fingerprint(claims)
    t = torch.tensor([f, -f], dtype=torch.int64, device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if int(t[0]) != -int(t[1]):  # max != min: ranks disagree
        raise StepMismatchError(
            f"step {step}: ranks were handed different curated steps (the curator restarted "
            "between their requests); restarting the trainer so they start over together"
        )


def _next_shard(job: TrainJob, curator: Any, control: Any, step: int, rank: int) -> Any | None:
    """This rank's shard of `step`, or None when the run stops (decided by all ranks at once).
    A stop request ends the run at the next step boundary even while data keeps coming."""
    if _any(ray.get(control.stop_requested.remote())):
        return None
    while True:
        res = ray.get(curator.get_shard.remote(job.session, step, rank, timeout_s=job.poll_s))
        if _any(res is not None):
            if res is None:  # a peer bound the step: it is there now
                res = ray.get(curator.get_shard.remote(job.session, step, rank))
            return res
        if _any(ray.get(control.stop_requested.remote())):
            return None


def _sample_versions(shard: pa.RecordBatch, version: int) -> dict[str, float]:
    """The oldest and newest weight version among the step's samples on this rank (what a
    reader checks to see how on- or off-policy a step was), and its response tokens by how
    many versions they are behind the weights `version` that train them (`token_lag_<k>`)."""
    if shard.num_rows == 0:
        return {}
    lo, hi = pc.min_max(shard.column("weight_version")).values()
    lags = {f"{TOKEN_LAG}{k}": float(n) for k, n in token_lags(shard, version).items()}
    return {"sample_version_min": float(lo.as_py()), "sample_version_max": float(hi.as_py())} | lags


def _learner(
    job: TrainJob, model: torch.nn.Module, processor: PolicyProcessor, device: str
) -> Learner:
    c = job.config
    return Learner(
        model,
        processor.image_processor,
        image_pad_id=processor.image_pad_id,
        pad_id=processor.pad_id,
        settings=loss_settings(c),
        lr=c.train.lr,
        weight_decay=c.train.weight_decay,
        grad_clip=c.train.grad_clip,
        tokens_per_micro=c.train.tokens_per_rank,
        suppressed_ids=processor.suppressed_ids(c.policy.allow_special_tokens),
        device=device,
    )


def _load_policy(job: TrainJob) -> torch.nn.Module:
    """The weights to train: the model folder's, with LoRA adapters when `train.lora` asks
    for them (fresh, or a LoRA checkpoint's when resuming one; its settings must match)."""
    spec = lora.adapter_spec(job.config.train.lora)
    resumed = lora.is_adapter_checkpoint(job.model_dir)
    if resumed and spec is None:
        raise lora.AdapterError(
            f"{job.model_dir} holds LoRA adapters but train.lora.enabled is false"
        )
    model = load_model(job.model_dir)
    if spec is None:
        return model
    if resumed:
        _, saved, _ = lora.read_adapter_checkpoint(job.model_dir)
        if saved != spec:
            raise lora.AdapterError(
                f"{job.model_dir} holds adapters {saved}; train.lora asks {spec}"
            )
        return model
    return lora.add_adapters(model, spec)


def _build(job: TrainJob) -> tuple[torch.nn.Module, Learner]:
    c = job.config
    processor = PolicyProcessor.from_dir(job.model_dir)
    model = _load_policy(job)
    if c.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    device = "cuda" if c.train.use_gpu else "cpu"
    learner = _learner(job, shard_model(model, device), processor, device)
    if c.algo.kl_beta > 0 and c.train.lora.enabled:
        # the frozen base is the reference: the policy with its adapters disabled, not a
        # second full model (on UI-TARS-7B, 16.6 GB of bf16 weights a trainer need not hold)
        learner.ref_adapters_off = True
    elif c.algo.kl_beta > 0:  # the run's base, not a resumed checkpoint
        ref = job.base_dir or lora.base_folder(job.model_dir)
        learner.ref_model = shard_model(load_model(ref), device)
    opt_file = Path(job.model_dir) / "optimizer.pt"
    if opt_file.is_file():  # resuming from a durable checkpoint
        opt_state = torch.load(opt_file, weights_only=False) if _rank() == 0 else {}
        set_optimizer_state_dict(
            model,
            learner.optimizer,
            opt_state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
    return model, learner


def quiet_train_reports() -> None:
    """Ray Train logs every `ray.train.report` at INFO with the whole dict ("Reporting training
    result ..."), a ~1,000-character line per step in the job's log; the run's own progress
    lines and report say the same, so that logger keeps its warnings only. Ray names it by
    its file (`logging.getLogger(__file__)`), not its module: the logger is the module's."""
    from ray.train.v2._internal.execution import context

    context.logger.setLevel(logging.WARNING)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Entry point for `ray.train.torch.TorchTrainer`."""
    job: TrainJob = loop_config["job"]
    c = job.config
    rank = _rank()
    quiet_train_reports()
    torch.manual_seed(c.run.seed)
    model, learner = _build(job)
    curator = ray.get_actor(job.curator, namespace=job.namespace)
    control = ray.get_actor(job.control, namespace=job.namespace)
    store = open_store(c, wait=True) if rank == 0 else None
    pub = Publisher(job, store, curator) if store is not None else None
    try:
        _train_steps(job, model, learner, curator, control, pub, rank)
    finally:
        if pub is not None:
            pub.leases.stop()
        if store is not None:
            store.dispose()


def _train_steps(
    job: TrainJob,
    model: torch.nn.Module,
    learner: Learner,
    curator: Any,
    control: Any,
    pub: Publisher | None,
    rank: int,
) -> None:
    """The loop of the module docstring, on every rank (`pub` on rank 0 only)."""
    c = job.config
    step, version = job.start.step, job.start.version
    synced_step, saved_step = step, step
    durable = version if job.start.durable_version is None else job.start.durable_version
    last_cid = -1

    def sync(*, bump: bool, save: bool) -> float:
        """Every rank: gather (and the optimizer state when saving). Rank 0 publishes a new
        version (`bump`) and/or makes the current one durable (`save`)."""
        nonlocal version, synced_step, saved_step, last_cid, durable
        if bump:
            version += 1
        # LoRA: only the adapters are gathered, published and saved
        state = full_adapter_state(model) if c.train.lora.enabled else full_state_dict(model)
        opt_state = None
        if save:
            opt_state = get_optimizer_state_dict(
                model,
                learner.optimizer,
                options=StateDictOptions(full_state_dict=True, cpu_offload=True),
            )
        seconds = 0.0
        if pub is not None:
            if bump:
                last_cid, seconds = pub.publish(version, state)
            at = TrainerState(step, version)
            pub.make_durable(last_cid, model, state, opt_state, at, completed=not bump)
        synced_step = step
        if save:
            saved_step, durable = step, version
        ray.get(curator.set_version.remote(version))
        return seconds

    if durable < version:
        # resumed below the versions the replicas serve (their weights are gone): publish the
        # weights it holds at once, so replicas stop sampling from the discarded ones
        sync(bump=True, save=False)
    else:
        ray.get(curator.set_version.remote(version))

    while should_train(version, durable, c.run.max_versions):
        res = _next_shard(job, curator, control, step, rank)
        if res is None:
            break
        shard, info = res
        check_same_step(step, info.claims)
        if _any(pub is not None and not pub.take(step, info.claims, version)):
            step += 1  # rank 0 found the step's rows gone: no rank trains it
            continue
        t0 = time.monotonic()
        if c.timing.enabled:  # a simulated run: the step takes a 7B step's time, computes nothing
            world = dist.get_world_size() if dist.is_initialized() else 1
            metrics = timed_step(shard, c.timing, world)
        else:
            metrics = learner.step(shard, version if step == synced_step else None)
        metrics["step_s"] = time.monotonic() - t0
        metrics.update(_sample_versions(shard, version))
        step += 1
        metrics.update(step=step, samples=info.num_samples, mean_reward=info.mean_reward)
        if step % c.train.sync_every == 0:
            nxt = version + 1
            save = nxt % c.train.save_every == 0 or nxt >= c.run.max_versions
            metrics["sync_s"] = sync(bump=True, save=save)
        metrics["version"] = version
        metrics["t_end"] = time.time()  # the step and its sync ended (system.png's timeline)
        if rank == 0:
            control.record.remote(metrics)
        # what Ray Train's dashboard shows of the step; the whole record goes to RunControl
        ray.train.report({k: metrics[k] for k in REPORTED if k in metrics})

    # Stopped early: what was trained since the last sync or save becomes durable.
    if step > synced_step:
        sync(bump=True, save=True)
    elif step > saved_step:
        sync(bump=False, save=True)


def should_train(version: int, durable: int, max_versions: int) -> bool:
    """Whether the trainer takes another step: while the run is short of `max_versions`, and
    while its newest version is not in a durable checkpoint. The second case is a trainer
    resumed after its predecessor published versions it never made durable (SIGKILL between
    publishing the last version and writing its files): the published weights are gone, and
    versions only go up, so it trains on to a new version and saves it, rather than ending a
    run whose last version exists nowhere."""
    return version < max_versions or durable < version
