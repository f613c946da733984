"""The weight registry keeps the newest published weights for replicas that start later,
without a copy: the very object the trainer put."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from serve_apps.weight_registry import WeightRegistry

pytestmark = pytest.mark.usefixtures("ray_local")


@ray.remote(num_cpus=0)
class _Publisher:
    def publish(self, registry: object, version: int) -> tuple[int, str]:
        ref = ray.put(np.full(1000, version, dtype=np.float32))
        held = ray.get(registry.publish.remote(version, [ref]))  # type: ignore[attr-defined]
        return held, ref.hex()


def test_the_registry_holds_the_published_object_not_a_copy() -> None:
    """One copy per publish: a while after the publish, the registry still hands out the
    trainer's own object (before, it replaced it with a copy of its own, doubling the object
    store's share of every version)."""
    registry = WeightRegistry.remote()
    pub = _Publisher.remote()
    held, put_hex = ray.get(pub.publish.remote(registry, 3))
    assert held == 3
    time.sleep(1.0)  # the old registry adopted its copy in the background by now
    version, refs = ray.get(registry.latest.remote())
    assert version == 3 and refs[0].hex() == put_hex
    assert float(ray.get(refs[0], timeout=30)[0]) == 3.0
    # an older version never replaces a newer one
    assert ray.get(_Publisher.remote().publish.remote(registry, 2))[0] == 3


def test_weights_go_with_the_trainer_that_put_them() -> None:
    """The price of no copy: once its publisher is gone, the newest version cannot be loaded
    (ObjectLostError), which a replica starting then treats as 'serve the folder's weights
    until the next publish' (serve_apps/policy.py)."""
    registry = WeightRegistry.remote()
    pub = _Publisher.remote()
    ray.get(pub.publish.remote(registry, 4))
    ray.kill(pub)
    _, refs = ray.get(registry.latest.remote())
    with pytest.raises(ray.exceptions.ObjectLostError):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the owner's death takes a moment to be known
            ray.get(refs[0], timeout=30)
            time.sleep(0.5)
