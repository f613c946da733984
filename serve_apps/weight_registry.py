"""The newest published weights, kept for replicas that start after the publish.

A broadcast reaches the replicas alive when it is sent. A replica that autoscaling (or a
restart) adds later must not serve the base weights under an old version number, so the
policy server records every publish here, in a deployment-scoped actor that Ray Serve creates
with the deployment and removes with it, and a new replica loads the newest version before
it takes traffic.

The registry holds the publisher's reference as it is: one copy of the weights in the object
store per publish, the one the trainer put and every live replica loaded. (It used to put a
copy of its own so the newest weights would outlive the trainer; that doubled the object
store's share of every version, and `ray.put(..., _owner=...)`, which would have let the
trainer put them on the registry's behalf, was removed in Ray 2.56.) An object dies with its
owner, so after a trainer dies the newest weights are gone until the restarted trainer
publishes again: a replica that starts in that window finds them lost and serves the weights
of its model folder under that folder's version (`PolicyServer.__init__`), whose samples the
curator's staleness bound then judges like any old ones, until the next publish reaches it.

Replicas also follow the registry (`newer_than`, a long poll): a publish's broadcast goes to
the replicas its handle knows when it is sent, so a replica that Serve starts while a publish
is in progress (it read `latest` before the publish was recorded, and became routable after
the broadcast listed the replicas) would otherwise serve the old version until the next
publish. The registry records a version before the broadcast goes out and wakes every
follower then, so such a replica loads it as soon as it is recorded (serve_apps/weights.py).
"""

from __future__ import annotations

import asyncio
import contextlib

import ray
from ray import ObjectRef


@ray.remote(num_cpus=0)
class WeightRegistry:
    def __init__(self) -> None:
        self.version = 0
        self.refs: list[ObjectRef] = []
        # created unbound: it binds to the actor's event loop on first use
        self._published = asyncio.Condition()

    async def publish(self, version: int, refs: list[ObjectRef]) -> int:
        """Record `version` if it is newer than the one held, and wake the replicas waiting
        in `newer_than`; returns the version held."""
        async with self._published:
            if version > self.version:
                self.version, self.refs = version, list(refs)
                self._published.notify_all()
        return self.version

    async def newer_than(self, version: int, timeout_s: float) -> tuple[int, list[ObjectRef]]:
        """(version, refs) of the newest publish once it is above `version`, or after
        `timeout_s` whatever it is: a long poll, so a replica that a broadcast missed hears of
        a publish the moment it is recorded, and a call never outlives a replica by long."""
        async with self._published:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._published.wait_for(lambda: self.version > version), timeout_s
                )
        return self.version, list(self.refs)

    async def latest(self) -> tuple[int, list[ObjectRef]]:
        """(version, refs) of the newest publish; (0, []) before any."""
        return self.version, list(self.refs)
