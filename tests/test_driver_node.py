"""The run's own parts are pinned to the driver's node (issue 31): on a cluster, Ray placed
the zero-CPU RunControl on an environment node, which can die under it
(tests/cluster/test_node_loss.py is the multi-node check)."""

from __future__ import annotations

import ray

from actors.control import RunControl
from dart_ray.run.runtime import on_driver_node


def test_on_driver_node_pins_a_part_to_this_node(ray_local: None) -> None:
    opts = on_driver_node()
    strategy = opts["scheduling_strategy"]
    assert strategy.node_id == ray.get_runtime_context().get_node_id()
    assert strategy.soft is False  # a soft affinity let Ray place RunControl elsewhere
    control = RunControl.options(**opts).remote("pinned")
    try:
        assert ray.get(control.history.remote(), timeout=60) == []
    finally:
        ray.kill(control)
