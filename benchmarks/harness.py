"""What every benchmark shares, so that each script holds only what it measures: its command
line, the run's metadata and JSON file, a local Ray, and the table it prints.

    p = parser(__doc__, "collate")      # --out: benchmarks/results/collate.json
    p.add_argument("--samples", ...)    # the script's own options
    bench = Bench.start(p, argv)        # parse, print the command, start the clock
    ...                                 # measure (`with local_ray(serve=True):` if it needs Ray)
    t = table("title", ("size", "s"), left={"size"})
    console().print(t)
    bench.write({"results": ...})       # + command, args, machine, date, git commit; -> --out

Every JSON file opens with the same metadata (`Bench.meta`): the command, the arguments, the
machine with its load average at the start and the end (other work on a shared machine shows),
the date and the git commit (`-dirty` with uncommitted changes), and ends with
`total_runtime_s`. A script's own keys come after it and win over it.

Importing this module puts the checkout first on `sys.path`, so that a benchmark measures the
code beside it rather than an installed copy. Only the standard library is imported here at
the top: `weight_load.py` runs on a bare GPU machine with torch alone, so rich and Ray are
imported by the functions that use them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
sys.path.insert(0, str(REPO_ROOT))


# --------------------------------------------------------------------------- the run


def parser(doc: str | None, name: str) -> argparse.ArgumentParser:
    """An argument parser described by the docstring's first line, with `--out` (default
    benchmarks/results/`name`.json): the options every benchmark takes."""
    p = argparse.ArgumentParser(description=(doc or name).strip().splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS / f"{name}.json",
                   help=f"where to write the JSON (default: benchmarks/results/{name}.json)")  # fmt: skip
    return p


def machine(*extra: str) -> str:
    """`x86_64, 2 cores, <extra, ...>, load (1.2, 0.9, 0.8)`: where a figure was measured."""
    return ", ".join([platform.machine(), f"{os.cpu_count()} cores", *extra,
                      f"load {os.getloadavg()}"])  # fmt: skip


def git_commit() -> str | None:
    """HEAD of the checkout, `-dirty` if tracked files differ from it; None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO_ROOT,
                               capture_output=True).returncode  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


@dataclass
class Bench:
    """One benchmark run: its parsed arguments, command line and clock, and the metadata its
    JSON opens with (read at the start, so that the load average is the start's)."""

    args: argparse.Namespace
    command: str = field(default_factory=lambda: shlex.join(sys.orig_argv))
    t0: float = field(default_factory=time.perf_counter)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(
        cls, p: argparse.ArgumentParser, argv: list[str] | None = None, *machine_extra: str
    ) -> Bench:
        """Parse `argv`, print the command line and start the clock. `machine_extra`: more
        about the machine for the metadata (memory, say)."""
        bench = cls(p.parse_args(argv))
        bench.meta = {
            "command": bench.command,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(bench.args).items()},
            "machine": machine(*machine_extra),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
        }
        print(f"command: {bench.command}", flush=True)
        return bench

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def write(self, results: dict[str, Any], note: str = "") -> Path:
        """Write `results` after the metadata to `--out`, with `total_runtime_s` and the load
        average at the end; print where it went (and `note`) and the command again."""
        doc = {**self.meta, **results}
        if isinstance(doc["machine"], str):  # a script may replace it with its own record
            doc["machine"] += f" -> {os.getloadavg()}"
        doc["total_runtime_s"] = self.elapsed_s
        out: Path = self.args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {out}; total {doc['total_runtime_s']:.0f} s" + (f"; {note}" if note else ""))
        print(f"command: {self.command}", flush=True)
        return out


def timed(
    fn: Callable[[], object], repeats: int, sync: Callable[[], object] | None = None
) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after one untimed warm-up call (first-call
    allocations, lazy initialisation). `sync` ends each call's timing: a device's queue, say."""
    fn()
    if sync:
        sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        out.append(time.perf_counter() - t0)
    return out


# --------------------------------------------------------------------------- Ray


@contextmanager
def local_ray(
    *,
    object_store_bytes: int | None = None,
    serve: bool = False,
    preallocate: bool = False,
    attempts: int = 3,
) -> Iterator[None]:
    """A new local Ray for the benchmark's measurements, never one already running here or at
    $RAY_ADDRESS (`address="local"`): 2 CPUs (the reference machine's), on 127.0.0.1, no
    dashboard, workers' logs kept out of the tables; with `serve`, Serve without an HTTP proxy
    (handles only). Serve and Ray are shut down on the way out.

    `preallocate` (the benchmarks' `--cold`) sets RAY_preallocate_plasma_memory: the store
    touches its pages once at start (measured: 2x faster puts than without), the path without
    `warm_object_store`. The start is tried `attempts` times: a raylet that preallocates a store
    of several GB just after another run released one can give up connecting to its own store
    (`buffer_pool_store_client_->Connect ... No such file or directory`) and the start times out
    after two minutes; a second start succeeds."""
    import ray
    from ray import serve as ray_serve

    if preallocate:
        os.environ.setdefault("RAY_preallocate_plasma_memory", "1")
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                     _node_ip_address="127.0.0.1", object_store_memory=object_store_bytes)  # fmt: skip
            break
        except Exception as e:  # ray.init raises a bare Exception when its node times out
            ray.shutdown()
            if attempt == attempts:
                raise
            print(f"ray did not start ({str(e)[:80]}); retrying in 10 s", file=sys.stderr)
            time.sleep(10)
    try:
        if serve:
            ray_serve.start(http_options={"location": "NoServer"})
        yield
    finally:
        stop_ray()


def stop_ray() -> None:
    """Shut Serve and Ray down, so that whatever runs next starts on a fresh local Ray."""
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


# --------------------------------------------------------------------------- output


@functools.cache
def console(width: int | None = None) -> Console:
    """The benchmarks' console: `width` columns, by default the terminal's or 160 into a file
    or pipe (so that a logged table is not wrapped at 80)."""
    from rich.console import Console

    return Console(width=width or (None if sys.stdout.isatty() else 160))


def table(
    title: str,
    columns: Iterable[str],
    justify: Literal["left", "right"] = "right",
    left: Collection[str] = (),
) -> Table:
    """A rich table titled `title` with `columns` aligned `justify`, those in `left` left."""
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="left" if c in left else justify)
    return t
