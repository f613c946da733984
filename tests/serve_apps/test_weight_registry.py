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
    until the next publish' (serve_apps/weights.py)."""
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


def test_a_follower_hears_of_a_publish_when_it_is_recorded() -> None:
    """`newer_than` is the long poll replicas follow the registry with: it answers as soon as
    a newer version is recorded, and after its timeout otherwise (with what it holds)."""
    registry = WeightRegistry.remote()
    ref = ray.put(np.zeros(4, dtype=np.float32))
    t0 = time.monotonic()
    assert ray.get(registry.newer_than.remote(0, 0.3)) == (0, [])  # timed out: nothing newer
    assert time.monotonic() - t0 >= 0.3
    waiting = registry.newer_than.remote(0, 30.0)
    time.sleep(0.3)
    ready, _ = ray.wait([waiting], timeout=0)
    assert not ready  # still waiting: nothing newer yet
    ray.get(registry.publish.remote(5, [ref]))
    t0 = time.monotonic()
    version, refs = ray.get(waiting, timeout=10)
    assert version == 5 and refs[0].hex() == ref.hex()
    assert time.monotonic() - t0 < 2.0  # at the record, not at the timeout
    assert ray.get(registry.newer_than.remote(3, 30.0))[0] == 5  # already newer: at once
