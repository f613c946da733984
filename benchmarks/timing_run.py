"""The run plumbing the timing-mode benchmarks share (`decoupling.py`, `scale.py`).

`add_run_args` gives both their common options (the config and its overrides, the scale, the
port and run folders); `Probe` reads what the parts know just before the driver stops them,
hooked in by `before_stop`; `watchdog` stops a run that outlives its budget; `ticker` prints
progress while it runs.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import ray
from harness import REPO_ROOT, console

from dart_ray.config import Config
from dart_ray.run import runtime


def add_run_args(p: argparse.ArgumentParser, *, scale: float, port: int) -> None:
    """The options of a timing-mode benchmark besides its budget: the config and its
    overrides, timing.scale, the policy port of its first run and the run folders."""
    p.add_argument("--scale", type=float, default=scale, help="timing.scale")
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs/timing-osworld-7b.toml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override, applied to every run")  # fmt: skip
    p.add_argument("--port", type=int, default=port, help="policy HTTP port of the first run")
    p.add_argument("--root", type=Path, default=None, help="run folders (default: a temp dir)")


def run_root(args: argparse.Namespace, name: str) -> Path:
    """`--root`, or a new temporary folder for the runs' files."""
    return args.root or Path(tempfile.mkdtemp(prefix=f"dart-ray-{name}-"))


@dataclass
class Probe:
    """What the parts know at the end of a run, read before `runtime.stop` kills them."""

    episode_s: float = 0.0
    rollouter_wall_s: float = 0.0
    sessions: int = 0
    episodes_started: int = 0
    session_busy_s: float = 0.0
    session_alive_s: float = 0.0
    session_resets: int = 0
    session_steps: int = 0
    session_aborted: int = 0
    staleness_max: int = 0
    """Most versions a trained sample was behind the weights that trained it."""
    steps: list[tuple[float, float]] = field(default_factory=list)
    """(unix end time, samples) of each train step, in order."""
    progress: list[dict[str, float]] = field(default_factory=list)

    def read(self, parts: runtime.Parts) -> None:
        history = ray.get(parts.control.history.remote())
        self.staleness_max = trained_staleness(history, parts.start.version)
        self.steps = [(h["t_end"], h.get("samples", 0.0)) for h in history if "t_end" in h]
        for s in ray.get([r.stats.remote() for r in parts.rollouters]):
            self.episode_s += s.episode_s
            self.rollouter_wall_s = max(self.rollouter_wall_s, s.wall_s)
            self.sessions += s.sessions
            self.episodes_started += s.started
        for st in ray.get([s.stats.remote() for s in parts.sessions]):
            self.session_busy_s += st.busy_s
            self.session_alive_s += st.alive_s
            self.session_resets += st.resets
            self.session_steps += st.steps
            self.session_aborted += st.aborted


def trained_staleness(history: list[dict[str, float]], start_version: int) -> int:
    """The largest (weights' version - sample's version) over every train step: a step
    trains the weights of the version published before it (the previous step's `version`)."""
    worst, held = 0, start_version
    for h in history:
        if "sample_version_min" in h:
            worst = max(worst, held - int(h["sample_version_min"]))
        held = int(h.get("version", held))
    return worst


@contextmanager
def before_stop(read: Callable[[runtime.Parts], None]) -> Iterator[None]:
    """Call `read(parts)` just before the driver stops the parts (`runtime.stop`), while they
    still answer: `before_stop(probe.read)`. Nested, the inner one reads first."""
    original = runtime.stop

    def stop(parts: runtime.Parts) -> None:
        try:
            read(parts)
        finally:
            original(parts)

    runtime.stop = stop  # type: ignore[assignment]
    try:
        yield
    finally:
        runtime.stop = original  # type: ignore[assignment]


@contextmanager
def watchdog(cfg: Config, grace_s: float) -> Iterator[dict[str, float]]:
    """Stop the run through its RunControl if it outlives its budget by `grace_s`.

    The driver checks `run.max_minutes` between iterations only; a synchronous iteration that
    never ends (see docs/BENCHMARKS.md) would otherwise hang the benchmark. Records when it
    fired, so that a result it shaped is visible in the JSON."""
    fired: dict[str, float] = {}
    done = threading.Event()
    t0 = time.monotonic()

    def watch() -> None:
        if done.wait(60 * cfg.run.max_minutes + grace_s):
            return
        name = f"control:{cfg.run.run_id}"
        try:
            control = ray.get_actor(name, namespace=cfg.cluster.namespace)
            ray.get(control.request_stop.remote("benchmark watchdog: budget + grace exceeded"))
        except (ValueError, ray.exceptions.RayError) as e:
            console().log(f"watchdog could not stop {name}: {e}")
            return
        fired["at_s"] = time.monotonic() - t0
        console().log(f"[red]watchdog stopped {cfg.run.run_id} at {fired['at_s']:.0f} s[/]")

    thread = threading.Thread(target=watch, name="watchdog", daemon=True)
    thread.start()
    try:
        yield fired
    finally:
        done.set()


def ticker(probe: Probe, t0: float, every_s: float = 30.0) -> Callable[[runtime.Parts], None]:
    """An `on_tick` that prints a progress line every `every_s` seconds."""
    last = [t0]

    def tick(parts: runtime.Parts) -> None:
        now = time.monotonic()
        if now - last[0] < every_s:
            return
        last[0] = now
        history = ray.get(parts.control.history.remote())
        logged = sum(
            sum(s.logged.values()) for s in ray.get([r.stats.remote() for r in parts.rollouters])
        )
        row = {"t_s": now - t0, "train_steps": len(history), "trajectories": logged}
        probe.progress.append(row)
        console().log(f"{parts.config.run.mode}: {row['t_s']:.0f} s, {logged} trajectories, "
                    f"{len(history)} train steps")  # fmt: skip

    return tick
