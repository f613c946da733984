"""The newest published weights, kept for replicas that start after the publish.

A broadcast reaches the replicas alive when it is sent. A replica that autoscaling (or a
restart) adds later must not serve the base weights under an old version number, so the
policy server records every publish here, in a deployment-scoped actor that Ray Serve creates
with the deployment and removes with it, and a new replica loads the newest version before
it takes traffic.

The registry owns what it holds. The publisher's `ObjectRef` is owned by the train worker
that put it, and an object dies with its owner: a replica restarted after a trainer restart
would find nothing to load (`OwnerDiedError`) and never come up. So the registry records the
borrowed reference at once (the broadcast is not delayed) and then, in the background, puts
its own copy and drops the borrowed one: one copy of the newest weights lives as long as the
deployment, whatever happens to the trainer.
"""

from __future__ import annotations

import asyncio
import logging

import ray
from ray import ObjectRef

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0)
class WeightRegistry:
    def __init__(self) -> None:
        self.version = 0
        self.refs: list[ObjectRef] = []
        self.owned = True
        self._adopting: asyncio.Task[None] | None = None

    async def publish(self, version: int, refs: list[ObjectRef]) -> int:
        """Record `version` if it is newer than the one held; returns the version held."""
        if version > self.version:
            self.version, self.refs, self.owned = version, list(refs), False
            self._adopting = asyncio.get_running_loop().create_task(self._adopt(version))
        return self.version

    async def _adopt(self, version: int) -> None:
        """Replace the borrowed reference of `version` by a copy this actor owns."""
        try:
            value = await self.refs[0]
            own = ray.put(value)
            del value
        except Exception:  # the publisher died first: the next publish brings a new one
            log.exception("could not take ownership of the weights of version %d", version)
            return
        if self.version == version:
            self.refs, self.owned = [own], True

    async def latest(self) -> tuple[int, list[ObjectRef]]:
        """(version, refs) of the newest publish; (0, []) before any."""
        return self.version, list(self.refs)

    async def owns_latest(self) -> bool:
        """True once the newest weights are held in a copy of the registry's own."""
        if self._adopting is not None:
            await asyncio.shield(self._adopting)
        return self.owned
