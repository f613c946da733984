"""A pool of environment sessions that grows with the cluster's environment resource.

A run starts `env.num_sessions` sessions. On a cluster whose autoscaler adds environment
nodes (each carrying units of the custom resource `env.resource`), a fixed pool would leave
those nodes idle. With `env.max_sessions` set, the `EnvPoolGrower` actor reads the cluster's
total of that resource every `env.grow_interval_s`, starts one more session per new whole
unit (up to `env.max_sessions`), waits until each is up, and hands it to a rollouter
(round-robin), which starts episodes on it at once.

The pool only grows. A session is an actor, so a node holding one is not idle and the
autoscaler does not take it away while the run lasts; a session whose node dies restarts
elsewhere (`max_restarts`). Units that other runs' sessions hold are counted too: the
resource is a cap, and a session that cannot be placed yet waits, unhanded, until it can.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import ray

from actors.env_session import start_session
from dart_ray.config import EnvConfig

log = logging.getLogger(__name__)

ResourceReader = Callable[[], Mapping[str, float]]


def sessions_wanted(current: int, env_units: float, max_sessions: int) -> int:
    """Sessions to add: one per whole unit of the env resource, capped at `max_sessions`."""
    return max(0, min(max_sessions, int(env_units)) - current)


class EnvPoolGrower:
    """Starts sessions as the env resource grows; plain class, made an actor by `start_grower`.

    `read_resources` returns the cluster's total resources (`ray.cluster_resources` unless a
    test passes its own). `receivers` are rollouter handles with `add_sessions.remote(list)`.
    """

    def __init__(
        self,
        config: EnvConfig,
        prefix: str,
        receivers: list[Any],
        existing: int,
        read_resources: ResourceReader | None = None,
    ) -> None:
        if config.max_sessions is None or not config.resource:
            raise ValueError("a growing pool needs env.max_sessions and env.resource")
        self.config = config
        self.prefix = prefix
        self.receivers = receivers
        self.count = existing
        self.read_resources = read_resources or ray.cluster_resources
        self.started: list[Any] = []
        self.assigned: dict[int, list[Any]] = {}
        """Receiver index -> the sessions it was given (a restarted rollouter asks again)."""
        self._handing: set[asyncio.Task[None]] = set()
        self._stop = False

    async def grow(self) -> int:
        """One look at the resource; returns how many sessions it started."""
        units = float(self.read_resources().get(self.config.resource or "", 0.0))
        n = sessions_wanted(self.count, units, self.config.max_sessions or 0)
        for _ in range(n):
            session = start_session(self.config, f"{self.prefix}-{self.count}")
            index = self.count % len(self.receivers)
            receiver = self.receivers[index]
            self.count += 1
            self.started.append(session)
            self.assigned.setdefault(index, []).append(session)
            task = asyncio.create_task(self._hand_over(session, receiver))
            self._handing.add(task)
            task.add_done_callback(self._handing.discard)
        if n:
            log.info("env pool: %d new sessions (%g units of %s)", n, units, self.config.resource)
        return n

    async def _hand_over(self, session: Any, receiver: Any) -> None:
        """Give the session to its rollouter once it is placed and answering."""
        health = await session.health.remote()
        if not health.ok:
            log.warning("env pool: a new session is not healthy (%s)", health.last_error)
        await receiver.add_sessions.remote([session])

    async def settle(self) -> None:
        """Wait until every session started so far has been handed over (for tests)."""
        while self._handing:
            await asyncio.gather(*list(self._handing))

    async def run(self) -> None:
        """Grow every `env.grow_interval_s` until `stop()`."""
        while not self._stop:
            await self.grow()
            await asyncio.sleep(self.config.grow_interval_s)

    async def stop(self) -> None:
        self._stop = True

    async def sessions_for(self, index: int) -> list[Any]:
        """The sessions given to receiver `index` so far: Ray restarts a rollouter with its
        constructor's arguments only, so a restarted one asks here for the rest."""
        return list(self.assigned.get(index, []))

    async def sessions(self) -> list[Any]:
        """Handles of the sessions this grower started (the run stops them)."""
        return list(self.started)


def start_grower(
    config: EnvConfig, prefix: str, rollouters: list[Any], existing: int, name: str
) -> Any:
    """Start the grower as a named actor and its loop; returns the handle."""
    actor = (
        ray.remote(EnvPoolGrower)
        .options(name=name, num_cpus=0)
        .remote(config, prefix, rollouters, existing)
    )
    actor.run.remote()
    return actor
