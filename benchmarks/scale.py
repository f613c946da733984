"""How many sessions one machine's control plane carries: the timing mode at 64, 256, 1,024.

GUI RL peers run 1,000+ environments. Their desktops live on other machines; what must scale
on the head node is the control plane: the rollouter that drives every episode, the policy
server's request path, the session actors, the durable log and the curator. This benchmark
runs the decoupled timing mode (configs/timing-osworld-7b.toml: every part real, compute
replaced by the latencies of UI-TARS-1.5-7B on H100s and OSWorld desktops) with N sessions,
N in `--sessions`, and the modelled hardware grown with N (N / 8 simulated rollout GPUs, the
trainer's throughput x N / 64: what a cluster for N desktops would have), `--minutes` each, at
`--scale` (1.0: real time, so the head node sees the request rates of the real regime).

For each N, over the window after `--warmup` seconds (when every session has started):

- **per part**: CPU cores used (user + system time of its processes over the window) and
  resident memory, grouped by Ray actor class (`ray::Rollouter`, `ray::EnvHost`, the Serve
  replica, ...) and the Ray processes (raylet, GCS, dashboard) and the driver;
- **rates**: environment steps/s, policy requests/s (one per step), trajectories/s logged,
  step samples/s logged; and per session: steps per session-minute, the figure that stays
  flat while the control plane keeps up and falls where it saturates (reported as a ratio
  to the smallest N's, measured in the same run);
- **actors** alive, and the environment utilisation;

The window closes before the run's budget ends, so the wind-down (episodes in flight
finishing while none start) is not measured;
- **saturation**: a part whose one Python process uses >= 0.85 of a core (it cannot use more),
  or the machine's cores all in use;
- **host memory per session** (issue 32): each part's resident memory (RSS, summed over its
  processes) sampled at every driver tick through the window (mean and peak) and its unique
  memory (USS: what killing it would free, the object store's shared pages out) at the end,
  for the components that hold a session's screenshots: the EnvHosts, the rollouter (each
  episode's steps), the curator and the policy replica (its request queue: every queued
  request carries the prompt's `policy.history_images` screenshots). Per session: RSS / N,
  and the marginal MB per session between successive N (the slope, which leaves out each
  process's fixed cost). Screenshots are the screen's PNGs (`--screen`, MiniDesk's drawing);
  their mean size is measured and reported, since real desktops' PNGs are larger.

Prints a table per N and a summary, writes JSON to benchmarks/results/scale.json. SIMULATED.

    .venv/bin/python benchmarks/scale.py --sessions 64,256,1024 --minutes 3
    .venv/bin/python benchmarks/scale.py --sessions 64 --screen 1920x1080 --minutes 1   # memory
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import ray
from harness import Bench, console, parser, stop_ray, table
from ray.util.state import list_actors
from timing_run import Probe, add_run_args, before_stop, run_root

from dart_ray.config import Config, load_config
from dart_ray.run import driver, runtime

SATURATED = 0.85
"""Cores one Python process can use, near enough: a part at this share of a core is the wall."""


def part_of(p: psutil.Process) -> str | None:
    """The group a process belongs to (None: not part of the run)."""
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if p.pid == os.getpid():
        return "driver"
    if m := re.match(r"ray::([A-Za-z_]+)(?::([^: ]+))?", cmd):
        name = m.group(1)
        return "ray::ServeReplica (policy)" if name == "ServeReplica" else f"ray::{name}"
    for key in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py"):
        if key in cmd:
            return f"ray {key}"
    return None


@dataclass
class Snapshot:
    t: float
    cpu: dict[int, tuple[str, float]] = field(default_factory=dict)
    """pid -> (part, user + system seconds)."""
    rss: dict[str, float] = field(default_factory=dict)
    """part -> resident bytes."""
    processes: dict[str, int] = field(default_factory=dict)


def ours() -> list[psutil.Process]:
    """This process and its descendants: the local Ray it started (GCS, raylet, workers), not
    another run's processes on a shared machine."""
    me = psutil.Process()
    try:
        return [me, *me.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return [me]


def snapshot() -> Snapshot:
    s = Snapshot(time.monotonic())
    rss: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for p in ours():
        part = part_of(p)
        if part is None:
            continue
        try:
            t = p.cpu_times()
            s.cpu[p.pid] = (part, t.user + t.system)
            rss[part] += p.memory_info().rss
            count[part] += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    s.rss, s.processes = dict(rss), dict(count)
    return s


MEMORY_PARTS = ("ray::EnvHost", "ray::Rollouter", "ray::Curator", "ray::ServeReplica (policy)")
"""The parts that hold a session's screenshots, whose memory per session is reported."""


def uss() -> dict[str, float]:
    """part -> unique bytes of its processes (USS: private pages, the object store's out)."""
    out: dict[str, float] = defaultdict(float)
    for p in ours():
        part = part_of(p)
        if part is None:
            continue
        try:
            out[part] += p.memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return dict(out)


def screenshot_bytes(width: int, height: int, n: int = 8) -> float:
    """Mean PNG bytes of MiniDesk's first screen of `n` training tasks at `width`x`height`:
    what one screenshot in a prompt, a step and a request weighs in this run."""
    from dart_ray.config import EnvConfig
    from dart_ray.envs.minidesk.env import MiniDeskEnv
    from dart_ray.envs.minidesk.generate import load_tasks

    env = MiniDeskEnv(EnvConfig(screen_width=width, screen_height=height))
    tasks = load_tasks(split="train")[:n]
    return sum(len(env.reset(t).screenshot) for t in tasks) / max(1, len(tasks))


def cores(a: Snapshot, b: Snapshot) -> dict[str, dict[str, float]]:
    """Per part: cores used between the snapshots, and its busiest process's share."""
    window = b.t - a.t
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"cores": 0.0, "busiest": 0.0})
    for pid, (part, cpu) in b.cpu.items():
        before = a.cpu.get(pid, (part, 0.0))[1]
        used = max(0.0, cpu - before) / window
        out[part]["cores"] += used
        out[part]["busiest"] = max(out[part]["busiest"], used)
    return dict(out)


@dataclass
class Window:
    """Snapshots and counters at the start and end of the measured window."""

    warmup_s: float
    start: Snapshot | None = None
    end: Snapshot | None = None
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    rss: list[dict[str, float]] = field(default_factory=list)
    """Each part's RSS at every tick inside the window."""
    uss: dict[str, float] = field(default_factory=dict)
    """Each part's USS when the window closed."""

    def count(self, parts: runtime.Parts) -> dict[str, float]:
        stats = ray.get([s.stats.remote() for s in parts.sessions])
        rollouts = ray.get([r.stats.remote() for r in parts.rollouters])
        return {
            "t": time.monotonic(),
            "steps": float(sum(s.steps for s in stats)),
            "resets": float(sum(s.resets for s in stats)),
            "trajectories": float(sum(sum(r.logged.values()) for r in rollouts)),
            "episode_s": float(sum(r.episode_s for r in rollouts)),
        }

    window_s: float = 180.0

    def tick(self, parts: runtime.Parts, t0: float) -> None:
        """Open the window after the warm-up, close it `window_s` later: while every session
        is still driven (the run's wind-down, when episodes finish and none start, is out)."""
        now = time.monotonic() - t0
        if self.start is None and now >= self.warmup_s:
            self.counters["start"] = self.count(parts)
            self.start = snapshot()
            console().log(f"{len(parts.sessions)} sessions: measuring from here")
        elif self.start is not None and self.end is None and now < self.warmup_s + self.window_s:
            self.rss.append(snapshot().rss)
        elif self.start is not None and self.end is None and now >= self.warmup_s + self.window_s:
            self.close(parts)
            console().log(f"{len(parts.sessions)} sessions: window closed")

    def close(self, parts: runtime.Parts) -> None:
        if self.start is not None and self.end is None:
            self.counters["end"] = self.count(parts)
            self.end = snapshot()
            self.uss = uss()


def make_config(args: argparse.Namespace, n: int, root: Path, index: int) -> Config:
    gpus = max(1, n // 8)
    base = load_config(args.config, [])
    overrides = [
        "run.mode=decoupled",
        f'run.run_id="scale-{n}-{time.strftime("%Y%m%d-%H%M%S")}"',
        f'run.root_dir="{root / str(n)}"',
        f"run.max_minutes={args.minutes + args.warmup / 60 + 0.25}",
        "timing.enabled=true",
        f"timing.scale={args.scale}",
        f"timing.rollout_gpus={gpus}",
        f"timing.train_tokens_per_s={base.timing.train_tokens_per_s * n / 64}",
        f"env.num_sessions={n}",
        f"env.sessions_per_actor={args.per_actor}",
        f"rollout.in_flight={n}",
        # the control plane's throughput is measured, not training: with steps of 64 rows and
        # curation.max_staleness 2, at most ~96 rows can be in flight and still train, so
        # admission (rightly) idles most of 256 sessions; off, every session runs
        "rollout.admission=false",
        f"policy.max_ongoing_requests={max(256, 2 * n)}",
        f"policy.http_port={args.port + index}",
        *screen_overrides(args.screen),
        *args.set,
    ]
    return load_config(args.config, overrides)


def screen_overrides(screen: str | None) -> list[str]:
    if not screen:
        return []
    w, h = (int(x) for x in screen.lower().split("x"))
    return [f"env.screen_width={w}", f"env.screen_height={h}"]


def run_one(args: argparse.Namespace, n: int, root: Path, index: int) -> dict[str, Any]:
    cfg = make_config(args, n, root, index)
    win, probe = Window(args.warmup, window_s=60 * args.minutes), Probe()
    console().rule(f"{n} sessions (SIMULATED, timing.scale {args.scale})")
    t0 = time.monotonic()

    def close(parts: runtime.Parts) -> None:
        win.close(parts)
        alive = list_actors(filters=[("state", "=", "ALIVE")], limit=10_000)  # the API's most
        win.counters["actors"] = {"alive": float(len(alive))}

    try:
        with before_stop(close), before_stop(probe.read):
            report = driver.train(cfg, on_tick=lambda parts: win.tick(parts, t0))
    finally:
        stop_ray()
    if win.start is None or win.end is None:
        raise SystemExit(f"{n} sessions: the run ended before the window (raise --minutes)")
    a, b = win.counters["start"], win.counters["end"]
    window = b["t"] - a["t"]
    used = cores(win.start, win.end)
    steps_s = (b["steps"] - a["steps"]) / window
    total = sum(u["cores"] for u in used.values())
    saturated = [k for k, u in used.items() if u["busiest"] >= SATURATED]
    if total >= SATURATED * (os.cpu_count() or 1):
        saturated.append(f"the machine ({total:.2f} of {os.cpu_count()} cores)")
    return {
        "sessions": n,
        "window_s": window,
        "steps_per_s": steps_s,
        "policy_requests_per_s": steps_s,  # one generation per step
        "trajectories_per_s": (b["trajectories"] - a["trajectories"]) / window,
        "steps_per_session_minute": 60 * steps_s / n,
        "env_utilisation": (b["episode_s"] - a["episode_s"]) / (n * window),
        "actors_alive": int(win.counters["actors"]["alive"]),
        "cores_total": total,
        "parts": {
            k: {
                "cores": u["cores"],
                "busiest_process_cores": u["busiest"],
                "rss_mb": win.end.rss.get(k, 0.0) / 2**20,
                "processes": win.end.processes.get(k, 0),
            }
            for k, u in sorted(used.items(), key=lambda kv: -kv[1]["cores"])
        },
        "memory": memory(win, n),
        "saturated": saturated,
        "train_steps": report.train_steps,
        "trajectories": sum(report.trajectories.values()),
        "dropped": report.dropped,
    }


def memory(win: Window, n: int) -> dict[str, dict[str, float]]:
    """Per memory part: RSS mean and peak over the window's samples, USS at its end, MiB;
    and MiB per session of each."""
    assert win.end is not None
    samples = win.rss or [win.end.rss]
    out = {}
    for k in MEMORY_PARTS:
        xs = [r.get(k, 0.0) / 2**20 for r in samples]
        mean, peak, u = sum(xs) / len(xs), max(xs), win.uss.get(k, 0.0) / 2**20
        out[k] = {"rss_mb": mean, "rss_peak_mb": peak, "uss_mb": u, "samples": len(xs),
                  "processes": win.end.processes.get(k, 0), "rss_mb_per_session": mean / n,
                  "uss_mb_per_session": u / n}  # fmt: skip
    return out


def marginal(runs: list[dict[str, Any]]) -> None:
    """Add to each run after the first, per memory part, the MiB of RSS and of USS each session
    beyond the previous run's adds (the slope; each process's fixed cost cancels)."""
    for a, b in itertools.pairwise(runs):
        dn = b["sessions"] - a["sessions"]
        for k in MEMORY_PARTS:
            ma, mb = a["memory"][k], b["memory"][k]
            mb["rss_mb_per_added_session"] = (mb["rss_mb"] - ma["rss_mb"]) / dn if dn else 0.0
            mb["uss_mb_per_added_session"] = (mb["uss_mb"] - ma["uss_mb"]) / dn if dn else 0.0


def render_memory(results: dict[str, Any]) -> None:
    runs = results["runs"]
    t = table(f"SIMULATED: host memory by part, {results.get('screen')} screenshots "
              f"({results.get('screenshot_kb', 0):.0f} KB PNG each), "
              f"{results.get('history_images')} per prompt; MiB",
              ("sessions", "part", "processes", "RSS mean", "RSS peak", "USS", "RSS / session",
               "USS / session", "RSS / added session", "USS / added session"),
              left={"part"})  # fmt: skip
    for r in runs:
        for k, m in r["memory"].items():
            t.add_row(str(r["sessions"]), k, str(m["processes"]), f"{m['rss_mb']:.0f}",
                      f"{m['rss_peak_mb']:.0f}", f"{m['uss_mb']:.0f}",
                      f"{m['rss_mb_per_session']:.2f}", f"{m['uss_mb_per_session']:.2f}",
                      f"{m['rss_mb_per_added_session']:.3f}" if "rss_mb_per_added_session" in m else "-",
                      f"{m['uss_mb_per_added_session']:.3f}" if "uss_mb_per_added_session" in m else "-")  # fmt: skip
    console().print(t)


def render(results: dict[str, Any]) -> None:
    runs = results["runs"]
    base = runs[0]["steps_per_session_minute"] or 1.0
    t = table(f"SIMULATED: sessions one head node drives (timing.scale {results['args']['scale']})",
              ("sessions", "steps/s", "steps / session-min (vs first)", "traj/s", "env util",
               "actors", "cores", "env cores / 100 sessions", "env MB / session", "saturated"),
              left={"saturated"})  # fmt: skip
    for r in runs:
        env = r["parts"].get("ray::EnvHost") or r["parts"].get("ray::EnvSession") or {}
        t.add_row(
            str(r["sessions"]),
            f"{r['steps_per_s']:.1f}",
            f"{r['steps_per_session_minute']:.1f} ({r['steps_per_session_minute'] / base:.2f})",
            f"{r['trajectories_per_s']:.2f}",
            f"{r['env_utilisation']:.1%}",
            str(r["actors_alive"]),
            f"{r['cores_total']:.2f}",
            f"{100 * env.get('cores', 0.0) / r['sessions']:.3f}",
            f"{env.get('rss_mb', 0.0) / r['sessions']:.1f}",
            ", ".join(r["saturated"]) or "-",
        )
    console().print(t)
    for r in runs:
        p = table(f"{r['sessions']} sessions: cores and memory by part",
                  ("part", "cores", "busiest process", "RSS MB", "processes"), left={"part"})  # fmt: skip
        for k, v in r["parts"].items():
            p.add_row(k, f"{v['cores']:.3f}", f"{v['busiest_process_cores']:.3f}",
                      f"{v['rss_mb']:.0f}", str(v["processes"]))  # fmt: skip
        console().print(p)
    if all("memory" in r for r in runs):
        render_memory(results)


def parse_args(argv: list[str] | None) -> Bench:
    p = parser(__doc__, "scale")
    p.add_argument("--sessions", default="64,256,1024", help="comma-separated session counts")
    p.add_argument("--minutes", type=float, default=3.0, help="measured window of each")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the window")
    p.add_argument("--per-actor", type=int, default=64, help="env.sessions_per_actor")
    p.add_argument("--include", type=Path, action="append", default=[], metavar="JSON",
                   help="runs of an earlier scale.json to put before this run's (one table, "
                   "one marginal: a long sweep split into runs that fit)")  # fmt: skip
    p.add_argument("--screen", default=None, metavar="WxH",
                   help="env.screen_width x env.screen_height (default: the config's)")  # fmt: skip
    add_run_args(p, scale=1.0, port=8260)
    return Bench.start(p, argv, f"{psutil.virtual_memory().total / 2**30:.0f} GiB")


def main(argv: list[str] | None = None) -> int:
    bench = parse_args(argv)
    root = run_root(bench.args, "scale")
    counts = [int(x) for x in bench.args.sessions.split(",") if x.strip()]
    runs = [run_one(bench.args, n, root, i) for i, n in enumerate(counts)]
    earlier = [
        {**r, "from": r.get("from") or str(f)}
        for f in bench.args.include
        for r in json.loads(f.read_text())["runs"]
    ]
    runs = sorted(earlier + runs, key=lambda r: r["sessions"])
    marginal(runs)
    cfg = make_config(bench.args, counts[0], root, 0)
    w, h = cfg.env.screen_width, cfg.env.screen_height
    results: dict[str, Any] = {
        "simulated": True,
        **bench.meta,
        "screen": f"{w}x{h}",
        "history_images": cfg.policy.history_images,
        "screenshot_kb": screenshot_bytes(w, h) / 1e3,
        "runs": runs,
    }
    render(results)
    bench.write(results, note=f"runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
