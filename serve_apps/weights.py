"""How a policy replica follows the published weights: the half of `PolicyServer` that
loads versions in place (`policy.py` holds generation and the HTTP route).

A publish (`update_weights`, called on any replica by the trainer) records the version in the
deployment's registry first (`weight_registry.py`), then broadcasts `load_weights` to every
replica until no replica answers that had not; a replica started later reads the registry in
`__init__` and before its first request (`_sync`), and every replica long-polls it
(`_follow`), so none serves an old version under a new number. Loads are serialised by
`_load_lock`; a version at or below the loaded one is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ray import ObjectRef, serve
from ray.exceptions import ObjectLostError, RayActorError
from ray.serve.handle import DeploymentHandle

from dart_ray.config import PolicyConfig
from dart_ray.engines.base import Engine
from dart_ray.models.weights import PackedWeights
from dart_ray.uitars.prompts import BadRequest

log = logging.getLogger(__name__)

REGISTRY = "weights"
FOLLOW_POLL_S = 30.0
"""How long one long poll of the registry waits for a publish before it is renewed."""


@dataclass(frozen=True, slots=True)
class UpdateReport:
    """What `update_weights` did: the version and where each replica stands now."""

    version: int
    replicas: dict[str, int] = field(default_factory=dict)
    """Replica id -> the version it serves after the update."""
    seconds: float = 0.0


def _loaded(results: list[Any]) -> list[tuple[str, int]]:
    """The (replica, version) answers of a `load_weights` broadcast. A replica that died or
    was removed while it ran (autoscaling down) needs no weights and is left out; any other
    failure is raised."""
    out = []
    for r in results:
        if isinstance(r, RayActorError):
            log.info("a replica left during a weight broadcast: %s", type(r).__name__)
        elif isinstance(r, BaseException):
            raise r
        else:
            out.append(r)
    return out


class WeightFollower:
    """Set by `PolicyServer.__init__`: the engine, the config, this replica's id, app and
    deployment names, the newest version heard of and the load lock."""

    cfg: PolicyConfig
    engine: Engine
    replica: str
    app_name: str
    deployment: str
    _seen: int
    _load_lock: asyncio.Lock

    async def _catch_up(self, version: int, refs: list[ObjectRef]) -> None:
        """Load `version` from the registry if it is newer than anything heard of. Weights
        lost with the trainer that put them are skipped: the next publish comes."""
        if version <= self._seen:
            return
        try:
            await self.load_weights(version, refs)
        except ObjectLostError as e:
            log.warning(
                "replica %s: version %d is gone with the trainer that put it (%s); serving "
                "version %d until the next publish",
                self.replica,
                version,
                type(e).__name__,
                self.engine.version,
            )

    async def _sync(self) -> None:
        """Before its first request, a replica reads the registry once more and loads what
        it finds: Serve makes a replica routable only after `__init__`, and a publish whose
        broadcast was sent in between (or whose handle had not yet heard of the replica)
        does not reach it. Never raises: a failing registry must not hold requests."""
        try:
            version, refs = await serve.get_deployment_actor(REGISTRY).latest.remote()
            await self._catch_up(version, refs)
            async with self._load_lock:  # a load the broadcast or `_follow` began is done
                pass
        except Exception as e:
            log.warning("replica %s: reading the weight registry: %r", self.replica, e)

    async def _follow(self) -> None:
        """Keep up with the registry for the replica's whole life: it records a version
        before the broadcast goes out and answers this long poll then, so a replica that a
        broadcast misses starts loading within a round trip of the record instead of
        serving the old version until the next publish."""
        registry = serve.get_deployment_actor(REGISTRY)
        while True:
            try:
                version, refs = await registry.newer_than.remote(self._seen, FOLLOW_POLL_S)
                await self._catch_up(version, refs)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the registry restarting, or going with the app
                log.warning("replica %s: following the weight registry: %r", self.replica, e)
                await asyncio.sleep(1.0)

    async def update_weights(self, version: int, refs: list[ObjectRef]) -> UpdateReport:
        """Publish `version` to every replica (and to later ones); returns their versions."""
        if not isinstance(refs, list) or len(refs) != 1 or not isinstance(refs[0], ObjectRef):
            raise BadRequest("update_weights takes a list with one ObjectRef of PackedWeights")
        t0 = time.perf_counter()
        # recorded first: a replica that starts from here on reads it (`__init__`, `_sync`)
        await serve.get_deployment_actor(REGISTRY).publish.remote(version, refs)
        handle: DeploymentHandle = serve.get_deployment_handle(self.deployment, self.app_name)
        replicas: dict[str, int] = {}
        async with asyncio.timeout(self.cfg.update_timeout_s):
            # A broadcast reaches the replicas the handle knows when it is sent: send it again
            # (a no-op where loaded) until no replica answers that had not, so one that
            # autoscaling added meanwhile has loaded too when this returns.
            while True:
                results = await handle.broadcast("load_weights", version, refs).results_async(
                    return_exceptions=True
                )
                answered = dict(_loaded(results))
                if answered.keys() <= replicas.keys():
                    break
                replicas |= answered
        return UpdateReport(version, replicas, time.perf_counter() - t0)

    async def load_weights(self, version: int, refs: list[ObjectRef]) -> tuple[str, int]:
        """Load `version` into this replica in place (broadcast target); (replica, version).
        A version at or below the loaded one is a no-op (the follower may have loaded it)."""
        self._seen = max(self._seen, version)
        async with self._load_lock:
            if version > self.engine.version:
                weights = await refs[0]
                if not isinstance(weights, PackedWeights):
                    raise BadRequest(f"weights must be PackedWeights, got {type(weights).__name__}")
                seconds = await self.engine.update_weights(version, weights)
                del weights  # release the object-store view
                log.info("replica %s loaded version %d in %.3f s", self.replica, version, seconds)
        return self.replica, self.engine.version
