"""`dart-ray status`: a run's health on one screen, or every task with `--tasks`.

The summary is a handful of lines: the run, the log's rows by state (and why rows were
dropped), success by task family, the worst and the best tasks, the newest checkpoint. The
default run alone has 1,000 tasks, so the per-task table is behind `--tasks`.

Output is plain text with columns as wide as their widest value: piped to a file or `less`
at 80 columns, a task id is never cut to `minidesk/c...` (a table that fits itself to the
terminal would), and every line can be grepped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dart_ray.store import Store
from dart_ray.store.db import RowState
from dart_ray.store.log_stats import TaskStats
from dart_ray.store.runs import RunRow

TOP = 5
"""Tasks listed at each end of the summary."""


def family_of(task_id: str) -> str:
    """A task's family: the first two parts of its id (`minidesk/click-target/t1/7` ->
    `minidesk/click-target`, `miniwob/click-test-2/17` -> `miniwob/click-test-2`)."""
    return "/".join(task_id.split("/")[:2])


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1) -> list[str]:
    """Lines of a table whose columns are as wide as their widest cell; the columns from
    `right` on are right-aligned (numbers)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        cells = [
            str(c).rjust(w) if i >= right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(r) for r in rows)]


@dataclass(frozen=True)
class FamilyStats:
    family: str
    tasks: int
    attempts: int
    successes: int

    @property
    def rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0


def by_family(stats: Sequence[TaskStats]) -> list[FamilyStats]:
    fams: dict[str, list[TaskStats]] = {}
    for s in stats:
        fams.setdefault(family_of(s.task_id), []).append(s)
    return [
        FamilyStats(f, len(ss), sum(s.attempts for s in ss), sum(s.successes for s in ss))
        for f, ss in sorted(fams.items())
    ]


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _task_rows(stats: Sequence[TaskStats]) -> list[list[str]]:
    return [
        [s.task_id, str(s.attempts), str(s.successes), _pct(s.success_rate), str(s.failures_env)]
        for s in stats
    ]


TASK_HEADER = ("task", "attempts", "successes", "success", "env failures")


def status_lines(store: Store, run: RunRow, *, tasks: bool = False) -> list[str]:
    """What `dart-ray status` prints for `run`."""
    out = [
        f"run {run.run_id} ({run.name}) {run.status}, started {run.started_at:%Y-%m-%d %H:%M:%S} UTC"
    ]
    buf = store.log.buffer(run.run_id)
    states = {
        name: sum(n for (_, st), n in buf.items() if st == s)
        for s, name in sorted(RowState.NAMES.items())
    }
    versions = sorted({v for v, _ in buf if v >= 0})  # -1: a trajectory without a step
    span = f", versions {versions[0]}-{versions[-1]}" if versions else ""
    out.append(
        f"log: {sum(states.values())} trajectories{span}: "
        + ", ".join(f"{k} {v}" for k, v in states.items())
    )
    drops = store.log.drops(run.run_id)
    out.append(
        "dropped by reason: " + (", ".join(f"{k} {v}" for k, v in sorted(drops.items())) or "none")
    )
    bad = store.log.drops(run.run_id, RowState.QUARANTINED)
    if bad:
        out.append(
            "quarantined (bad data, never trained): "
            + ", ".join(f"{k} ({v})" for k, v in sorted(bad.items()))
        )
    stats = store.log.task_stats(run.run_id)
    fams = by_family(stats)
    if fams:
        out.append("")
        out.append("success by task family (rollouts in the log, sampled):")
        rows = [[f.family, str(f.tasks), str(f.attempts), _pct(f.rate)] for f in fams]
        out += ["  " + s for s in text_table(("family", "tasks", "attempts", "success"), rows)]
    tried = [s for s in stats if s.attempts]
    if tasks:
        out.append("")
        out.append(f"every task ({len(stats)}):")
        out += ["  " + s for s in text_table(TASK_HEADER, _task_rows(stats))]
    elif len(tried) > 2 * TOP:
        ranked = sorted(tried, key=lambda s: (s.success_rate, s.attempts, s.task_id))
        out.append("")
        out.append(f"worst {TOP} and best {TOP} of {len(tried)} tasks tried:")
        rows = [*_task_rows(ranked[:TOP]), ["...", "", "", "", ""], *_task_rows(ranked[-TOP:])]
        out += ["  " + s for s in text_table(TASK_HEADER, rows)]
        out.append("  (every task: dart-ray status --tasks)")
    elif tried:
        out.append("")
        out += ["  " + s for s in text_table(TASK_HEADER, _task_rows(tried))]
    out.append("")
    cp = store.checkpoints.latest(run.run_id, status=None)
    done = store.checkpoints.latest(run.run_id)
    if cp is None:
        out.append("checkpoints: none yet")
    else:
        out.append(
            f"newest checkpoint: {cp.version} {cp.status}" + (f" ({cp.error})" if cp.error else "")
        )
        if done is not None and done.id != cp.id:
            out.append(f"newest completed: {done.version} at {done.path}")
    return out
