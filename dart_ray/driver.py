"""`dart-ray train`: set the parts up, run the loop, report.

Decoupled (DART): the rollouter runs without pause while the trainer trains on whatever the
curator has ready; neither waits for the other. Synchronous (the baseline): roll out one
step's worth of groups, wait until the trainer has trained on them and published the new
version, repeat; every part waits for the slowest. Same parts, same code, one switch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ray

from dart_ray import runtime
from dart_ray.config import Config
from dart_ray.report import RunReport, build_report


def _fit_in_background(parts: runtime.Parts, errors: list[BaseException]) -> threading.Thread:
    def fit() -> None:
        try:
            parts.trainer().fit()
        except BaseException as e:  # re-raised by the driver after the loop
            errors.append(e)

    t = threading.Thread(target=fit, name="trainer", daemon=True)
    t.start()
    return t


def _policy_version(parts: runtime.Parts) -> int:
    return int(parts.policy.version.remote().result())


def _sync_iteration(parts: runtime.Parts, trainer: threading.Thread, deadline: float) -> None:
    """Roll out one step's groups, then wait until the trainer has published a new version,
    or until nothing more can train without more rollouts (every group was dropped, or the
    curator holds fewer trainable groups than a step needs), or the budget runs out."""
    v = _policy_version(parts)
    groups = parts.config.curation.groups_per_step
    ray.get([r.run.remote(max_groups=groups) for r in parts.rollouters])
    while trainer.is_alive() and _policy_version(parts) == v and time.monotonic() < deadline:
        buffer = parts.store.log.buffer(parts.run_id)
        available = sum(n for (_, state), n in buffer.items() if state == 0)
        m = ray.get(parts.curator.metrics.remote())
        trained = len(ray.get(parts.control.history.remote()))
        if available == 0 and m["queue_depth"] == 0 and m["steps_handed"] <= trained:
            return  # no step is forming or training: roll out more
        time.sleep(0.5)


def train(config: Config, on_tick: Callable[[runtime.Parts], None] | None = None) -> RunReport:
    parts = runtime.start(config)
    t0 = time.monotonic()
    before = parts.evaluate(config.run.eval_tasks)
    errors: list[BaseException] = []
    trainer = _fit_in_background(parts, errors)
    rollouts = []
    if config.run.mode == "decoupled":
        rollouts = [r.run.remote() for r in parts.rollouters]
    deadline = t0 + 60 * config.run.max_minutes
    while trainer.is_alive():
        if time.monotonic() > deadline:
            ray.get(parts.control.request_stop.remote("run.max_minutes reached"))
        if config.run.mode == "sync" and time.monotonic() < deadline:
            _sync_iteration(parts, trainer, deadline)
        else:
            trainer.join(timeout=1.0)
        if on_tick is not None:
            on_tick(parts)
    ray.get([r.stop.remote() for r in parts.rollouters])
    ray.get(rollouts)
    if errors:
        runtime.stop(parts)
        raise errors[0]
    after = parts.evaluate(config.run.eval_tasks)
    report = build_report(parts, before, after, time.monotonic() - t0)
    runtime.stop(parts)
    return report
