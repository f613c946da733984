"""OSWorld's evaluator, one per node: a Ray actor holding a few worker processes that set up
and score the tasks of every session on its node (`env.desktop.evaluator_workers`).

Each worker is a Python of `.venv-osworld` with OSWorld's `desktop-env` loaded (~350 MB); a
worker per session made a node of 16 sessions hold 16 of them, mostly idle (a task is set up
once and scored once per episode of minutes). The host is found by name, `osworld-evaluator-
<node>-<config>`, created by the first session of its node that needs it
(`get_if_exists`), pinned to that node (the worker reaches the desktop's server as the session
does, and reads the node's cache folder).

Lifetime: the host is owned by the session that created it, so it ends with the run (which
kills its sessions) and never outlives a job. If that session's process dies first, the host
goes with it: an evaluation in flight then fails as a crashed environment (the episode is
retried, never scored) and the next call starts a new host.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dart_ray.config import DesktopOptions
from dart_ray.envs.base import EnvInputError
from dart_ray.envs.osworld.official import EvaluatorPool, OSWorldWorkerCrashed
from dart_ray.records import Task

PREFIX = "osworld-evaluator"
TIMEOUT_S = 300.0
"""A worker's own deadline for one set-up or evaluation (OSWorldEvaluator's)."""


class OSWorldEvaluatorHost:
    """The pool of a node, called from its sessions' threads (a threaded actor: a call waits
    for a free worker without holding up the others)."""

    def __init__(self, options: DesktopOptions) -> None:
        self.pool = EvaluatorPool(
            options.osworld_venv,
            options.evaluator_workers,
            options.osworld_cache_dir,
            TIMEOUT_S,
            options.chromium_port,
        )

    def cache(self) -> str:
        return str(self.pool.cache)

    def evaluate(self, *args: Any) -> float:
        return self.pool.evaluate(*args)

    def setup(self, *args: Any) -> None:
        self.pool.setup(*args)

    def pids(self) -> list[int]:
        """The pool's worker processes, then this actor's own."""
        return [*self.pool.pids(), os.getpid()]


def host_name(options: DesktopOptions, node_id: str) -> str:
    """One host per node and per evaluator set-up (venv, workers, cache, DevTools port): two
    runs of different set-ups never share one."""
    key = repr(
        (
            str(options.osworld_venv.absolute()),
            options.evaluator_workers,
            str(options.osworld_cache_dir),
            options.chromium_port,
        )
    )
    return f"{PREFIX}-{node_id[:12]}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


class NodeEvaluator:
    """What OSWorldEnv calls (the methods of OSWorldEvaluator), answered by its node's host.
    Errors arrive as the pool raised them; a host that died is an OSWorldWorkerCrashed (the
    episode is retried) and is looked up afresh on the next call."""

    def __init__(self, options: DesktopOptions) -> None:
        self.options = options
        self._host: Any = None
        self.cache = Path(self._call("cache"))

    def host(self) -> Any:
        if self._host is None:
            node = ray.get_runtime_context().get_node_id()
            self._host = (
                ray.remote(OSWorldEvaluatorHost)
                .options(
                    name=host_name(self.options, node),
                    get_if_exists=True,
                    num_cpus=0,  # its workers run while the sessions wait on them
                    max_concurrency=1000,  # every session of the node may call at once
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                )
                .remote(self.options)
            )
        return self._host

    def _call(self, method: str, *args: Any, task_id: str = "-") -> Any:
        try:
            # a set-up may wait for a free worker, then take the worker's whole deadline
            return ray.get(getattr(self.host(), method).remote(*args), timeout=3 * TIMEOUT_S)
        except RayTaskError as e:  # the pool's own error: the task's fault or a crash
            if isinstance(e.cause, EnvInputError | OSWorldWorkerCrashed):
                raise e.cause from None
            raise
        except (RayActorError, GetTimeoutError) as e:
            self._host = None
            raise OSWorldWorkerCrashed(
                f"task {task_id}: the node's OSWorld evaluator was lost: {e}"
            ) from None

    def evaluate(
        self,
        task: Task,
        server_url: str,
        token: str | None,
        last_action: str | None,
        screen: tuple[int, int] = (1920, 1080),
    ) -> float:
        args = (task, server_url, token, last_action, screen)
        return float(self._call("evaluate", *args, task_id=task.task_id))

    def setup(
        self,
        task: Task,
        steps: list[Any],
        server_url: str,
        token: str | None,
        screen: tuple[int, int] = (1920, 1080),
        client_password: str = "",
    ) -> None:
        args = (task, steps, server_url, token, screen, client_password)
        self._call("setup", *args, task_id=task.task_id)

    def pids(self) -> list[int]:
        """The processes that hold the node's evaluator: its workers, then the host."""
        return list(self._call("pids"))

    def close(self) -> None:
        """Nothing to stop: the host serves the node's other sessions."""
