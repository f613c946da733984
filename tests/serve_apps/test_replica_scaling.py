"""Policy replicas that autoscaling adds and removes mid-run: a new replica serves the newest
published version from its first request, and a removed one loses no request.

The first test replays the race deterministically, on one replica built in this process: a
publish is recorded while the replica becomes routable, and its broadcast (which lists the
replicas its handle knows when it is sent) misses the replica. The second scales the real
application on Serve (timing engine: no model compute on this 2-core machine).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

from dart_ray.config import PolicyConfig, TimingConfig
from dart_ray.models.weights import pack
from serve_apps.policy import PolicyServer, build_app
from serve_apps.weight_registry import WeightRegistry
from tests.policy_helpers import request

pytestmark = pytest.mark.usefixtures("ray_local")

MODEL = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-sft"
APP = "policy-scaling-test"

# ~0.1 s per request on one simulated GPU, 0.05 s per weight load
TIMING = TimingConfig(enabled=True, scale=0.1, rollout_gpus=1, weight_load_s=0.5)


def _weights(version: int) -> ray.ObjectRef:
    return ray.put(pack({"w": torch.full((4,), float(version))}))


def test_a_replica_a_broadcast_missed_serves_the_recorded_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the fix such a replica served the version it read in `__init__` until the next
    publish whose broadcast listed it; now it reads the registry again before its first
    request, and follows it afterwards."""
    registry = WeightRegistry.remote()
    ctx = SimpleNamespace(
        replica_id=SimpleNamespace(unique_id="r-new"), app_name="a", deployment="PolicyServer"
    )
    monkeypatch.setattr(serve, "get_replica_context", lambda: ctx)
    monkeypatch.setattr(serve, "get_deployment_actor", lambda name: registry)
    wrapper = PolicyServer.func_or_class
    user_class = wrapper.__mro__[1]  # the class under @serve.ingress (no HTTP app needed here)
    refs = {v: _weights(v) for v in (1, 2, 3)}

    async def scenario() -> None:
        await registry.publish.remote(1, [refs[1]])
        server = object.__new__(wrapper)
        await user_class.__init__(
            server,
            PolicyConfig().model_dump(mode="json"),
            str(MODEL),
            0,
            TIMING.model_dump(mode="json"),
        )
        assert server.version() == 1  # what the registry held when Serve started it
        # a publish is recorded now; its broadcast went to the replicas known before this one
        await registry.publish.remote(2, [refs[2]])
        first = await server.generate(request())
        assert (first.weight_version, first.replica) == (2, "r-new")
        # once serving: a publish recorded whose broadcast misses it is loaded all the same
        await registry.publish.remote(3, [refs[3]])
        t0 = time.monotonic()
        while server.version() < 3 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.02)
        assert server.version() == 3, "the replica kept serving version 2"
        assert (await server.generate(request())).weight_version == 3
        server._follower.cancel()

    asyncio.run(scenario())


@dataclass
class _Call:
    sent: float
    confirmed: int
    """The newest version whose `update_weights` had returned when the request was sent."""
    done: float = 0.0
    replica: str = ""
    version: int = -1
    error: str = ""


class _Load:
    """Workers that each keep one request in flight; `workers` changes how many run."""

    def __init__(self, handle: DeploymentHandle, confirmed: list[int]) -> None:
        self.handle = handle
        self.confirmed = confirmed
        self.calls: list[_Call] = []
        self.threads: list[tuple[threading.Thread, threading.Event]] = []

    def _run(self, stop: threading.Event) -> None:
        req = request()
        while not stop.is_set():
            call = _Call(time.monotonic(), self.confirmed[-1])
            try:
                g = self.handle.generate.remote(req).result(timeout_s=60)
                call.replica, call.version = g.replica, g.weight_version
            except Exception as e:  # every failure is a lost request: recorded, asserted on
                call.error = repr(e)
            call.done = time.monotonic()
            self.calls.append(call)

    def set_workers(self, n: int) -> None:
        while len(self.threads) < n:
            stop = threading.Event()
            t = threading.Thread(target=self._run, args=(stop,), daemon=True)
            t.start()
            self.threads.append((t, stop))
        while len(self.threads) > n:
            t, stop = self.threads.pop()
            stop.set()
            t.join(timeout=90)


def _replica_count() -> dict[str, int]:
    app = serve.status().applications[APP]
    states = app.deployments["PolicyServer"].replica_states
    return {str(getattr(k, "value", k)): v for k, v in states.items()}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*look_back_period_s")
def test_autoscaling_adds_a_replica_on_the_newest_version_and_removes_one_losing_nothing() -> None:
    cfg = PolicyConfig(
        autoscaling=True,
        min_replicas=1,
        max_replicas=2,
        target_ongoing_requests=2,
        upscale_delay_s=0.5,
        downscale_delay_s=2.0,
        look_back_period_s=2.0,
        max_ongoing_requests=8,
        max_batch_size=8,
        num_cpus=0.25,
    )
    handle = serve.run(build_app(cfg, MODEL, timing=TIMING), name=APP, route_prefix=None)
    try:
        first = {h["replica"] for h in handle.broadcast("health").results()}
        assert len(first) == 1
        confirmed = [0]
        for v in (1, 2):
            assert handle.update_weights.remote(v, [_weights(v)]).result().version == v
            confirmed.append(v)

        publish_errors: list[str] = []
        stop_publishing = threading.Event()

        def publish() -> None:
            """Keep publishing through both scalings (about one version a second)."""
            v = confirmed[-1]
            while not stop_publishing.wait(1.0):
                v += 1
                try:
                    handle.update_weights.remote(v, [_weights(v)]).result(timeout_s=60)
                    confirmed.append(v)
                except Exception as e:
                    publish_errors.append(repr(e))

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        load = _Load(handle, confirmed)
        t_load = time.monotonic()
        load.set_workers(8)  # 8 in flight on one replica, 2 wanted: Serve adds the second
        new: list[_Call] = []
        while time.monotonic() - t_load < 60 and not new:
            time.sleep(0.2)
            new = [c for c in list(load.calls) if c.replica and c.replica not in first]
        assert new, f"no second replica within 60 s: {_replica_count()}"
        t_second = min(c.done for c in new) - t_load
        time.sleep(3.0)  # both replicas serve, publishes go on

        load.set_workers(1)  # a trickle: Serve removes one replica while it runs
        t_trickle = time.monotonic()
        down_s = None
        while time.monotonic() - t_trickle < 60:
            counts = _replica_count()
            if counts.get("RUNNING", 0) == 1 and sum(counts.values()) == 1:
                down_s = time.monotonic() - t_trickle
                break
            time.sleep(0.2)
        time.sleep(1.0)  # the trickle goes on after the removal
        load.set_workers(0)
        stop_publishing.set()
        publisher.join(timeout=90)

        calls = load.calls
        print(
            f"\nsecond replica serving {t_second:.1f} s after the load began; back to one "
            f"replica {down_s if down_s is not None else float('nan'):.1f} s after it stopped; {len(calls)} requests, versions up to "
            f"{confirmed[-1]}"
        )
        assert [c.error for c in calls if c.error] == []  # none lost, none failed
        assert publish_errors == []  # a replica leaving mid-broadcast fails no publish
        assert down_s is not None, f"still {_replica_count()} 60 s after the load stopped"
        by_new = sorted((c for c in calls if c.replica not in first), key=lambda c: c.sent)
        assert by_new and by_new[0].version >= by_new[0].confirmed >= 2
        stale = [c for c in calls if c.version < c.confirmed]
        assert stale == [], "answered below the version confirmed before it was sent"
        assert len(confirmed) > 4  # publishes went on while it scaled
        trickle = [c for c in calls if c.sent >= t_trickle]
        assert len(trickle) >= 5
    finally:
        serve.delete(APP)
