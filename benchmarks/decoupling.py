"""Decoupled against synchronous training, in one process, on the same parts and latencies.

DART-GUI's claim is that decoupling rollout from training keeps slow GUI environments busy:
5.5x the environment utilisation and 1.9x the training throughput of a synchronous pipeline
(REFERENCE.md). This script runs `dart_ray.driver.train` twice with one config that differs
only in `run.mode` (decoupled, then sync), each for the same wall-clock budget
(`run.max_minutes`; `run.max_versions` is set out of reach so the budget ends the run), on
`LatencyMiniDesk`: MiniDesk whose resets and steps sleep for OSWorld-shaped, heavy-tailed
latencies (lognormal; see `dart_ray/envs/latency.py`), scaled by `--scale` so that a run of a
few minutes still sees many episodes. The latency streams are seeded per session index, so
both modes draw from the same streams.

Reported per mode, and as ratios decoupled / sync next to DART-GUI's:

- environment utilisation: session-seconds inside episodes (reset, policy calls, steps,
  evaluation) over sessions x the run's wall time. The driver's own figure
  (`RunReport.env_utilisation`) divides by the time since the rollouters first started
  (the waits between synchronous iterations included), so the two differ only by the
  start-up before the first episode. The sessions' own busy fraction (time inside env calls only, `EnvSession.stats()`) is
  shown too;
- trainer utilisation (`RunReport.trainer_utilisation`: optimizer-step and weight-sync time
  over wall time);
- trajectories per minute (every trajectory logged, any status) and samples trained per
  minute (step samples that went through an optimizer step);
- versions published.

Between the runs Serve and Ray are shut down, so the second run starts on a fresh local Ray
(the latency variables are set in this process before either run starts Ray, and Ray's
workers inherit them). The rollouter and session statistics are read just before the driver
tears the parts down (a wrapper around `runtime.stop`). The defaults are shaped like
DART-GUI's setting: a pool of 32 sessions, a training step (and the synchronous batch) of
8 tasks x 4 rollouts, episodes truncated after 6 steps, resets "seconds to a minute"
(median 10 s, sigma 1.0: p5 1.9 s, p95 52 s) and steps of 1-5 s, all scaled by `--scale`.
Both modes save durably every version. A watchdog stops a run that outlives its budget by
`--grace` seconds, and no verdict is given when it had to. Prints a table and the command,
writes JSON to benchmarks/results/decoupling.json.

    .venv/bin/python benchmarks/decoupling.py --minutes 4 --scale 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import serve
from rich.console import Console
from rich.table import Table

from dart_ray import driver, runtime
from dart_ray.config import Config, load_config
from dart_ray.envs.latency import LatencyProfile
from dart_ray.envs.minidesk.generate import TASKS_DIR

REPO_ROOT = Path(__file__).resolve().parents[1]
LATENCY_KIND = "dart_ray.envs.latency:LatencyMiniDesk"
DART_GUI = {"env_utilisation_ratio": 5.5, "training_throughput_ratio": 1.9}
TARGETS = {"env_utilisation_ratio": 8.0, "env_utilisation_abs": 0.90, "samples_ratio": 2.5}
console = Console(width=None if sys.stdout.isatty() else 160)


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
    progress: list[dict[str, float]] = field(default_factory=list)

    def read(self, parts: runtime.Parts) -> None:
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


@contextmanager
def probing(probe: Probe) -> Iterator[None]:
    """Read the parts' statistics just before the driver stops them."""
    original = runtime.stop

    def stop(parts: runtime.Parts) -> None:
        try:
            probe.read(parts)
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
            console.log(f"watchdog could not stop {name}: {e}")
            return
        fired["at_s"] = time.monotonic() - t0
        console.log(f"[red]watchdog stopped {cfg.run.run_id} at {fired['at_s']:.0f} s[/]")

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
        console.log(f"{parts.config.run.mode}: {row['t_s']:.0f} s, {logged} trajectories, "
                    f"{len(history)} train steps")  # fmt: skip

    return tick


def make_config(args: argparse.Namespace, mode: str, index: int, root: Path) -> Config:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    overrides = [
        f"run.mode={mode}",
        f'run.run_id="decoupling-{mode}-{stamp}"',
        f'run.root_dir="{root / mode}"',
        f"run.max_minutes={args.minutes}",
        "run.max_versions=100000",  # out of reach: the wall-clock budget ends the run
        "run.eval_tasks=0",  # held-out evaluation is not what is measured here
        f'env.kind="{LATENCY_KIND}"',
        f'env.tasks="{TASKS_DIR / "train.jsonl"}"',
        f'env.heldout_tasks="{TASKS_DIR / "heldout.jsonl"}"',
        f"env.num_sessions={args.sessions}",
        "env.num_cpus=0.01",  # the sessions sleep through their latencies: 32 fit in 2 cores
        f"rollout.in_flight={args.sessions}",
        f'policy.model_path="{REPO_ROOT / "fixtures" / "tiny-sft"}"',
        f"policy.http_port={args.port + index}",
        # A synchronous batch the size of DART-GUI's (tasks x rollouts over the whole pool):
        # `groups_per_step` groups of `n_rollouts`, one episode per session.
        f"rollout.n_rollouts={args.rollouts}",
        f"curation.groups_per_step={args.groups}",
        f"rollout.max_steps={args.max_steps}",
        "train.save_every=1",
        *args.set,
    ]
    return load_config(args.config, overrides)


def run_mode(args: argparse.Namespace, mode: str, index: int, root: Path) -> dict[str, Any]:
    cfg = make_config(args, mode, index, root)
    probe = Probe()
    console.rule(f"{mode}: {args.minutes} min budget")
    t0 = time.monotonic()
    try:
        with probing(probe), watchdog(cfg, args.grace) as fired:
            report = driver.train(cfg, on_tick=ticker(probe, t0))
    finally:
        serve.shutdown()
        ray.shutdown()  # the next mode starts on a fresh local Ray
    wall = report.wall_s
    minutes = wall / 60
    trajectories = sum(report.trajectories.values())
    return {
        "mode": mode,
        "wall_s": wall,
        "process_s": time.monotonic() - t0,
        "env_utilisation": probe.episode_s / (probe.sessions * wall) if probe.sessions else 0.0,
        "env_utilisation_driver": report.env_utilisation,
        "env_busy_in_calls": probe.session_busy_s / probe.session_alive_s
        if probe.session_alive_s
        else 0.0,
        "trainer_utilisation": report.trainer_utilisation,
        "trajectories": trajectories,
        "trajectories_per_min": trajectories / minutes,
        "samples_trained": report.samples_trained,
        "samples_per_min": report.samples_trained / minutes,
        "train_steps": report.train_steps,
        "versions": report.versions,
        "sync_latency_mean_s": report.sync_latency_mean_s,
        "dropped": report.dropped,
        "watchdog_fired_at_s": fired.get("at_s"),
        "probe": asdict(probe),
        "report": report.to_json(),
    }


def ratios(d: dict[str, Any], s: dict[str, Any]) -> dict[str, float | None]:
    def r(key: str) -> float | None:
        return d[key] / s[key] if s[key] else None

    return {
        "env_utilisation": r("env_utilisation"),
        "env_utilisation_driver": r("env_utilisation_driver"),
        "trainer_utilisation": r("trainer_utilisation"),
        "trajectories_per_min": r("trajectories_per_min"),
        "samples_per_min": r("samples_per_min"),
        "versions": r("versions"),
    }


def render(results: dict[str, Any]) -> None:
    runs = {m["mode"]: m for m in results["modes"]}
    d, s = runs.get("decoupled"), runs.get("sync")
    rt = results.get("ratios", {})
    t = Table(title=f"decoupled vs sync, {results['args']['minutes']} min each, "
                    f"latency scale {results['args']['scale']}")  # fmt: skip
    for c in ("metric", "decoupled", "sync", "decoupled / sync", "DART-GUI", "target"):
        t.add_column(c, justify="left" if c == "metric" else "right")

    def pct(v: float) -> str:
        return f"{v:.1%}"

    def num(v: float) -> str:
        return f"{v:.1f}"

    rows: list[tuple[str, str, Callable[[float], str], str, str]] = [
        ("environment utilisation (whole run)", "env_utilisation", pct, "5.5x",
         ">= 8x, >= 90%"),
        ("environment utilisation (driver's figure)", "env_utilisation_driver", pct, "", ""),
        ("env busy inside reset/step calls", "env_busy_in_calls", pct, "", ""),
        ("trainer utilisation", "trainer_utilisation", pct, "", ""),
        ("trajectories / min", "trajectories_per_min", num, "", ""),
        ("samples trained / min", "samples_per_min", num, "1.9x", ">= 2.5x"),
        ("versions published", "versions", lambda v: f"{v:.0f}", "", ""),
        ("train steps", "train_steps", lambda v: f"{v:.0f}", "", ""),
        ("wall time, s", "wall_s", lambda v: f"{v:.0f}", "", ""),
    ]  # fmt: skip
    ratio_key = {"env_utilisation_driver": "env_utilisation_driver"}
    for label, key, fmt, ref, target in rows:
        rk = ratio_key.get(key, key)
        ratio = "" if rk not in rt else "-" if rt[rk] is None else f"{rt[rk]:.2f}x"
        t.add_row(label, fmt(d[key]) if d else "-", fmt(s[key]) if s else "-", ratio, ref, target)
    console.print(t)
    if "verdict" in results:
        for k, v in results["verdict"].items():
            console.print(
                f"  {k}" if k.startswith("no verdict") else f"  {k}: {'met' if v else 'NOT met'}"
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=4.0, help="wall budget of each mode")
    p.add_argument("--scale", type=float, default=0.1, help="DART_LATENCY_SCALE")
    p.add_argument("--seed", type=int, default=0, help="DART_LATENCY_SEED")
    p.add_argument("--sessions", type=int, default=32, help="env sessions (and in flight)")
    p.add_argument("--groups", type=int, default=8, help="groups per train step (sync batch)")
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per group")
    p.add_argument("--max-steps", type=int, default=6, help="steps before truncation")
    p.add_argument("--reset-median", type=float, default=10.0, help="reset median, s at scale 1")
    p.add_argument("--reset-sigma", type=float, default=1.0, help="reset lognormal sigma")
    p.add_argument("--modes", default="decoupled,sync")
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "tiny-cpu.toml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override, applied to both modes")  # fmt: skip
    p.add_argument("--grace", type=float, default=120.0, help="watchdog: seconds past budget")
    p.add_argument("--port", type=int, default=8240, help="policy HTTP port of the first mode")
    p.add_argument("--root", type=Path, default=None, help="run folders (default: a temp dir)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/decoupling.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(sys.orig_argv)
    console.print(f"[bold]command:[/] {command}")
    # Before any ray.init: the EnvSession actors' processes inherit these.
    os.environ["DART_LATENCY_SCALE"] = str(args.scale)
    os.environ["DART_LATENCY_SEED"] = str(args.seed)
    os.environ["DART_LATENCY_RESET_MEDIAN"] = str(args.reset_median)
    os.environ["DART_LATENCY_RESET_SIGMA"] = str(args.reset_sigma)
    profile = LatencyProfile.from_env()
    root = args.root or Path(tempfile.mkdtemp(prefix="dart-ray-decoupling-"))
    t0 = time.perf_counter()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, Any] = {
        "command": command,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}",
        "latency": {
            "profile": asdict(profile),
            "reset_p5_p50_p95_s": [
                profile.reset.quantile(q, profile.scale) for q in (0.05, 0.5, 0.95)
            ],
            "step_p5_p50_p95_s": [
                profile.step.quantile(q, profile.scale) for q in (0.05, 0.5, 0.95)
            ],
        },
        "env_utilisation_definition": "session-seconds inside episodes / "
        "(sessions x run wall time), run wall time = RunReport.wall_s",
        "modes": [run_mode(args, m, i, root) for i, m in enumerate(modes)],
        "dart_gui": DART_GUI,
        "targets": TARGETS,
    }
    runs = {m["mode"]: m for m in results["modes"]}
    if {"decoupled", "sync"} <= set(runs):
        rt = ratios(runs["decoupled"], runs["sync"])
        results["ratios"] = rt
        if any(m["watchdog_fired_at_s"] is not None for m in results["modes"]):
            results["verdict"] = {"no verdict: the watchdog had to stop a run": False}
        else:
            results["verdict"] = {
                "env utilisation ratio >= 8x": (rt["env_utilisation"] or 0)
                >= TARGETS["env_utilisation_ratio"],
                "decoupled env utilisation >= 90%": runs["decoupled"]["env_utilisation"]
                >= TARGETS["env_utilisation_abs"],
                "samples/min ratio >= 2.5x": (rt["samples_per_min"] or 0)
                >= TARGETS["samples_ratio"],
            }
    results["total_runtime_s"] = time.perf_counter() - t0
    results["machine"] += f" -> {os.getloadavg()}"
    render(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    console.print(f"wrote {args.out}; total {results['total_runtime_s']:.0f} s; runs in {root}")
    console.print(f"[bold]command:[/] {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
