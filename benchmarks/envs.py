"""Environment benchmark: reset latency, steps/s, memory per session, sessions per 2 cores.

    .venv/bin/python benchmarks/envs.py [--kinds minidesk,miniwob,desktop] [--seconds 6]

For each kind: one session's reset latency (median of several) and steps/s; the memory of one
session (PSS of its processes for the browser and the desktop, the resident memory 50 more sessions
add, per session, for MiniDesk); then N sessions stepping at once for N = 1, 2, 4, ... (processes for MiniDesk, whose
work holds the GIL; threads for the others, whose work happens in Chromium or on the desktop)
and the aggregate steps/s. "Sessions 2 cores sustain" is the largest N whose aggregate is still
at least 10% above N/2's. Prints a table; writes benchmarks/results/envs.json.

Workloads: MiniDesk runs the oracle over the shipped tasks (a realistic mix of resets, clicks,
typing), with PNG encoding off (lazy) and on; MiniWoB++ clicks a blank part of click-test's page
(a full step: action, reward check, DOM and screenshot); the desktop clicks an empty spot of
the screen (pyautogui code through /execute, settle, screenshot and accessibility tree).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
from harness import Bench, console, parser, table

from dart_ray.config import EnvConfig, MiniDeskOptions
from dart_ray.envs.base import Env, make_env
from dart_ray.records import Action, ActionKind, Task


def minidesk_cfg(encode: bool) -> EnvConfig:
    return EnvConfig(kind="minidesk", minidesk=MiniDeskOptions(encode_png=encode))


def minidesk_work(cfg: EnvConfig, seconds: float, out: Any = None) -> int:
    """Oracle episodes over the shipped tasks for `seconds`; returns steps done."""
    from dart_ray.envs.minidesk.env import MiniDeskEnv
    from dart_ray.envs.minidesk.generate import load_tasks
    from dart_ray.envs.minidesk.oracle import oracle_action

    tasks = load_tasks(split="train")
    env = MiniDeskEnv(cfg)
    steps, i, end = 0, 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        env.reset(tasks[i % len(tasks)])
        i += 1
        while not env.done:
            env.step(oracle_action(env))
            steps += 1
    if out is not None:
        out.put(steps)
    return steps


MINIWOB_TASK = Task("bench", "", "miniwob", {"subdomain": "click-test", "seed": 0})
BLANK_MINIWOB = Action(ActionKind.CLICK, point=(80.0, 20.0))  # the instruction bar
DESKTOP_TASK = Task("bench", "", "desktop", {"config": [], "evaluator": {"func": "infeasible"}})
BLANK_DESKTOP = Action(ActionKind.CLICK, point=(700.0, 500.0))


def real_cfg(kind: str) -> EnvConfig:
    if kind == "desktop":
        return EnvConfig(kind="desktop", screen_width=800, screen_height=600)
    return EnvConfig(kind="miniwob")


def real_parts(kind: str) -> tuple[Task, Action]:
    return (DESKTOP_TASK, BLANK_DESKTOP) if kind == "desktop" else (MINIWOB_TASK, BLANK_MINIWOB)


def step_loop(env: Env, kind: str, seconds: float) -> int:
    task, action = real_parts(kind)
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        r = env.step(action)
        steps += 1
        if r.done:
            env.reset(task)
    return steps


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for q in procs:
            try:
                total += q.memory_full_info().pss
            except psutil.NoSuchProcess:
                continue
    return total / 2**20


def median_reset(env: Env, task_for: Callable[[int], Task], n: int) -> float:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        env.reset(task_for(i))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def scaling(run: Callable[[int], float], ns: list[int]) -> tuple[dict[int, float], int]:
    agg = {n: run(n) for n in ns}
    sustained = ns[0]
    for prev, n in itertools.pairwise(ns):
        if agg[n] >= 1.10 * agg[prev]:
            sustained = n
        else:
            break
    return agg, sustained


def bench_minidesk(seconds: float) -> dict[str, Any]:
    from dart_ray.envs.minidesk.env import MiniDeskEnv
    from dart_ray.envs.minidesk.generate import load_tasks

    tasks = load_tasks(split="train")
    out: dict[str, Any] = {"kind": "minidesk", "screen": "320x240"}
    env = MiniDeskEnv(minidesk_cfg(False))
    out["reset_ms"] = 1000 * median_reset(env, lambda i: tasks[i * 7 % len(tasks)], 200)
    for encode in (False, True):
        steps = minidesk_work(minidesk_cfg(encode), seconds)
        out["steps_per_s_png" if encode else "steps_per_s"] = steps / seconds
    # resident memory added by 50 more sessions, each mid-episode with its frames drawn
    me = psutil.Process()
    before = me.memory_info().rss
    keep = [MiniDeskEnv(minidesk_cfg(False)) for _ in range(50)]
    for i, e in enumerate(keep):
        e.reset(tasks[i * 13 % len(tasks)])
    out["memory_mib"] = (me.memory_info().rss - before) / 50 / 2**20
    del keep

    def run(n: int) -> float:
        q: Any = mp.get_context("fork").Queue()
        ps = [
            mp.get_context("fork").Process(
                target=minidesk_work, args=(minidesk_cfg(False), seconds, q)
            )
            for _ in range(n)
        ]
        for p in ps:
            p.start()
        total = sum(q.get() for _ in ps)
        for p in ps:
            p.join()
        return total / seconds

    out["aggregate_steps_per_s"], out["sessions_2_cores"] = scaling(run, [1, 2, 4])
    return out


def bench_real(kind: str, seconds: float, ns: list[int]) -> dict[str, Any]:
    task, _ = real_parts(kind)
    out: dict[str, Any] = {"kind": kind}
    t0 = time.perf_counter()
    env = make_env(real_cfg(kind))
    env.reset(task)
    out["start_s"] = time.perf_counter() - t0
    out["screen"] = "160x210" if kind == "miniwob" else "800x600"
    out["reset_ms"] = 1000 * median_reset(env, lambda i: task, 5)
    out["steps_per_s"] = step_loop(env, kind, seconds) / seconds
    out["memory_mib"] = pss_mib(env.processes())
    env.close()

    def run(n: int) -> float:
        envs = [make_env(real_cfg(kind)) for _ in range(n)]
        for e in envs:
            e.reset(task)
        counts = [0] * n

        def work(i: int) -> None:
            counts[i] = step_loop(envs[i], kind, seconds)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for e in envs:
            e.close()
        return sum(counts) / seconds

    out["aggregate_steps_per_s"], out["sessions_2_cores"] = scaling(run, ns)
    return out


def main() -> None:
    ap = parser(__doc__, "envs")
    ap.add_argument("--kinds", default="minidesk,miniwob,desktop")
    ap.add_argument("--seconds", type=float, default=6.0)
    bench = Bench.start(ap)
    a = bench.args
    results = []
    for kind in a.kinds.split(","):
        if kind == "minidesk":
            results.append(bench_minidesk(a.seconds))
        elif kind in ("miniwob", "desktop"):
            results.append(bench_real(kind, a.seconds, [1, 2, 4, 8]))
        else:
            raise SystemExit(f"unknown kind {kind!r}")
    t = table(f"environments on {os.cpu_count()} cores ({platform.processor() or platform.machine()})",
              ("kind", "screen", "reset ms", "steps/s (1 session)", "steps/s with PNG",
               "memory MiB/session", "aggregate steps/s by sessions", "sessions 2 cores sustain"))  # fmt: skip
    for r in results:
        agg = ", ".join(f"{n}: {v:.1f}" for n, v in r["aggregate_steps_per_s"].items())
        t.add_row(
            r["kind"],
            r["screen"],
            f"{r['reset_ms']:.1f}",
            f"{r['steps_per_s']:.1f}",
            f"{r['steps_per_s_png']:.1f}" if "steps_per_s_png" in r else "-",
            f"{r['memory_mib']:.2f}",
            agg,
            str(r["sessions_2_cores"]),
        )
    console(width=170).print(t)  # one row per kind, wide
    bench.write({"cores": os.cpu_count(), "time": time.time(), "results": results})


if __name__ == "__main__":
    main()
