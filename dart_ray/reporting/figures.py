"""The run report's figures: `curve.png` (held-out success per evaluated version, sampled
success per band of versions, mean reward per step) and `system.png` (utilisation over time,
staleness, weight-sync latency), drawn from a `RunReport` by `dart_ray.reporting.plots`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dart_ray.reporting.plots import Point, bands, draw_learning_curve, draw_system, utilisation
from dart_ray.reporting.summary import RunReport


def eval_point(summary: dict[str, Any]) -> Point:
    """A `dart-ray eval --json` summary as a held-out point: the version is read from the
    checkpoint folder's name (`v<N>`; a warm start outside a run counts as version 0)."""
    import re

    m = re.search(r"(?:^|/)v(\d+)/?$", str(summary.get("checkpoint", "")))
    n = int(summary["tasks"])
    return Point(int(m.group(1)) if m else 0, round(float(summary["success"]) * n), n)


def eval_refusal(summary: dict[str, Any], run_id: str, own: set[Path]) -> str | None:
    """Why a `dart-ray eval --json` summary cannot be a held-out point of run `run_id`
    (None if it can): its checkpoint must be one of the run's (`own`: its checkpoint folders
    and the weights it started from), and it must be greedy (the curve's held-out points are)."""
    ckpt = Path(str(summary.get("checkpoint", ""))).resolve()
    if ckpt not in own:
        return f"it evaluates {ckpt}, which is not a checkpoint of run {run_id}"
    sampling = summary.get("sampling", "greedy")
    if sampling != "greedy":
        return f"it is a {sampling} evaluation; the curve's held-out points are greedy"
    return None


def heldout_points(report: RunReport, extra: Sequence[Point] = ()) -> list[Point]:
    """Held-out success at the start version and at the final one, plus `extra` points
    (evaluations of intermediate checkpoints), in version order."""
    n = report.heldout_tasks
    out = list(extra)
    for version, rate in (
        (report.start_version, report.heldout_before),
        (max(report.versions, report.policy_version), report.heldout_after),
    ):
        if rate is not None and n:
            out.append(Point(version, round(rate * n), n))
    return sorted(out, key=lambda p: p.version)


def band_width(report: RunReport) -> int:
    """Versions per band of the sampled-success curve: about 12 bands over the run."""
    return max(1, (max((v for v, _, _ in report.sampled), default=0) + 1) // 12)


def sampled_points(report: RunReport) -> list[Point]:
    """Sampled success per band of `band_width` versions."""
    return bands({v: (k, n) for v, k, n in report.sampled}, band_width(report))


def draw_curve(
    report: RunReport,
    out: Path,
    step_versions: list[float] | None = None,
    evals: Sequence[Point] = (),
) -> Path:
    """The two-panel learning figure (`dart_ray.reporting.plots`); `step_versions` place the per-step
    mean rewards (their versions; default: spread over the run's versions); `evals` are
    more held-out points."""
    rewards = report.rewards
    xs = step_versions or [
        report.versions * (i + 1) / max(len(rewards), 1) for i in range(len(rewards))
    ]
    return draw_learning_curve(
        out,
        f"run {report.run_id} ({report.mode})",
        heldout_points(report, evals),
        sampled_points(report),
        list(zip(xs, rewards, strict=False)),
    )


def draw_system_figure(
    report: RunReport, episodes: Sequence[tuple[datetime, datetime]], out: Path, bins: int = 30
) -> Path:
    """`system.png` (`dart_ray.reporting.plots.draw_system`): utilisation over time from the log's
    episode times (the database's clock, taken as UTC) and the trainer's step times, the
    staleness histogram and the weight-sync latencies of the report."""
    env = [(_unix(a), _unix(b)) for a, b in episodes]
    spans = env + [(a, b) for a, b in report.trainer_busy]
    t0 = min((a for a, _ in spans), default=0.0)
    t1 = max((b for _, b in spans), default=0.0)

    def minutes(series: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [((t - t0) / 60, u) for t, u in series]

    trainer = [(a, b) for a, b in report.trainer_busy]
    return draw_system(
        out,
        f"run {report.run_id} ({report.mode})",
        minutes(utilisation(env, max(report.sessions, _peak(env)), t0, t1, bins)) if env else [],
        minutes(utilisation(trainer, 1, t0, t1, bins)) if trainer else [],
        {int(k): n for k, n in report.staleness.items()},
        [(v, sec) for v, sec in report.sync_latency],
    )


def _peak(intervals: Sequence[tuple[float, float]]) -> int:
    """Most intervals open at once (a report without its session count: an older run's)."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    peak = open_ = 0
    for _, d in edges:
        open_ += d
        peak = max(peak, open_)
    return max(peak, 1)


def _unix(t: datetime) -> float:
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
