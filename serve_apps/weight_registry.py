"""The newest published weights, kept for replicas that start after the publish.

A broadcast reaches the replicas alive when it is sent. A replica that autoscaling (or a
restart) adds later must not serve the base weights under an old version number, so the
policy server records every publish here, in a deployment-scoped actor that Ray Serve creates
with the deployment and removes with it, and a new replica loads the newest version before
it takes traffic.

The actor holds the `ObjectRef`s (it borrows them; no bytes are copied), so the weights stay
in the object store while their owner, the publisher, lives.
"""

from __future__ import annotations

import ray
from ray import ObjectRef


@ray.remote(num_cpus=0)
class WeightRegistry:
    def __init__(self) -> None:
        self.version = 0
        self.refs: list[ObjectRef] = []

    def publish(self, version: int, refs: list[ObjectRef]) -> int:
        """Record `version` if it is newer than the one held; returns the version held."""
        if version > self.version:
            self.version, self.refs = version, list(refs)
        return self.version

    def latest(self) -> tuple[int, list[ObjectRef]]:
        """(version, refs) of the newest publish; (0, []) before any."""
        return self.version, list(self.refs)
