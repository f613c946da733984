"""Memory that OSWorld's evaluator holds per environment session: a worker each against the
node's shared pool (issue 43 item 1).

    .venv/bin/python benchmarks/osworld_evaluator_memory.py              # 4 and 8 sessions
    .venv/bin/python benchmarks/osworld_evaluator_memory.py --sessions 4  # one size

For each pool size, in the same run: K sessions (Ray actors standing for EnvSessions, 0 CPU)
each score one task with OSWorld's real evaluator (`.venv-osworld`, `DesktopEnv.evaluate` of
an `infeasible` task, which loads OSWorld's getters and metrics as every task does; no
desktop answers, so OSWorld's evaluate first waits its 100 s for one: not a latency figure), then
the resident memory (RSS, unique set size where the kernel gives it) of what holds the
evaluator is summed:

- **per session** (`env.desktop.evaluator_workers = 0`): each session's own worker process;
- **per node** (`evaluator_workers = W`, default 2): the node's OSWorldEvaluatorHost actor
  and its W worker processes, shared by the K sessions.

Prints a table and the command, writes JSON to benchmarks/results/osworld-evaluator-memory.json.
Needs `.venv-osworld` (`make osworld-venv`); no desktop (the infeasible metric reads only the
last action).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import ray

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from actors.osworld_evaluator import NodeEvaluator  # noqa: E402
from dart_ray.config import DesktopOptions  # noqa: E402
from dart_ray.envs.osworld.official import OSWorldEvaluator  # noqa: E402
from dart_ray.records import Task  # noqa: E402

TASK = Task("memory-probe", "probe", "osworld", {"config": [], "evaluator": {"func": "infeasible"}})


def _mb(pids: list[int]) -> dict[str, float]:
    rss = uss = 0
    for pid in pids:
        p = psutil.Process(pid)
        rss += p.memory_info().rss
        uss += p.memory_full_info().uss
    return {"rss_mb": round(rss / 2**20, 1), "uss_mb": round(uss / 2**20, 1)}


@ray.remote(num_cpus=0)
class Session:
    def __init__(self, options: DesktopOptions, shared: bool) -> None:
        own = OSWorldEvaluator(options.osworld_venv, chromium_port=options.chromium_port)
        self.ev: Any = NodeEvaluator(options) if shared else own
        if shared:
            own.close()

    def evaluate(self) -> float:
        return float(self.ev.evaluate(TASK, "http://127.0.0.1:1", None, "FAIL"))

    def pids(self) -> list[int]:
        if isinstance(self.ev, NodeEvaluator):
            return self.ev.pids()
        return [self.ev.proc.pid] if self.ev.proc is not None else []

    def close(self) -> None:
        self.ev.close()


def measure(k: int, workers: int, venv: Path) -> dict[str, Any]:
    shared = workers > 0
    options = DesktopOptions(evaluator="osworld", osworld_venv=venv, evaluator_workers=workers)
    sessions = [Session.remote(options, shared) for _ in range(k)]
    scores = ray.get([s.evaluate.remote() for s in sessions])
    assert scores == [1.0] * k, scores  # FAIL on an infeasible task: OSWorld scores 1
    pids = sorted({p for s in sessions for p in ray.get(s.pids.remote())})
    held = _mb(pids)
    for s in sessions:
        ray.get(s.close.remote())
    for s in sessions:  # the first session owns the node's host: it goes with it
        ray.kill(s)
    return {
        "sessions": k,
        "mode": f"per node ({workers} workers)" if shared else "per session",
        "processes": len(pids),
        **held,
        "rss_mb_per_session": round(held["rss_mb"] / k, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", default="4,8", help="comma-separated session counts")
    p.add_argument("--workers", type=int, default=2, help="the node pool's workers")
    p.add_argument("--venv", type=Path, default=REPO / ".venv-osworld")
    p.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/osworld-evaluator-memory.json"
    )
    a = p.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    for k in (int(s) for s in a.sessions.split(",")):
        for workers in (0, a.workers):
            rows.append(measure(k, workers, a.venv))
            print(rows[-1], flush=True)
    ray.shutdown()
    cmd = "python benchmarks/osworld_evaluator_memory.py " + " ".join(sys.argv[1:])
    print(f"\n{cmd.strip()}\n")
    print("| sessions | evaluator | processes | RSS MB | USS MB | RSS MB per session |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['sessions']} | {r['mode']} | {r['processes']} | {r['rss_mb']} | "
            f"{r['uss_mb']} | {r['rss_mb_per_session']} |"
        )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    a.out.write_text(
        json.dumps(
            {
                "command": cmd.strip(),
                "commit": commit,
                "machine": f"{psutil.cpu_count()} CPUs, {platform.machine()}",
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
