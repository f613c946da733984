"""The weight registry keeps the newest weights alive after their publisher dies: a replica
that starts after a trainer restart can still load them."""

from __future__ import annotations

import numpy as np
import pytest
import ray

from serve_apps.weight_registry import WeightRegistry

pytestmark = pytest.mark.usefixtures("ray_local")


@ray.remote(num_cpus=0)
class _Publisher:
    def publish(self, registry: object, version: int) -> int:
        ref = ray.put(np.full(1000, version, dtype=np.float32))
        return ray.get(registry.publish.remote(version, [ref]))  # type: ignore[attr-defined]


def test_weights_outlive_their_publisher() -> None:
    registry = WeightRegistry.remote()
    pub = _Publisher.remote()
    assert ray.get(pub.publish.remote(registry, 3)) == 3
    assert ray.get(registry.owns_latest.remote())
    ray.kill(pub)  # the trainer worker that put them is gone
    version, refs = ray.get(registry.latest.remote())
    assert version == 3
    assert float(ray.get(refs[0], timeout=30)[0]) == 3.0
    # an older version never replaces a newer one
    pub2 = _Publisher.remote()
    assert ray.get(pub2.publish.remote(registry, 2)) == 3
