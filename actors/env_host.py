"""EnvHost: many environment sessions in one Ray actor, for pools of hundreds or thousands.

One EnvSession actor per session costs a Python process (~100 MB, a Ray worker, a second or
more to start on 2 cores): right for a pool of desktops that each need a core, wrong for 1,024
sessions that mostly wait on remote VMs or sleep through simulated latencies. A host holds
`env.sessions_per_actor` EnvSession objects (the same class, so each session keeps its own
deadlines, crash recovery and statistics) and runs calls for different sessions at once, in
the threads of a threaded actor (one per session, plus a few for health and statistics).

`HostedSession` is what the rest of the run holds: it answers `reset`, `step`, `evaluate`,
`health`, `stats`, `close` and `processes` with `.remote(...)` like an actor handle, routed to
its session in the host, so the rollouter, the evaluator and the benchmarks cannot tell the
difference. A host that dies takes its sessions' episodes with it (each ABORTED and retried,
as for a dead session actor); Ray restarts it with all its sessions.

`start_sessions` is where a run gets its sessions: one EnvSession actor each, or hosted here
(`env.sessions_per_actor > 1`). This module sits above `actors.env_session`, which never
imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ray

from actors.env_session import EnvSession, session_options, start_session
from dart_ray.config import EnvConfig

METHODS = frozenset({"reset", "step", "evaluate", "health", "stats", "close", "processes"})
SPARE_THREADS = 4
"""Threads beyond one per session: health probes and statistics never wait for an episode."""


class EnvHost:
    """Holds several EnvSessions; plain class, made a Ray actor by `start_hosts`."""

    def __init__(self, config: EnvConfig, names: list[str]) -> None:
        self.sessions = [EnvSession(config, name) for name in names]

    def call(self, index: int, method: str, *args: Any) -> Any:
        """`method(*args)` of session `index` (one of METHODS)."""
        if method not in METHODS:
            raise ValueError(
                f"EnvHost.call: {method!r} is not a session method ({sorted(METHODS)})"
            )
        return getattr(self.sessions[index], method)(*args)

    def size(self) -> int:
        return len(self.sessions)


@dataclass(frozen=True)
class _Method:
    host: Any
    index: int
    method: str

    def remote(self, *args: Any) -> Any:
        return self.host.call.remote(self.index, self.method, *args)


@dataclass(frozen=True)
class HostedSession:
    """One session inside an EnvHost, used like an EnvSession actor handle."""

    host: Any
    """The EnvHost actor handle."""
    index: int
    name: str
    host_name: str

    def __getattr__(self, method: str) -> _Method:
        if method not in METHODS:
            raise AttributeError(method)
        return _Method(self.host, self.index, method)


def address(s: HostedSession) -> str:
    """`<host actor name>#<index>#<session name>`: what a restartable actor is given instead of
    the handle (a handle among its constructor arguments makes Ray log an error, ray#53727)."""
    return f"{s.host_name}#{s.index}#{s.name}"


def resolve_session(ref: str | Any) -> Any:
    """A session handle from an actor name, an `address`, or a handle (returned as is)."""
    if not isinstance(ref, str):
        return ref
    if "#" not in ref:
        return ray.get_actor(ref)
    host, index, name = ref.split("#", 2)
    return HostedSession(ray.get_actor(host), int(index), name, host)


def host_count(config: EnvConfig, sessions: int | None = None) -> int:
    n = config.num_sessions if sessions is None else sessions
    return math.ceil(n / config.sessions_per_actor)


def start_hosts(config: EnvConfig, names: list[str], prefix: str) -> list[HostedSession]:
    """EnvHost actors named `<prefix>-host-<j>` holding the sessions `names`, in order."""
    k = config.sessions_per_actor
    out: list[HostedSession] = []
    for j in range(host_count(config, len(names))):
        chunk = names[j * k : (j + 1) * k]
        opts = session_options(config)
        opts.update(name=f"{prefix}-host-{j}", max_concurrency=len(chunk) + SPARE_THREADS)
        host = ray.remote(EnvHost).options(**opts).remote(config, chunk)
        out += [HostedSession(host, i, name, opts["name"]) for i, name in enumerate(chunk)]
    return out


def actors_of(sessions: list[Any]) -> list[Any]:
    """The actors behind `sessions` (each host once), for killing them at the end."""
    out: dict[Any, None] = {}
    for s in sessions:
        out[s.host if isinstance(s, HostedSession) else s] = None
    return list(out)


def session_names(config: EnvConfig, prefix: str = "env") -> list[str]:
    """The names of the sessions `start_sessions(config, prefix)` starts."""
    return [f"{prefix}-{i}" for i in range(config.num_sessions)]


def start_sessions(config: EnvConfig, prefix: str = "env") -> list[Any]:
    """`config.num_sessions` sessions named `<prefix>-0`, `<prefix>-1`, ...: an actor each, or
    `env.sessions_per_actor` to an EnvHost actor (actors.env_host)."""
    names = session_names(config, prefix)
    if config.sessions_per_actor > 1:
        return start_hosts(config, names, prefix)
    return [start_session(config, name) for name in names]
