"""Rank 0's side of syncing weights: checkpoint rows, publication to every policy replica
(with a deadline, and at once failed when the application is gone), durable saves, and the
claims of trained-but-not-yet-durable steps (held under their leases, acknowledged once their
weights are durable)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray import serve
from ray.serve.exceptions import DeploymentUnavailableError

from dart_ray.models import lora
from dart_ray.models.weights import pack, warm_object_store
from dart_ray.store import Claim, Store
from dart_ray.train.checkpointing import TrainerState, save_checkpoint
from dart_ray.train.job import TrainJob
from dart_ray.train.leases import LeaseKeeper

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """A weight publication that cannot complete: the trainer fails with this reason."""


def policy_app_alive(app: str) -> bool:
    """Whether Serve still runs the application (a Serve that does not answer counts as not
    running it: the publication then fails with the reason, instead of waiting for ever)."""
    try:
        status = serve.status().applications.get(app)
    except Exception:  # Serve's controller gone or unreachable
        return False
    return status is not None and status.status != "DELETING"


class Publisher:
    """Rank 0's side of syncing: checkpoint rows, publication, durable saves, and the claims
    of trained-but-not-yet-durable steps."""

    def __init__(self, job: TrainJob, store: Store, curator: Any) -> None:
        self.job = job
        self.store = store
        self.curator = curator
        self.policy = serve.get_deployment_handle("PolicyServer", job.policy_app)
        # renews from its own thread: a step, a publish or a save may outlast the lease
        self.leases = LeaseKeeper(store.log, job.config.curation.lease_s).start()
        self.adapter = lora.adapter_spec(job.config.train.lora)
        """Set when the run trains LoRA adapters: they are what is published and saved."""
        self.trained_at: dict[int, int] = {}
        """Step -> the version of the weights that trained it, until it is durable."""
        if job.config.train.warm_object_store:  # now, while the first batch is being rolled out
            w = warm_object_store()
            log.info("warmed %.1f GB of the object store in %.2f s", w.bytes / 1e9, w.seconds)

    @property
    def pending(self) -> dict[int, list[Claim]]:
        return self.leases.held

    def take(self, step: int, claims: tuple[Claim, ...], version: int) -> bool:
        """Take over a step's claims before training it with the weights of `version`
        (False: its rows are no longer held, so it must not be trained; the curator forgets
        it)."""
        if self.leases.take(step, claims):
            self.trained_at[step] = version
            return True
        log.warning("step %d: its rows are no longer held (lease lapsed or settled); skipped", step)
        ray.get(self.curator.release_step.remote(self.job.session, step))
        return False

    def publish(self, version: int, state: dict[str, torch.Tensor]) -> tuple[int, float]:
        """Put once, every replica loads in place; returns (checkpoint id, seconds)."""
        t0 = time.monotonic()
        cps = self.store.checkpoints
        cid = cps.create(
            self.job.run_id, version, source="train", config_yaml=self.job.config.redacted_yaml()
        )
        cps.start(cid)
        try:
            ref = ray.put(pack(state, self.adapter))  # once; replicas on this node: zero-copy
            report = self._await_update(version, self.policy.update_weights.remote(version, [ref]))
            behind = {r: v for r, v in report.replicas.items() if v < version}
            if behind:
                raise RuntimeError(f"replicas still on older versions after the update: {behind}")
            del ref
        except Exception as e:
            cps.fail(cid, f"{type(e).__name__}: {e}")
            raise
        return cid, time.monotonic() - t0

    def _await_update(self, version: int, response: Any, poll_s: float = 5.0) -> Any:
        """The replicas' answer to a weight update, within `train.publish_timeout_s`; an
        application that is gone fails it at once (its replicas will never answer)."""
        app = self.job.policy_app
        gone = PublishError(
            f"v{version}: the policy application {app!r} is gone (deleted, or Serve shut "
            "down): no replica can load the weights"
        )
        deadline = time.monotonic() + self.job.config.train.publish_timeout_s
        while True:
            try:
                return response.result(timeout_s=min(poll_s, max(deadline - time.monotonic(), 0)))
            except DeploymentUnavailableError:  # Ray >= 2.60's router knows it at once
                raise gone from None
            except TimeoutError:
                if not policy_app_alive(app):
                    raise gone from None
                if time.monotonic() >= deadline:
                    raise PublishError(
                        f"v{version}: the replicas did not load the weights within "
                        f"train.publish_timeout_s = {self.job.config.train.publish_timeout_s:g}"
                    ) from None

    def make_durable(
        self,
        cid: int,
        model: torch.nn.Module,
        state: dict[str, torch.Tensor],
        opt_state: dict[str, Any] | None,
        at: TrainerState,
        *,
        completed: bool = False,
    ) -> None:
        """Complete the checkpoint row; with `opt_state`, first write its files and then
        acknowledge every held claim: those rows are now in durable weights."""
        path = None
        if opt_state is not None:
            by_version: dict[int, list[int]] = {}
            for step, claims in self.pending.items():
                rows = by_version.setdefault(self.trained_at[step], [])
                rows.extend(r for c in claims for r in c.row_ids)
            lineage = tuple(sorted(r for rs in by_version.values() for r in rs))
            trained_at = {v: tuple(sorted(rs)) for v, rs in by_version.items()}
            at = TrainerState(at.step, at.version, lineage, trained_at)
            out = Path(self.job.run_dir) / "checkpoints" / f"v{at.version}"
            src = Path(self.job.model_dir)
            path = str(save_checkpoint(out, model, state, opt_state, src, at, self.adapter))
            # every trained row must still be held before the checkpoint becomes the durable
            # record of its training (LeaseLostError: restart from the previous one)
            self.leases.renew()
        if completed:
            if path is not None:
                self.store.checkpoints.attach(cid, path)
        else:
            self.store.checkpoints.complete(cid, path)
        if path is None:
            return
        steps = self.leases.acknowledge(lambda c: self.store.log.ack(c, in_version=at.version))
        ray.get(self.curator.forget_steps.remote(self.job.session, steps))
        self.trained_at.clear()
